// RapidJSON as the HTTP front end includes it: every header it uses, in one
// place. RapidJSON 1.1.0 (Debian 13's rapidjson-dev) grows its internal
// stacks from a null pointer (internal/stack.h computes `stackTop_ + n`
// before the first allocation, and compares it, never dereferencing it);
// clang's -fsanitize=pointer-overflow reports that as undefined behaviour on
// every parse and every write (found by the infer_json fuzz target). Later
// RapidJSON sources no longer do it. RapidJSON's own functions are compiled
// here without that one check, so the sanitizer and fuzz builds keep it for
// the project's code.
#pragma once

#if defined(__clang__)
#pragma clang attribute push(__attribute__((no_sanitize("pointer-overflow"))), apply_to = function)
#endif
#include <rapidjson/document.h>
#include <rapidjson/error/en.h>
#include <rapidjson/memorystream.h>
#include <rapidjson/reader.h>
#include <rapidjson/stringbuffer.h>
#include <rapidjson/writer.h>
#if defined(__clang__)
#pragma clang attribute pop
#endif

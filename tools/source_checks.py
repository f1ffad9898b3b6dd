#!/usr/bin/env python3
"""Checks of the tracked source files that clang-format cannot make.

Run by `make format-check` (and so by CI, .ci/run), on Debian's python3
with python3-yaml:

    tools/source_checks.py [SOURCE_DIR]

Fails, naming each file, where
  * a tracked source file (C++ .cc/.h/.inc, Python, shell, .proto, CMake,
    JavaScript) has more than MAX_LINES lines: CONTRIBUTING.md, "Sizes".
    Split it along a seam rather than raising the limit;
  * a tracked header (.h, .inc) of a folder that `make tidy` analyses
    (everything outside tests/ and benchmarks/) is not selected by
    .clang-tidy's HeaderFilterRegex, or is excluded by its
    ExcludeHeaderFilterRegex: clang-tidy would report nothing found in it.
    The generated protobuf headers (<build>/proto/*.pb.h) must stay out.
"""

import os
import re
import subprocess
import sys

import yaml

MAX_LINES = 800

HEADER_SUFFIXES = (".h", ".inc")
CPP_SUFFIXES = (".cc",) + HEADER_SUFFIXES
SOURCE_SUFFIXES = CPP_SUFFIXES + (".py", ".sh", ".proto", ".cmake", ".js")
# Folders `make tidy` leaves out (the Makefile's TIDY_FILES).
UNTIDIED = ("tests/", "benchmarks/")
# What the protobuf build writes (proto/CMakeLists.txt): tidy must not
# report on it, wherever the build tree is.
GENERATED_HEADERS = ("build/release/proto/grpc_service.pb.h",
                     "build/proto/grpc_service.grpc.pb.h")
SCRIPT = re.compile(rb"^#!.*\b(ba|da|z)?sh\b|^#!.*\bpython")


def tracked_files(root):
    out = subprocess.run(["git", "-C", root, "ls-files", "-z"], stdout=subprocess.PIPE,
                         check=True).stdout
    return [p for p in out.decode("utf-8", "surrogateescape").split("\0") if p]


def is_source(root, path):
    name = os.path.basename(path)
    if path.endswith(SOURCE_SUFFIXES) or name == "CMakeLists.txt":
        return True
    if "." in name:
        return False
    # A script without a suffix (.ci/run): by its #! line.
    try:
        with open(os.path.join(root, path), "rb") as f:
            return bool(SCRIPT.match(f.readline(200)))
    except OSError:
        return False


def line_count(full_path):
    with open(full_path, "rb") as f:
        data = f.read()
    return data.count(b"\n") + (1 if data and not data.endswith(b"\n") else 0)


def long_files(root, files):
    problems = []
    for path in files:
        full = os.path.join(root, path)
        if os.path.islink(full) or not os.path.isfile(full) or not is_source(root, path):
            continue
        lines = line_count(full)
        if lines > MAX_LINES:
            problems.append("%s: %d lines, over the limit of %d (CONTRIBUTING.md, \"Sizes\"): "
                            "split it" % (path, lines, MAX_LINES))
    return problems


def tidy_filters(root):
    """(HeaderFilterRegex, ExcludeHeaderFilterRegex or None) of ROOT/.clang-tidy."""
    with open(os.path.join(root, ".clang-tidy")) as f:
        config = yaml.safe_load(f) or {}
    header = config.get("HeaderFilterRegex")
    exclude = config.get("ExcludeHeaderFilterRegex")
    return (re.compile(header) if header else None,
            re.compile(exclude) if exclude else None)


def tidy_reports_on(filters, full_path):
    """Whether clang-tidy shows a finding in the header FULL_PATH: it
    searches the path (not a full match) with each regex."""
    header, exclude = filters
    if header is None or not header.search(full_path):
        return False
    return not (exclude and exclude.search(full_path))


def uncovered_headers(root, files):
    try:
        filters = tidy_filters(root)
    except (OSError, yaml.YAMLError, re.error) as e:
        return [".clang-tidy: cannot read its header filters: %s" % e]
    problems = []
    for path in files:
        if not path.endswith(HEADER_SUFFIXES) or path.startswith(UNTIDIED):
            continue
        if not tidy_reports_on(filters, os.path.join(root, path)):
            problems.append("%s: .clang-tidy's HeaderFilterRegex does not select it (or "
                            "ExcludeHeaderFilterRegex drops it): make tidy would report "
                            "nothing found there" % path)
    for path in GENERATED_HEADERS:
        if tidy_reports_on(filters, os.path.join(root, path)):
            problems.append("%s (generated): .clang-tidy's header filters select it; "
                            "ExcludeHeaderFilterRegex should drop it" % path)
    return problems


def main(argv):
    if len(argv) > 2:
        print("usage: tools/source_checks.py [SOURCE_DIR]", file=sys.stderr)
        return 2
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.abspath(argv[1] if len(argv) > 1 else os.path.join(here, ".."))
    files = tracked_files(root)
    problems = long_files(root, files) + uncovered_headers(root, files)
    for p in problems:
        print("source-checks: " + p)
    if problems:
        print("source-checks: %d problem(s)" % len(problems))
        return 1
    print("source-checks: clean (%d tracked files; sizes, tidy's header filter)" % len(files))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

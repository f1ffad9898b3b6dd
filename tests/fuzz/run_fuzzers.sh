#!/usr/bin/env bash
# Runs the libFuzzer targets of the fuzz build (`make fuzz` builds them
# first):
#
#   tests/fuzz/run_fuzzers.sh BUILD_DIR SECONDS [TARGET...]
#
# Each target runs SECONDS from its checked-in seeds (corpus/<target>/) plus
# what earlier runs found (BUILD_DIR/fuzz-corpus/<target>/, kept between
# runs, never checked in). It runs in libFuzzer's fork mode, so one crash
# does not end the run: every input that crashes, trips a sanitizer or a
# FUZZ_CHECK, times out or runs out of memory is collected. Each is replayed
# once to read its report; one input per distinct report that no file in
# regressions/<target>/ already reproduces is copied there, where the replay
# tests of `make test` feed it to the target from then on. Exit status 0
# only when no target found anything.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
usage="usage: run_fuzzers.sh BUILD_DIR SECONDS [TARGET...]"
build="$(cd "${1:?$usage}" && pwd)"
seconds="${2:?$usage}"
shift 2
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  targets=(onnx_import infer_request model_config npy checkpoint record_file idx_file
    training_config worker_framing infer_json)
fi

# Longest input per target: a few times the largest seed, so mutations can
# grow a message or a model without the fuzzer spending its time on size.
max_len() {
  case "$1" in
    onnx_import) echo 4096 ;;
    model_config | training_config | infer_json) echo 2048 ;;
    *) echo 1024 ;;
  esac
}

# Largest single allocation per target, MiB (libFuzzer reports a larger one
# as out of memory): a worker_framing input is at most max_len bytes, so
# nothing it makes ReadFramed allocate may exceed the 64 MiB a frame may
# claim. (Protobuf's parser reserves up to 50,000,000 bytes, untouched, for
# a string whose length, inside a nested message whose own length lies,
# claims more than the input holds.)
malloc_limit() {
  case "$1" in
    worker_framing) echo 64 ;;
    *) echo 2048 ;;
  esac
}

# One thread: findings reproduce, and the kernels' OpenMP teams stay small.
export OMP_NUM_THREADS=1
# allow_user_poisoning=0: see ASAN_ENV in the Makefile (absl's hash tables
# poisoned by its headers, not unpoisoned by Debian's uninstrumented library).
export ASAN_OPTIONS="${ASAN_OPTIONS:-halt_on_error=1:detect_leaks=1:allow_user_poisoning=0}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}"
# The targets' scratch files (fuzz_util.cc) under the build tree, where an
# input that crashes leaves them; emptied at every run.
export TMPDIR="$build/fuzz-tmp"
rm -rf "$TMPDIR"
mkdir -p "$TMPDIR"

# The report an input gives: the sanitizer's SUMMARY line, a failed
# FUZZ_CHECK, or libFuzzer's own verdict (timeout, out of memory, leak).
signature() {
  local binary="$1" input="$2"
  { "$binary" -timeout=20 -rss_limit_mb=2048 -malloc_limit_mb="$(malloc_limit "$target")" \
      "$input" 2>&1 || true; } |
    grep -m1 -oE 'SUMMARY: .*|FUZZ_CHECK failed: .*|ERROR: libFuzzer: [a-z-]+' |
    sed -E 's/ in [^ ]*$//; s/0x[0-9a-f]+//g' || true
}

failed=()
for target in "${targets[@]}"; do
  binary="$build/bin/fuzz_$target"
  [ -x "$binary" ] || { echo "fuzz: $binary is not built" >&2; exit 2; }
  work="$build/fuzz-corpus/$target"
  artifacts="$build/fuzz-artifacts/$target"
  regressions="$here/regressions/$target"
  mkdir -p "$work" "$artifacts"
  find "$artifacts" -type f -delete
  dict=()
  [ -f "$here/$target.dict" ] && dict=(-dict="$here/$target.dict")
  log="$build/fuzz-$target.log"
  echo "fuzz: $target for ${seconds}s (log: $log)"
  status=0
  (cd "$build" && "$binary" "$work" "$here/corpus/$target" "${dict[@]}" \
    -fork=1 -ignore_crashes=1 -ignore_timeouts=1 -ignore_ooms=1 \
    -max_total_time="$seconds" -max_len="$(max_len "$target")" -timeout=20 \
    -rss_limit_mb=2048 -malloc_limit_mb="$(malloc_limit "$target")" \
    -artifact_prefix="$artifacts/" >"$log" 2>&1) || status=$?
  grep -E '^#[0-9]+: cov:' "$log" | tail -n1 | sed "s/^/fuzz: $target: /" || true

  found=()
  while IFS= read -r -d '' f; do found+=("$f"); done \
    < <(find "$artifacts" -type f -print0 | sort -z)
  if [ ${#found[@]} -eq 0 ]; then
    if [ $status -ne 0 ]; then
      echo "fuzz: $target: libFuzzer exited with $status without an input; see $log" >&2
      failed+=("$target")
    fi
    continue
  fi
  failed+=("$target")
  # What the kept regression inputs already reproduce.
  declare -A known=()
  if [ -d "$regressions" ]; then
    for f in "$regressions"/*; do
      [ -f "$f" ] || continue
      s="$(signature "$binary" "$f")"
      [ -n "$s" ] && known["$s"]="$(basename "$f")"
    done
  fi
  declare -A hit=()
  for f in "${found[@]}"; do
    s="$(signature "$binary" "$f")"
    [ -n "$s" ] || s="(does not reproduce alone) $(basename "$f")"
    if [ -n "${known[$s]:-}" ]; then
      hit["$s"]="${known[$s]}"
      continue
    fi
    mkdir -p "$regressions"
    cp "$f" "$regressions/"
    known["$s"]="$(basename "$f")"
    hit["$s"]="$(basename "$f")"
    echo "fuzz: $target: NEW $s" >&2
    echo "fuzz: $target:   kept as tests/fuzz/regressions/$target/$(basename "$f"); base64:" >&2
    base64 -w 100 "$f" | sed "s/^/fuzz: $target:     /" >&2
  done
  echo "fuzz: $target: ${#found[@]} failing inputs, ${#hit[@]} distinct reports:" >&2
  for s in "${!hit[@]}"; do echo "fuzz: $target:   $s (regressions/$target/${hit[$s]})" >&2; done
  unset known hit
done

if [ ${#failed[@]} -gt 0 ]; then
  echo "fuzz: findings in: ${failed[*]} (logs: $build/fuzz-<target>.log)" >&2
  exit 1
fi
echo "fuzz: no findings in ${targets[*]}"

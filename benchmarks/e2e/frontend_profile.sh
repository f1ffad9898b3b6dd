#!/usr/bin/env bash
# Where the front end's cpu goes at saturation: the server process (gRPC,
# batcher, router; not the worker, a process of its own) sampled with
# `perf record` while grpc_loadgen saturates it, then the share of its
# samples by symbol and the share spent copying (memcpy/memmove, whoever
# calls them).
#   benchmarks/e2e/frontend_profile.sh [build dir]
#
# One worker on the last cpu, the server and the load generator on the
# others (as serving_bench.sh). Needs `perf` unless PROFILER=schedstat
# (Debian's linux-perf; not installed by deploy/install-deps.sh: profiling
# is not part of the build).
#
# Environment: MODEL (default: a model written to the temporary repository
# by IO: `identity`, 588 KiB in and out per request, or `classifier`,
# ResNet-50's 588 KiB in and 4 KiB out; next to no compute either way),
# KEEP (a file to keep the perf data in), CALLERS (default 16), SECONDS_PER_RUN (default 8), MODE
# (grpc_loadgen --mode: closed or stream; default closed), TOP (default 25),
# WARMUP_SECONDS (default 1), PROFILER (perf, the default, or schedstat: no
# profiler, each of the server's threads' cpu time and wake-ups per request
# from /proc/PID/task/*/schedstat instead).
set -euo pipefail
build=${1:-build/release}
bin=$build/bin
secs=${SECONDS_PER_RUN:-8}
callers=${CALLERS:-16}
mode=${MODE:-closed}
top=${TOP:-25}
[ "${PROFILER:-perf}" = schedstat ] || command -v perf >/dev/null ||
  { echo "perf is not installed (Debian: linux-perf)"; exit 1; }
ncpu=$(nproc)
[ "$ncpu" -ge 2 ] || { echo "needs 2 cpus, has $ncpu"; exit 1; }
compute=$((ncpu - 1))
front=0-$((ncpu - 2))

work=$(mktemp -d)
# KEEP=FILE keeps the perf data there.
pid=""
trap '[ -n "$pid" ] && kill "$pid" 2>/dev/null; wait 2>/dev/null || true
  if [ -n "${KEEP:-}" ] && [ -f "$work/perf.data" ]; then cp "$work/perf.data" "$KEEP"; fi
  rm -rf "$work"' EXIT
mkdir -p "$work/repo/m/1"
if [ -n "${MODEL:-}" ]; then
  ln -s "$(realpath "$MODEL")" "$work/repo/m/1/model.onnx"
else
  python3 - "$work/repo/m/1/model.onnx" "${IO:-identity}" <<'PY'
import sys
import numpy as np
from onnx import TensorProto, helper, numpy_helper, save
# identity: [batch,3,224,224] FP32 in and out; classifier: ResNet-50's
# inputs and outputs ([batch,3,224,224] in, [batch,1000] out) through a
# global average pool and a [3,1000] MatMul, next to no compute.
x = helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", 3, 224, 224])
if sys.argv[2] == "classifier":
    y = helper.make_tensor_value_info("output", TensorProto.FLOAT, ["batch", 1000])
    w = numpy_helper.from_array(np.full((3, 1000), 0.5, np.float32), "w")
    nodes = [helper.make_node("GlobalAveragePool", ["input"], ["pooled"]),
             helper.make_node("Flatten", ["pooled"], ["flat"]),
             helper.make_node("MatMul", ["flat", "w"], ["output"])]
    inits = [w]
else:
    y = helper.make_tensor_value_info("output", TensorProto.FLOAT, ["batch", 3, 224, 224])
    nodes = [helper.make_node("Identity", ["input"], ["output"])]
    inits = []
graph = helper.make_graph(nodes, "io", [x], [y], inits)
model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
model.ir_version = 8
save(model, sys.argv[1])
PY
fi
printf 'max_batch_size: 16\ndynamic_batching { max_queue_delay_microseconds: 0 }\n' \
  >"$work/repo/m/config.pbtxt"

"$bin/numaserve" serve --model-repository "$work/repo" --grpc-port 0 --metrics-port 0 \
  --http-port -1 --cpuset "$compute" >"$work/out" 2>"$work/log" &
pid=$!
for _ in $(seq 1 600); do
  grep -qs grpc= "$work/out" && break
  kill -0 "$pid" 2>/dev/null || { cat "$work/log"; exit 1; }
  sleep 0.1
done
taskset -a -p -c "$front" "$pid" >/dev/null
url=$(sed -E 's/grpc=([^ ]+).*/\1/' "$work/out")
lg=("$bin/grpc_loadgen" --url "$url" --model m --rows 1 --cpus "$front" --channels 4
  --concurrency "$callers" --mode "$mode")
"${lg[@]}" --seconds "${WARMUP_SECONDS:-1}" >/dev/null  # warm-up
if [ "${PROFILER:-perf}" = schedstat ]; then
  # Each thread's time on a cpu and wake-ups (/proc/PID/task/*/schedstat)
  # before and after the run, per request answered: tid, name, ns, slices.
  snap() {
    for t in /proc/"$pid"/task/*; do
      echo "$(basename "$t") $(tr ' ' _ <"$t/comm") $(awk '{ print $1, $3 }' "$t/schedstat")"
    done | sort
  }
  snap >"$work/a"
  result=$("${lg[@]}" --seconds "$secs" | head -1)
  snap >"$work/b"
  echo "$result"
  requests=$(sed -E 's/.*: ([0-9]+) req\/s.*/\1/' <<<"$result")
  join "$work/a" "$work/b" | awk -v s="$secs" -v r="$requests" '
    { ns = $6 - $3; n = $7 - $4; total += ns
      if (ns > 0) printf "%-8s %-16s %8.1f us/request %5.1f wake-ups/request\n", $1, $2, ns / 1e3 / s / r, n / s / r }
    END { printf "front end: %.1f us of cpu per request\n", total / 1e3 / s / r }'
  exit 0
fi
tick=$(getconf CLK_TCK)
cpu0=$(awk '{ sub(/^.*\) /, ""); print $12 + $13 }' "/proc/$pid/stat")
perf record -q -F 1000 --call-graph dwarf,16384 -p "$pid" -o "$work/perf.data" -- sleep "$secs" >/dev/null 2>&1 &
perf_pid=$!
result=$("${lg[@]}" --seconds "$secs" | head -1)
wait "$perf_pid" || true
cpu1=$(awk '{ sub(/^.*\) /, ""); print $12 + $13 }' "/proc/$pid/stat")
echo "$result"
requests=$(sed -E 's/.*: ([0-9]+) req\/s.*/\1/' <<<"$result")
awk -v a="$cpu0" -v b="$cpu1" -v t="$tick" -v r="$requests" -v s="$secs" \
  'BEGIN { if (r > 0) printf "front end: %.1f us of cpu per request\n", (b - a) / t / (r * s) * 1e6 }'
# perf pads its columns: trailing blanks cut, lines at most 160 characters.
report() { perf report -i "$work/perf.data" --no-children --stdio "$@" 2>/dev/null |
  sed -E 's/ +$//' | cut -c1-160; }
echo "== the server process's samples by symbol (self), top $top"
report --sort dso,sym -g none | grep -E '^ +[0-9.]+%' | head -"$top"
# glibc's memcpy/memmove (its AVX-512/AVX2 `rep movsb` variants) has no
# symbol in Debian's stripped libc: its samples are libc's at an address.
echo "== user-space copies (libc's samples) by caller"
report --dsos libc.so.6 --sort dso -g caller,2,callee,function,percent --percent-limit 2 |
  grep -vE '^$|^#' | head -60

#!/usr/bin/env bash
# serve --input-copy caller against node, alternated in rounds: what the
# hand-off of each batch to its worker's copier thread costs in latency.
#   benchmarks/e2e/input_copy_bench.sh [build dir]
# One worker on the last cpu; the server's threads (the copier too) and
# grpc_loadgen on the others. Environment: MODEL (default: the MLP benchmark
# model), ROWS (1), CALLERS (1), ROUNDS (3), SECONDS_PER_RUN (5).
set -euo pipefail
build=${1:-build/release}
bin=$build/bin
model=${MODEL:-benchmarks/models/out/mlp.onnx}
[ -f "$model" ] || { echo "no model $model (make bench-models)"; exit 1; }
ncpu=$(nproc)
[ "$ncpu" -ge 2 ] || { echo "needs 2 cpus, has $ncpu"; exit 1; }
compute=$((ncpu - 1))
front=0-$((ncpu - 2))
work=$(mktemp -d)
pid=""
trap '[ -n "$pid" ] && kill "$pid" 2>/dev/null; wait 2>/dev/null || true; rm -rf "$work"' EXIT
mkdir -p "$work/repo/m/1"
ln -s "$(realpath "$model")" "$work/repo/m/1/model.onnx"
printf 'max_batch_size: 16\ndynamic_batching { max_queue_delay_microseconds: 0 }\n' \
  >"$work/repo/m/config.pbtxt"
for round in $(seq 1 "${ROUNDS:-3}"); do
  for mode in caller node; do
    "$bin/numaserve" serve --model-repository "$work/repo" --grpc-port 0 --metrics-port 0 \
      --http-port -1 --cpuset "$compute" --input-copy "$mode" >"$work/out" 2>"$work/log" &
    pid=$!
    for _ in $(seq 1 600); do
      grep -qs grpc= "$work/out" && break
      kill -0 "$pid" 2>/dev/null || { cat "$work/log"; exit 1; }
      sleep 0.1
    done
    taskset -a -p -c "$front" "$pid" >/dev/null
    url=$(sed -E 's/grpc=([^ ]+).*/\1/' "$work/out")
    lg=("$bin/grpc_loadgen" --url "$url" --model m --rows "${ROWS:-1}" --cpus "$front"
      --concurrency "${CALLERS:-1}" --mode closed)
    "${lg[@]}" --seconds 1 >/dev/null  # warm-up
    echo "round $round --input-copy $mode: $("${lg[@]}" --seconds "${SECONDS_PER_RUN:-5}" | head -1)"
    kill "$pid"
    wait "$pid" || true
    pid=""
  done
done

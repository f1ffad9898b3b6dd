#!/usr/bin/env bash
# `make bench`: the engine in process, then the same model through the real
# server over gRPC on loopback, so the serving overhead is visible in one run.
set -euo pipefail
build=${1:-build/release}
bin=$build/bin
model=$build/models/fashion_classifier/1/model.onnx
seconds=${BENCH_SECONDS:-5}
[ -f "$model" ] || { echo "bench: $model missing (build first)"; exit 1; }

echo "== machine"
"$bin/numaserve" topology | sed -n '1,3p;/^cpu:/,$p'

echo "== engine in process ($model)"
"$bin/engine_bench" --benchmark_counters_tabular=true

echo "== through the server (gRPC, loopback)"
out=$(mktemp)
"$bin/numaserve" serve --model-repository "$build/models" --grpc-port 0 --metrics-port 0 --http-port -1 >"$out" 2>/dev/null &
pid=$!
trap 'kill $pid 2>/dev/null; wait $pid 2>/dev/null; rm -f $out' EXIT
for _ in $(seq 1 600); do grep -q grpc= "$out" && break; sleep 0.1; done
url=$(sed -E 's/grpc=([^ ]+).*/\1/' "$out")
for batch in 1 32 256; do
  for conc in 1 4; do
    "$bin/grpc_loadgen" --url "$url" --model fashion_classifier --batch $batch \
      --concurrency $conc --seconds "$seconds" | head -1
  done
done

echo "== own kernels per ISA tier and oneDNN SGEMM"
"$bin/kernels_bench" --benchmark_counters_tabular=true --benchmark_min_time=0.2

echo "== benchmark models: numaserve vs ONNX Runtime (same outputs, then same threads and batches)"
# compare.py first checks that numaserve's outputs match ONNX Runtime's on
# one seeded input per model at batch 2 (max abs error and normalized error
# per model, bounds in benchmarks/models/output_check.py) and exits 1 after
# its table, which stops `make bench` here, when any model is beyond them.
# The peer: PyPI's onnxruntime, pinned with hashes (requirements/peers.txt),
# in $build/venv/peers, made here once (network needed the first time).
bash tools/python/venv.sh "$build" peers >/dev/null ||
  echo "bench: ONNX Runtime's environment could not be made; its columns will be n/a"
/usr/bin/python3 benchmarks/models/compare.py --numaserve "$bin/numaserve" \
  --threads "${BENCH_THREADS:-2}" --seconds "$seconds"

echo "== serving: dynamic batching delays, closed and open loop, overhead vs in process"
benchmarks/e2e/serving_bench.sh "$build"

echo "== scale-out: layouts at saturation (workers per core, instances, auto) vs in process"
benchmarks/e2e/scaleout_bench.sh "$build"

echo "== precisions: FP32, BF16 and INT8 (numaserve quantize) vs ONNX Runtime on the same QDQ file"
/usr/bin/python3 benchmarks/models/precision.py --numaserve "$bin/numaserve" \
  --threads "${BENCH_THREADS:-2}" --seconds "$seconds"

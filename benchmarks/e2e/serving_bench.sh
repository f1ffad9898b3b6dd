#!/usr/bin/env bash
# Serving benchmark: for each model and max_queue_delay setting, start the
# real server on a temporary repository (config.pbtxt with dynamic
# batching), then drive it with grpc_loadgen in closed loop (saturation) and
# open loop (fixed rate); finally `numaserve bench` runs the same model in
# process at the largest batch, so serving overhead = server rows/s at
# saturation / in-process rows/s.
#   benchmarks/e2e/serving_bench.sh [build dir]
# Environment: SECONDS_PER_RUN (default 5), DELAYS_US (default "0 1000 5000"),
#   MODELS ("name=path:max_batch:concurrency:open_rate ...").
set -euo pipefail
build=${1:-build/release}
bin=$build/bin
secs=${SECONDS_PER_RUN:-5}
delays=${DELAYS_US:-"0 1000 5000"}
models=${MODELS:-"mlp=models/fashion_classifier/1/model.onnx:64:64:2000 cnn=benchmarks/models/out/mobilenetv2.onnx:16:16:40"}

echo "== load: $(uptime)"
for spec in $models; do
  name=${spec%%=*}
  rest=${spec#*=}
  IFS=: read -r path max_batch conc rate <<<"$rest"
  [ -f "$path" ] || { echo "skip $name: $path missing"; continue; }
  for delay in $delays; do
    repo=$(mktemp -d)
    mkdir -p "$repo/$name/1"
    ln -s "$(realpath "$path")" "$repo/$name/1/model.onnx"
    cat >"$repo/$name/config.pbtxt" <<CONFIG
max_batch_size: $max_batch
dynamic_batching { max_queue_delay_microseconds: $delay }
CONFIG
    out=$(mktemp)
    "$bin/numaserve" serve --model-repository "$repo" --grpc-port 0 --metrics-port 0 \
      >"$out" 2>/dev/null &
    pid=$!
    for _ in $(seq 1 1200); do grep -q grpc= "$out" && break; sleep 0.1; done
    url=$(sed -E 's/grpc=([^ ]+).*/\1/' "$out")
    metrics=$(sed -E 's/.*metrics=([^ ]+).*/\1/' "$out")
    echo "== $name max_queue_delay_us=$delay"
    "$bin/grpc_loadgen" --url "$url" --model "$name" --mode closed --concurrency 1 \
      --seconds "$secs" | head -1 || true
    "$bin/grpc_loadgen" --url "$url" --model "$name" --mode closed --concurrency "$conc" \
      --seconds "$secs" | head -1 || true
    "$bin/grpc_loadgen" --url "$url" --model "$name" --mode open --rate "$rate" \
      --seconds "$secs" | head -1 || true
    page=$(curl -s "http://$metrics/metrics" || true)
    inf=$(awk -v m="$name" '$1 ~ "^numaserve_inferences_total\\{model=\""m"\"" {print $2}' <<<"$page")
    exe=$(awk -v m="$name" '$1 ~ "^numaserve_executions_total\\{model=\""m"\"" {print $2}' <<<"$page")
    echo "   mean batch size (rows/execution): $(awk -v a="${inf:-0}" -v b="${exe:-0}" \
      'BEGIN { if (b > 0) printf "%.1f", a / b; else print "n/a" }')"
    kill "$pid"; wait "$pid" 2>/dev/null || true
    rm -rf "$repo" "$out"
  done
  echo "== $name in process (numaserve bench, batch $max_batch)"
  "$bin/numaserve" bench --model "$path" --batch "$max_batch" --seconds "$secs" | tail -2
done

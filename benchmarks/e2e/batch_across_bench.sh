#!/usr/bin/env bash
# A transformer batched across requests, or not: transformers' BERT-base
# (benchmarks/models/zoo.py, random weights, exported by torch.onnx.export
# with the batch and the sequence dynamic) served by one numaserve twice,
# as `bert` (no config: one request per run) and as `bert_batched`
# (max_batch_size 8, a DELAY_US queue delay), driven by Triton's
# perf_analyzer over gRPC at CONCURRENCY requests in flight, one row each.
# The two alternate in each of ROUNDS rounds; each round prints both
# models' requests/s and p50 latency, and their throughput ratio; the
# last line the median ratio with its range.
#   benchmarks/e2e/batch_across_bench.sh [build dir]
#
# Environment: SEQUENCES (default 32,128), CONCURRENCY (default 8),
# ROUNDS (default 3), DELAY_US (default 2000), WINDOW_MS (perf_analyzer's
# window, default 4000), SIZE (zoo size, default full; small for a quick
# look), WORK (a directory to keep the export in between runs; default a
# temporary one).
set -euo pipefail
build=${1:-build/release}
bin=$build/bin
sequences=${SEQUENCES:-32,128}
concurrency=${CONCURRENCY:-8}
rounds=${ROUNDS:-3}
delay=${DELAY_US:-2000}
window=${WINDOW_MS:-4000}
size=${SIZE:-full}

zoo=$(bash tools/python/venv.sh "$build" zoo) || { echo "batch across: no $build/venv/zoo"; exit 1; }
triton=$(bash tools/python/venv.sh "$build" triton) || { echo "batch across: no $build/venv/triton"; exit 1; }
pa=$("$triton" -c 'import os, perf_analyzer
print(os.path.join(os.path.dirname(perf_analyzer.__file__), "bin", "perf_analyzer"))')

dir=$(mktemp -d)
work=${WORK:-$dir/export}
mkdir -p "$work"
[ -f "$work/bert_base.onnx" ] || "$zoo" benchmarks/models/zoo.py --export "$work" --size "$size" \
  --models bert_base >/dev/null
repo=$dir/models
mkdir -p "$repo/bert/1" "$repo/bert_batched/1"
cp "$work/bert_base.onnx" "$repo/bert/1/model.onnx"
cp "$work/bert_base.onnx" "$repo/bert_batched/1/model.onnx"
printf 'max_batch_size: 8\ndynamic_batching { max_queue_delay_microseconds: %d }\n' "$delay" \
  >"$repo/bert_batched/config.pbtxt"

"$bin/numaserve" serve --model-repository "$repo" --host 127.0.0.1 --grpc-port 0 \
  --metrics-port 0 --http-port 0 --max-workers 1 >"$dir/ports" 2>"$dir/stderr" &
pid=$!
trap 'kill $pid 2>/dev/null; wait $pid 2>/dev/null; rm -rf "$dir"' EXIT
for _ in $(seq 1 1200); do grep -q grpc= "$dir/ports" && break; sleep 0.1; done
grpc=$(sed -nE 's/^grpc=([^ ]+).*/\1/p' "$dir/ports")
[ -n "$grpc" ] || { echo "batch across: numaserve did not start"; cat "$dir/stderr"; exit 1; }
grep -q "bert_batched.*one request per run" "$dir/stderr" &&
  { echo "batch across: bert_batched is not batched:"; grep "one request per run" "$dir/stderr"; exit 1; }

# run MODEL SEQ: "requests/s p50_ms" from perf_analyzer (inputs all zeros:
# token ids and type ids within their tables).
run() {
  local model=$1 seq=$2 lead="" batch=()
  [ "$model" = bert ] && lead="1,"
  [ "$model" = bert_batched ] && batch=(-b 1)
  "$pa" -m "$model" -u "$grpc" -i grpc "${batch[@]}" --input-data zero \
    --shape "input_ids:$lead$seq" --shape "attention_mask:$lead$seq" \
    --shape "token_type_ids:$lead$seq" --concurrency-range "$concurrency:$concurrency" \
    -p "$window" -s 25 -r 8 -f "$dir/pa.csv" >"$dir/pa.log" 2>&1 ||
    { echo "perf_analyzer failed on $model:" >&2; tail -5 "$dir/pa.log" >&2; return 1; }
  awk -F, 'NR == 1 { for (i = 1; i <= NF; i++) if ($i == "p50 latency") p = i }
           NR == 2 { printf "%s %.1f\n", $2, $p / 1000 }' "$dir/pa.csv"
}

echo "BERT-base ($size), $(nproc) cpus, one worker, concurrency $concurrency, delay ${delay} us"
printf "%-5s %-5s %14s %10s %18s %10s %8s\n" seq round "bert req/s" "p50 ms" "batched req/s" \
  "p50 ms" ratio
for seq in ${sequences//,/ }; do
  run bert "$seq" >/dev/null  # warm-up: each model's plans for this length
  run bert_batched "$seq" >/dev/null
  ratios=()
  for r in $(seq 1 "$rounds"); do
    if [ $((r % 2)) -eq 1 ]; then
      read -r a ap < <(run bert "$seq")
      read -r b bp < <(run bert_batched "$seq")
    else
      read -r b bp < <(run bert_batched "$seq")
      read -r a ap < <(run bert "$seq")
    fi
    ratio=$(awk -v a="$a" -v b="$b" 'BEGIN { printf "%.2f", b / a }')
    ratios+=("$ratio")
    printf "%-5s %-5s %14s %10s %18s %10s %8s\n" "$seq" "$r" "$a" "$ap" "$b" "$bp" "$ratio"
  done
  printf '%s\n' "${ratios[@]}" | sort -n | awk -v s="$seq" '{ v[NR] = $1 }
    END { printf "seq %s: batched / unbatched median %s (range %s-%s)\n", s, v[int((NR + 1) / 2)], v[1], v[NR] }'
done

#!/usr/bin/env bash
# Triton's perf_analyzer (PyPI perf-analyzer, pinned in requirements/
# triton.txt, in <build>/venv/triton) against one numaserve over gRPC, over
# HTTP with binary tensors and over HTTP with JSON tensors, and the
# project's grpc_loadgen on the same server, model, rows and concurrency in
# the same run: requests/s of each and each one's ratio to grpc_loadgen's.
#   benchmarks/e2e/triton_tools_bench.sh [build dir]
#
# Both are closed loops: CONCURRENCY requests in flight, a new one sent as
# each answer arrives. What differs: grpc_loadgen serializes its request
# once and only reads each answer's status; perf_analyzer builds every
# request through Triton's C++ client and reads every answer, so it spends
# more CPU per request. Where client and server share cores (as on a
# 2-core machine), that CPU comes out of the server's throughput, and a
# ratio below 1 measures the client, not the protocol (CLIENT_CPUS pins
# both clients elsewhere where there are cores to spare).
#
# Environment: MODEL (default fashion_classifier, from <build>/models),
# ROWS (rows per request, default 1), CONCURRENCY (default 4),
# WINDOW_MS (perf_analyzer's measurement window, default 2000; it measures
# until three windows agree within STABILITY percent, default 20, at most
# 6 windows), SECONDS_PER_RUN (grpc_loadgen, default 5), CLIENT_CPUS (a cpu
# list for both clients; default none).
set -euo pipefail
build=${1:-build/release}
bin=$build/bin
model=${MODEL:-fashion_classifier}
rows=${ROWS:-1}
concurrency=${CONCURRENCY:-4}
window=${WINDOW_MS:-2000}
stability=${STABILITY:-20}
secs=${SECONDS_PER_RUN:-5}
pin=()
[ -n "${CLIENT_CPUS:-}" ] && pin=(taskset -c "$CLIENT_CPUS")

python=$(bash tools/python/venv.sh "$build" triton) || {
  echo "triton tools: no $build/venv/triton (requirements/triton.txt from PyPI); not measured"
  exit 0
}
# The binary itself: the wheel's perf_analyzer script does not pass on its
# exit status.
pa=$("$python" -c 'import os, perf_analyzer
print(os.path.join(os.path.dirname(perf_analyzer.__file__), "bin", "perf_analyzer"))')

dir=$(mktemp -d)
"$bin/numaserve" serve --model-repository "$build/models" --host 127.0.0.1 --grpc-port 0 \
  --metrics-port 0 --http-port 0 >"$dir/ports" 2>"$dir/stderr" &
pid=$!
trap 'kill $pid 2>/dev/null; wait $pid 2>/dev/null; rm -rf "$dir"' EXIT
for _ in $(seq 1 600); do grep -q grpc= "$dir/ports" && break; sleep 0.1; done
grpc=$(sed -nE 's/^grpc=([^ ]+).*/\1/p' "$dir/ports")
http=$(sed -nE 's/.* http=([^ ]+).*/\1/p' "$dir/ports")
[ -n "$grpc" ] && [ -n "$http" ] || { echo "triton tools: numaserve did not start"; cat "$dir/stderr"; exit 1; }

# The model's input and its shape with ROWS rows (the first dimension).
read -r input shape < <("$python" - "$http" "$model" "$rows" <<'EOF'
import sys
import tritonclient.http as httpclient
meta = httpclient.InferenceServerClient(sys.argv[1]).get_model_metadata(sys.argv[2])
tensor = meta["inputs"][0]
print(tensor["name"], ",".join([sys.argv[3]] + [str(d) for d in tensor["shape"][1:]]))
EOF
)

loadgen=$("${pin[@]}" "$bin/grpc_loadgen" --url "$grpc" --model "$model" --rows "$rows" \
  --concurrency "$concurrency" --seconds "$secs" | head -1 | sed -nE 's/.*: ([0-9]+) req\/s.*/\1/p')

# perf_analyzer PROTOCOL [options]: its requests/s (inferences/s of
# requests with ROWS rows in the input: the model has no batching
# dimension of Triton's), "failed" (its errors on stderr) where requests
# failed, or "unstable" where it found no three windows that agree.
perf() {
  local protocol=$1 url=$grpc
  shift
  [ "$protocol" = http ] && url=$http
  if "${pin[@]}" "$pa" -m "$model" -u "$url" -i "$protocol" --shape "$input:$shape" \
      --concurrency-range "$concurrency:$concurrency" -p "$window" -s "$stability" -r 6 \
      -f "$dir/pa.csv" "$@" >"$dir/pa.log" 2>&1; then
    sed -n 2p "$dir/pa.csv" | cut -d, -f2
  elif ! grep -qi "stable" "$dir/pa.log" && grep -qiE "error|failed" "$dir/pa.log"; then
    echo "failed"
    grep -iE "error|failed" "$dir/pa.log" | head -3 >&2
  else
    echo "unstable"
  fi
}
pa_grpc=$(perf grpc)
pa_binary=$(perf http --input-tensor-format binary --output-tensor-format binary)
pa_json=$(perf http --input-tensor-format json --output-tensor-format json)

echo "model $model, input $input [$shape], concurrency $concurrency, $(nproc) cpus"
printf "%-14s %-12s %12s %16s\n" tool protocol "req/s" "/ grpc_loadgen"
row() {
  local ratio=n/a
  [[ "$3" =~ ^[0-9.]+$ ]] && [ "${loadgen:-0}" -gt 0 ] && ratio=$(awk -v a="$3" -v b="$loadgen" 'BEGIN { printf "%.2f", a / b }')
  printf "%-14s %-12s %12s %16s\n" "$1" "$2" "$3" "$ratio"
}
row grpc_loadgen grpc "$loadgen"
row perf_analyzer grpc "$pa_grpc"
row perf_analyzer "http binary" "$pa_binary"
row perf_analyzer "http json" "$pa_json"

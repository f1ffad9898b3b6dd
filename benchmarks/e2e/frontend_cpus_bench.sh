#!/usr/bin/env bash
# Served throughput with and without `serve --frontend-cpus` (docs/scheduling.md,
# "The front end on cores of its own"), on a machine of few cpus:
#   benchmarks/e2e/frontend_cpus_bench.sh [build dir]
#
# One worker, three layouts, alternated ROUNDS times:
#   float     no flag: the worker on every cpu, the front end floating over them;
#   frontend  --frontend-cpus FRONT: the worker on the other cpus, every
#             server thread on FRONT;
#   cpuset    --cpuset REST: the worker on the other cpus as with frontend,
#             the front end floating over every cpu (what the flag changes
#             besides taking FRONT from the worker);
#   copier    (only when LAYOUTS names it) as frontend, with --input-copy
#             node: each batch handed to the worker's copier thread, on
#             FRONT here, which copies its inputs (what the hand-off costs).
# The load generator runs on FRONT in every layout (the clients of a
# front-end core are on it too). For each, closed loop from CALLERS callers
# over 4 connections, ROWS rows a request, SECONDS_PER_RUN seconds after a
# second of warm-up: served rows/s and p50/p99 latency.
#
# Environment: FRONT (default 0), REST (default every other cpu), ROUNDS
# (default 2), SECONDS_PER_RUN (default 5), CASES ("rows:callers ...",
# default "1:32 16:8"), MODEL (default models/fashion_classifier.trained.onnx),
# LAYOUTS (default "float frontend cpuset").
set -euo pipefail
build=${1:-build/release}
bin=$build/bin
ncpu=$(nproc)
[ "$ncpu" -ge 2 ] || { echo "needs 2 cpus, has $ncpu"; exit 1; }
front=${FRONT:-0}
rest=${REST:-1-$((ncpu - 1))}
rounds=${ROUNDS:-2}
secs=${SECONDS_PER_RUN:-5}
cases=${CASES:-"1:32 16:8"}
model=${MODEL:-models/fashion_classifier.trained.onnx}

repo=$(mktemp -d)
trap 'rm -rf "$repo"' EXIT
mkdir -p "$repo/m/1"
ln -s "$(realpath "$model")" "$repo/m/1/model.onnx"
printf 'max_batch_size: 64\ndynamic_batching { max_queue_delay_microseconds: 0 }\n' \
  >"$repo/m/config.pbtxt"

field() {  # field KEY JSON_LINE
  sed -E "s/.*\"$1\": *([^,}]*).*/\1/" <<<"$2"
}

# run LAYOUT SERVE_ARGS...: one server, every case against it.
run() {
  local layout=$1
  shift
  local out log pid url
  out=$(mktemp)
  log=$(mktemp)
  "$bin/numaserve" serve --model-repository "$repo" --grpc-port 0 --metrics-port 0 \
    --http-port -1 "$@" >"$out" 2>"$log" &
  pid=$!
  for _ in $(seq 1 600); do
    grep -q grpc= "$out" && break
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  if ! grep -q grpc= "$out"; then
    echo "$layout: the server did not start:"
    cat "$log"
    kill "$pid" 2>/dev/null || true
    rm -f "$out" "$log"
    return
  fi
  url=$(sed -E 's/grpc=([^ ]+).*/\1/' "$out")
  for spec in $cases; do
    IFS=: read -r rows callers <<<"$spec"
    local json
    json=$("$bin/grpc_loadgen" --url "$url" --model m --rows "$rows" --cpus "$front" \
      --mode closed --concurrency "$callers" --channels 4 --seconds "$secs" | tail -1)
    printf '| %s | %s | %s | %.0f | %s / %s |\n' "$layout" "$rows" "$callers" \
      "$(field rows_per_second "$json")" "$(field p50_ms "$json")" "$(field p99_ms "$json")"
  done
  kill "$pid"
  wait "$pid" 2>/dev/null || true
  rm -f "$out" "$log"
}

echo "== $(uptime); front end cpu $front, the rest $rest"
echo "| layout | rows/request | callers | served rows/s | p50 / p99 ms |"
echo "|---|---|---|---|---|"
for _ in $(seq 1 "$rounds"); do
  for layout in ${LAYOUTS:-float frontend cpuset}; do
    case $layout in
      float) run float ;;
      frontend) run frontend --frontend-cpus "$front" ;;
      cpuset) run cpuset --cpuset "$rest" ;;
      copier) run copier --frontend-cpus "$front" --input-copy node ;;
      *) echo "unknown layout $layout (float, frontend, cpuset, copier)"; exit 1 ;;
    esac
  done
done

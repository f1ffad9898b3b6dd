#!/usr/bin/env bash
# The server's cpu per request, thread by thread, at saturation: one worker
# on the last cpu, the server's threads and grpc_loadgen (16 callers over 4
# connections, closed loop) on the others; each thread's time on a cpu and
# its wake-ups from /proc/PID/task/*/schedstat before and after the run,
# divided by the requests answered (the worker, a process of its own, is
# not counted).
#   benchmarks/e2e/frontend_threads.sh [build dir]
# Environment: MODEL (default benchmarks/models/out/resnet50.onnx),
# SECONDS_PER_RUN (default 10).
set -euo pipefail
bin=${1:-build/release}/bin
secs=${SECONDS_PER_RUN:-10}
ncpu=$(nproc)
[ "$ncpu" -ge 2 ] || { echo "needs 2 cpus, has $ncpu"; exit 1; }
compute=$((ncpu - 1))
front=0-$((ncpu - 2))
work=$(mktemp -d)
pid=""
trap '[ -n "$pid" ] && kill "$pid" 2>/dev/null; wait 2>/dev/null || true; rm -rf "$work"' EXIT
mkdir -p "$work/repo/m/1"
ln -s "$(realpath "${MODEL:-benchmarks/models/out/resnet50.onnx}")" "$work/repo/m/1/model.onnx"
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
lg=("$bin/grpc_loadgen" --url "$url" --model m --rows 1 --cpus "$front" --concurrency 16
  --channels 4 --mode closed)
"${lg[@]}" --seconds 3 >/dev/null  # warm-up
# tid, name, ns on a cpu, timeslices: one line per thread, by tid.
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

#!/usr/bin/env bash
# Serving benchmark: dynamic-batching delays, closed and open loop, and the
# serving overhead against the engine in process.
#   benchmarks/e2e/serving_bench.sh [build dir]
#
# For each case (model, rows per request) and each max_queue_delay, the real
# server is started on a temporary repository (config.pbtxt with dynamic
# batching) and driven by grpc_loadgen: closed loop with 1 caller, closed
# loop with many callers over 4 connections (saturation), the same callers
# over 4 ModelStreamInfer streams (saturation without per-call set-up), and open
# loop at a fixed rate (latency from each request's scheduled send time).
#
# Overhead measurement (the same compute on both sides):
#   * compute cpus (COMPUTE_CPUS, default the last cpu): the server's worker
#     (`serve --cpuset`, so one OpenMP thread per compute cpu) and, for the
#     reference, `numaserve bench --threads <that count>` pinned there too,
#     at batch max_batch_size.
#   * front cpus (FRONT_CPUS, default every other cpu): the server process
#     (gRPC front end, batcher, router: every thread moved with `taskset -a
#     -p` once it is up; the worker is a process of its own and stays on the
#     compute cpus) and the load generator (--cpus).
#   overhead ratio = served rows/s at saturation / in-process rows/s.
#   A ratio near 1 means the worker's cpus never wait for the front end; if
#   the front cpus saturate first, the ratio measures the front end instead.
#   Where the time goes, per saturation run:
#     fe_us/req  server process CPU (utime+stime from /proc/PID/stat, the
#                worker excluded: it is a process of its own) per request;
#     cli_us/req the load generator's CPU per request;
#     worker%    worker CPU time / wall time (100% = its cpu never idles);
#     wait%      time the worker was ready to run but another process held
#                its cpu (/proc/PID/task/*/schedstat): other load on the
#                machine, not serving overhead;
#     batch      mean rows per execution (numaserve_inferences_total /
#                numaserve_executions_total over the run).
#   On a machine with one cpu everything shares it and no pinning is done.
#
# Environment:
#   SECONDS_PER_RUN (default 5), DELAYS_US (default "0 1000 5000"),
#   COMPUTE_CPUS / FRONT_CPUS (cpu lists, see above),
#   CASES ("name=path:max_batch:rows:concurrency:open_rate ...").
set -euo pipefail
build=${1:-build/release}
bin=$build/bin
secs=${SECONDS_PER_RUN:-5}
delays=${DELAYS_US:-"0 1000 5000"}
cases=${CASES:-"mlp=models/fashion_classifier.trained.onnx:64:1:128:2000 \
mlp=models/fashion_classifier.trained.onnx:64:16:32:500 \
mlp=models/fashion_classifier.trained.onnx:64:64:4:200 \
cnn=benchmarks/models/out/mobilenetv2.onnx:16:1:32:40"}

ncpu=$(nproc)
if [ "$ncpu" -ge 2 ]; then
  compute=${COMPUTE_CPUS:-$((ncpu - 1))}
  front=${FRONT_CPUS:-0-$((ncpu - 2))}
  pin_compute=(taskset -c "$compute")
  loadgen_cpus=(--cpus "$front")
  serve_cpus=(--cpuset "$compute")
  threads=$(python3 -c "import sys
n=0
for p in sys.argv[1].split(','):
    a,_,b=p.partition('-'); n+=int(b or a)-int(a)+1
print(n)" "$compute")
else
  front="" pin_compute=() loadgen_cpus=() serve_cpus=()
  threads=1
fi
tick=$(getconf CLK_TCK)

# utime+stime of a process, in seconds.
cpu_seconds() {
  awk -v t="$tick" '{ sub(/^.*\) /, ""); print ($12 + $13) / t }' "/proc/$1/stat" 2>/dev/null ||
    echo 0
}
# Nanoseconds a process's threads spent runnable but waiting for their cpu
# (another process had it), from /proc/PID/task/*/schedstat.
wait_seconds() {
  cat /proc/"$1"/task/*/schedstat 2>/dev/null | awk '{ s += $2 } END { print s / 1e9 }'
}
metric() {  # metric NAME MODEL: a counter's value on the server's /metrics page
  curl -s "http://$metrics/metrics" |
    awk -v n="$1" -v m="$2" '$1 ~ "^"n"\\{model=\""m"\"" { s += $2 } END { print s + 0 }'
}
field() {  # field KEY JSON_LINE
  sed -E "s/.*\"$1\": *([^,}]*).*/\1/" <<<"$2"
}

# measure LOAD CALLERS LOADGEN_ARGS...: one grpc_loadgen run against the
# server, with the server's CPU, the worker's CPU and the batches formed
# during it; prints the run and adds a row to the summary.
measure() {
  local load=$1 callers=$2
  shift 2
  local inf0 exe0 fe0 wk0 ww0 t0 result
  inf0=$(metric numaserve_inferences_total "$name")
  exe0=$(metric numaserve_executions_total "$name")
  fe0=$(cpu_seconds "$pid")
  wk0=$(cpu_seconds "${worker:-$pid}")
  ww0=$(wait_seconds "${worker:-$pid}")
  t0=$(date +%s.%N)
  result=$("${lg[@]}" "$@" || true)
  local t1 fe1 wk1 ww1 inf1 exe1
  t1=$(date +%s.%N)
  fe1=$(cpu_seconds "$pid")
  wk1=$(cpu_seconds "${worker:-$pid}")
  ww1=$(wait_seconds "${worker:-$pid}")
  inf1=$(metric numaserve_inferences_total "$name")
  exe1=$(metric numaserve_executions_total "$name")
  echo "${result%%$'\n'*}"
  local json=${result#*$'\n'}
  summary+=("$(awk -v name="$name" -v rows="$rows" -v delay="$delay" -v load="$load" \
    -v callers="$callers" -v served="$(field rows_per_second "$json")" \
    -v p50="$(field p50_ms "$json")" -v p90="$(field p90_ms "$json")" \
    -v p99="$(field p99_ms "$json")" -v p999="$(field p999_ms "$json")" \
    -v cli="$(field client_cpu_us_per_request "$json")" -v inproc="$inproc" \
    -v inf="$(awk -v a="$inf0" -v b="$inf1" 'BEGIN { print b - a }')" \
    -v exe="$(awk -v a="$exe0" -v b="$exe1" 'BEGIN { print b - a }')" \
    -v fe="$(awk -v a="$fe0" -v b="$fe1" 'BEGIN { print b - a }')" \
    -v wk="$(awk -v a="$wk0" -v b="$wk1" 'BEGIN { print b - a }')" \
    -v ww="$(awk -v a="$ww0" -v b="$ww1" 'BEGIN { print b - a }')" \
    -v wall="$(awk -v a="$t0" -v b="$t1" 'BEGIN { print b - a }')" 'BEGIN {
      reqs = inf / rows
      printf "| %s | %d | %g | %s | %s | %.0f | %.2f / %.2f / %.2f / %.2f | %s | %.0f | %.2f | %s | %.0f | %s | %s |",
        name, rows, delay / 1000, load, (callers > 0 ? callers : "-"), served, p50, p90, p99,
        p999, (exe > 0 ? sprintf("%.1f", inf / exe) : "n/a"), inproc,
        (inproc > 0 ? served / inproc : 0),
        (reqs > 0 ? sprintf("%.1f", fe * 1e6 / reqs) : "n/a"), cli,
        (wall > 0 ? sprintf("%.0f%%", 100 * wk / wall) : "n/a"),
        (wall > 0 ? sprintf("%.0f%%", 100 * ww / wall) : "n/a") }')")
}

echo "== load: $(uptime)"
echo "== compute cpus: ${compute:-all} ($threads threads), front end and load generator: ${front:-all}"
summary=()
for spec in $cases; do
  name=${spec%%=*}
  rest=${spec#*=}
  IFS=: read -r path max_batch rows conc rate <<<"$rest"
  [ -f "$path" ] || { echo "skip $name: $path missing"; continue; }
  echo "== $name in process (numaserve bench, batch $max_batch, $threads threads)"
  inproc_line=$("${pin_compute[@]}" "$bin/numaserve" bench --model "$path" --batch "$max_batch" \
    --threads "$threads" --seconds "$secs" --json | tail -1)
  echo "   $inproc_line"
  inproc=$(field inferences_per_second "$inproc_line")
  for delay in $delays; do
    repo=$(mktemp -d)
    mkdir -p "$repo/$name/1"
    ln -s "$(realpath "$path")" "$repo/$name/1/model.onnx"
    cat >"$repo/$name/config.pbtxt" <<CONFIG
max_batch_size: $max_batch
dynamic_batching { max_queue_delay_microseconds: $delay }
CONFIG
    out=$(mktemp)
    log=$(mktemp)
    "$bin/numaserve" serve --model-repository "$repo" --grpc-port 0 \
      --metrics-port 0 --http-port -1 "${serve_cpus[@]}" >"$out" 2>"$log" &
    pid=$!
    for _ in $(seq 1 1200); do
      grep -q grpc= "$out" && break
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.1
    done
    if ! grep -q grpc= "$out"; then
      echo "skip $name delay $delay: the server did not start:"
      cat "$log"
      kill "$pid" 2>/dev/null || true
      wait "$pid" 2>/dev/null || true
      rm -rf "$repo" "$out" "$log"
      continue
    fi
    # The front end onto the front cpus: every thread the server has now
    # (threads started later inherit it); the worker, a process of its own,
    # stays on the compute cpus. (Pinning before start-up would hide the
    # compute cpus from the server's topology discovery.)
    if [ -n "$front" ]; then taskset -a -p -c "$front" "$pid" >/dev/null; fi
    url=$(sed -E 's/grpc=([^ ]+).*/\1/' "$out")
    metrics=$(sed -E 's/.*metrics=([^ ]+).*/\1/' "$out")
    worker=$(pgrep -P "$pid" | head -1 || true)
    echo "== $name rows=$rows max_queue_delay_us=$delay ($(grep -m1 -o 'worker 0 pid.*' "$log" |
      cut -c1-80))"
    lg=("$bin/grpc_loadgen" --url "$url" --model "$name" --rows "$rows" "${loadgen_cpus[@]}"
      --seconds "$secs")
    measure "closed" 1 --mode closed --concurrency 1
    measure "closed" "$conc" --mode closed --concurrency "$conc" --channels 4
    measure "stream" "$conc" --mode stream --concurrency "$conc" --channels 4
    measure "open $rate/s" 0 --mode open --rate "$rate"
    kill "$pid"
    wait "$pid" 2>/dev/null || true
    rm -rf "$repo" "$out" "$log"
  done
done
echo "== summary (ratio = served / in-process rows/s, meaningful for the saturation runs; load: $(uptime | sed 's/.*load average/load average/'))"
echo "| model | rows/request | max_queue_delay ms | load | callers | served rows/s | p50 / p90 / p99 / p99.9 ms | batch | in-process rows/s | ratio | fe_us/req | cli_us/req | worker% | wait% |"
echo "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
printf '%s\n' "${summary[@]}"

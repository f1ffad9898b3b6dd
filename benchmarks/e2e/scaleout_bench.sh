#!/usr/bin/env bash
# Scale-out serving on this machine: a compute-heavy CNN served in four
# layouts at saturation, against what the engine does in process.
#   benchmarks/e2e/scaleout_bench.sh [build dir]
#
# Layouts (one server each, on a temporary repository whose config.pbtxt
# sets max_batch_size B and dynamic batching):
#   (a) one single-core worker per core (`serve --domain core`);
#   (b) one worker, `instance_placement { instances_per_domain: <cores> }`
#       (an instance per core in the one worker);
#   (c) one worker, one instance on all its cores (the latency default,
#       `instances_per_domain: 1` written out);
#   (d) one worker, `serve --instances auto` (the worker measures the
#       model's scaling at load and picks the count; its log line is shown).
# Each is driven by grpc_loadgen, closed loop, one row per request, with
# enough callers (CONCURRENCY, default 6 x B) to keep every instance busy
# and a full batch queued behind it, over 4 connections: a warm-up run,
# then the measured run (its own warm-up excluded from rows/s).
#
# In-process references (`numaserve bench --batch B`): one thread (alone),
# two one-thread processes at once (one per cpu), and --threads <cores>.
#   ratio = served rows/s / reference, where the reference is
#     (a), (b): cores x the one-thread rate (the issue's target: >= 0.9);
#     (c):      the <cores>-thread rate;
#     (d):      the better of the two.
#
# The load generator and the server's front end (gRPC, batching,
# scheduling: the server process) run on the same cores as the workers:
# nothing is pinned apart, unlike serving_bench.sh, since every layout
# needs every core for compute. What they take from the workers is shown
# per run, as serving_bench.sh measures it:
#   fe_us/req   server process CPU (utime+stime from /proc/PID/stat, the
#               workers excluded: processes of their own) per request;
#   cli_us/req  the load generator's CPU per request (its own figure);
#   workers%    the workers' CPU time / wall time (100% per busy core);
#   wait%       time the workers' threads were ready to run but another
#               process held their cpu (/proc/PID/task/*/schedstat) / wall
#               time: the load generator, the front end, or other work on
#               the machine (then the in-process references suffer too:
#               compare the load averages printed at the start and end);
#   slots busy% numaserve_instance_busy_seconds_total growth / wall time,
#               mean over the slots (worker x instance) and the lowest;
#   batch       mean rows per execution.
# A compute-heavy model keeps fe and cli small beside a batch's compute;
# with a light one the ratio measures the front end instead.
#
# Environment:
#   SECONDS_PER_RUN (default 10), WARMUP_SECONDS (default 3),
#   DELAY_US (max_queue_delay_microseconds, default 2000),
#   CASES ("name=path:max_batch[:concurrency] ..."; a missing file under
#   benchmarks/models/out is generated with benchmarks/models/generate.py).
set -euo pipefail
build=${1:-build/release}
bin=$build/bin
secs=${SECONDS_PER_RUN:-10}
warm=${WARMUP_SECONDS:-3}
delay=${DELAY_US:-2000}
cases=${CASES:-"resnet50=benchmarks/models/out/resnet50.onnx:8 \
mobilenetv2=benchmarks/models/out/mobilenetv2.onnx:16"}
cores=$(nproc)
tick=$(getconf CLK_TCK)
if [ ! -x "$bin/numaserve" ] || [ ! -x "$bin/grpc_loadgen" ]; then
  echo "scaleout_bench: $bin/numaserve or $bin/grpc_loadgen missing (build first)"
  exit 1
fi

# utime+stime of processes, in seconds (0 for those gone).
cpu_seconds() {
  local total=0 p
  for p in "$@"; do
    total=$(awk -v t="$tick" -v s="$total" '{ sub(/^.*\) /, ""); print s + ($12 + $13) / t }' \
      "/proc/$p/stat" 2>/dev/null || echo "$total")
  done
  echo "$total"
}
# Seconds the threads of processes spent runnable, waiting for a cpu.
wait_seconds() {
  local p
  for p in "$@"; do cat /proc/"$p"/task/*/schedstat 2>/dev/null || true; done |
    awk '{ s += $2 } END { print s / 1e9 }'
}
scrape() { curl -s "http://$metrics/metrics"; }
metric() {  # metric PAGE NAME MODEL: a counter summed over the model's series
  awk -v n="$2" -v m="$3" '$1 ~ "^"n"\\{" && $1 ~ "model=\""m"\"" { s += $2 } END { print s + 0 }' \
    <<<"$1"
}
# slot_busy PAGE0 PAGE1 WALL: "mean% min% slots" of the busy seconds per
# worker x instance between two scrapes, over WALL seconds.
slot_busy() {
  awk -v wall="$3" '
    FNR == 1 { f++ }
    /^numaserve_instance_busy_seconds_total\{/ {
      key = $1; sub(/^[^{]*\{/, "", key); sub(/\}$/, "", key)
      w = key; sub(/.*worker="/, "", w); sub(/".*/, "", w)
      i = key; sub(/.*slot="/, "", i); sub(/".*/, "", i)
      v[f, w "/" i] += $2; slots[w "/" i] = 1
    }
    END {
      n = 0; sum = 0; low = -1
      for (s in slots) {
        d = v[2, s] - v[1, s]; n++; sum += d
        if (low < 0 || d < low) low = d
      }
      if (n == 0 || wall <= 0) { print "n/a n/a 0"; exit }
      printf "%.0f%% %.0f%% %d\n", 100 * sum / n / wall, 100 * low / wall, n
    }' <(echo "$1") <(echo "$2")
}
field() {  # field KEY JSON_LINE
  sed -E "s/.*\"$1\": *([^,}]*).*/\1/" <<<"$2"
}
calc() { awk "BEGIN { print $1 }"; }

# bench_rate MODEL BATCH THREADS [CPU]: in-process rows/s.
bench_rate() {
  local pin=()
  [ -n "${4:-}" ] && pin=(taskset -c "$4")
  local line
  line=$("${pin[@]}" "$bin/numaserve" bench --model "$1" --batch "$2" --threads "$3" \
    --seconds "$secs" --json 2>/dev/null | tail -1)
  field inferences_per_second "$line"
}

# start_server REPO ARGS...: sets pid, url, metrics, log; 1 if it did not start.
start_server() {
  local repo=$1
  shift
  out=$(mktemp)
  log=$(mktemp)
  "$bin/numaserve" serve --model-repository "$repo" --grpc-port 0 --metrics-port 0 --http-port -1 "$@" \
    >"$out" 2>"$log" &
  pid=$!
  for _ in $(seq 1 1800); do
    grep -q grpc= "$out" && break
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  if ! grep -q grpc= "$out"; then
    echo "   the server did not start:"
    sed 's/^/   | /' "$log"
    kill "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
    return 1
  fi
  url=$(sed -E 's/grpc=([^ ]+).*/\1/' "$out")
  metrics=$(sed -E 's/.*metrics=([^ ]+).*/\1/' "$out")
}
stop_server() {
  kill "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
  rm -f "$out" "$log"
}

echo "== scale-out serving: $(date -u '+%Y-%m-%d %H:%M UTC')"
echo "== machine: $(lscpu | sed -n 's/^Model name: *//p' | head -1); \
$("$bin/numaserve" topology 2>/dev/null | sed -n 's/^cpu: //p' | head -1); $cores cpus"
echo "== load: $(uptime | sed 's/.*load average/load average/')"
echo "== the load generator and the front end share the $cores cpus with the workers"
summary=()
for spec in $cases; do
  name=${spec%%=*}
  rest=${spec#*=}
  IFS=: read -r path max_batch conc <<<"$rest"
  conc=${conc:-$((6 * max_batch))}
  if [ ! -f "$path" ] && [ "$(dirname "$path")" = benchmarks/models/out ]; then
    echo "== generating $path"
    /usr/bin/python3 benchmarks/models/generate.py --only "$(basename "$path" .onnx)" \
      --if-stale >/dev/null || true
  fi
  [ -f "$path" ] || { echo "skip $name: $path missing"; continue; }

  echo "== $name in process (numaserve bench --batch $max_batch, $secs s each)"
  one=$(bench_rate "$path" "$max_batch" 1 0)
  echo "   --threads 1 (alone, cpu 0): $one rows/s"
  pair=""
  if [ "$cores" -ge 2 ]; then
    tmp=$(mktemp)
    for c in $(seq 0 $((cores - 1))); do
      bench_rate "$path" "$max_batch" 1 "$c" >>"$tmp" &
    done
    wait
    pair=$(awk '{ s += $1 } END { printf "%.1f", s }' "$tmp")
    rm -f "$tmp"
    echo "   --threads 1 x $cores processes at once (one per cpu): $pair rows/s in all"
  fi
  all=$(bench_rate "$path" "$max_batch" "$cores")
  echo "   --threads $cores: $all rows/s"
  scaled=$(calc "$cores * $one")
  best=$(calc "($scaled > $all) ? $scaled : $all")

  for layout in a b c d; do
    placement="" serve_args=()
    case $layout in
      a) what="(a) $cores workers x 1 core (--domain core)"; serve_args=(--domain core)
         ref=$scaled refwhat="$cores x 1 thread" ;;
      b) what="(b) 1 worker, instances_per_domain: $cores"
         placement="instance_placement { instances_per_domain: $cores }"
         ref=$scaled refwhat="$cores x 1 thread" ;;
      c) what="(c) 1 worker x $cores threads (latency default)"
         placement="instance_placement { instances_per_domain: 1 }"
         ref=$all refwhat="$cores threads" ;;
      d) what="(d) 1 worker, --instances auto"; serve_args=(--instances auto)
         ref=$best refwhat="best of both" ;;
    esac
    repo=$(mktemp -d)
    mkdir -p "$repo/$name/1"
    ln -s "$(realpath "$path")" "$repo/$name/1/model.onnx"
    cat >"$repo/$name/config.pbtxt" <<CONFIG
max_batch_size: $max_batch
dynamic_batching { max_queue_delay_microseconds: $delay }
$placement
CONFIG
    echo "== $name $what: $conc callers, max_batch_size $max_batch, delay ${delay} us"
    if ! start_server "$repo" "${serve_args[@]}"; then
      rm -rf "$repo"
      summary+=("| $name | $what | n/a | $ref ($refwhat) | n/a | | | | | | | |")
      continue
    fi
    mapfile -t workers < <(pgrep -P "$pid" || true)
    grep -E "instances auto|instance [0-9]+ of" "$log" | sed 's/^/   /' | head -8 || true
    chosen=$(sed -nE 's/.*instances auto: .* -> ([0-9]+).*/\1/p' "$log" | head -1)
    [ -n "$chosen" ] && what="$what -> $chosen"
    lg=("$bin/grpc_loadgen" --url "$url" --model "$name" --rows 1 --mode closed
      --concurrency "$conc" --channels 4)
    # Warm-up (also waits for the model to be ready).
    for _ in 1 2 3 4 5; do
      "${lg[@]}" --seconds "$warm" --warmup-seconds 0 >/dev/null 2>&1 && break
      sleep 1
    done
    page0=$(scrape)
    fe0=$(cpu_seconds "$pid")
    wk0=$(cpu_seconds "${workers[@]}")
    ww0=$(wait_seconds "${workers[@]}")
    t0=$(date +%s.%N)
    result=$("${lg[@]}" --seconds "$secs" --warmup-seconds 2 || true)
    t1=$(date +%s.%N)
    fe1=$(cpu_seconds "$pid")
    wk1=$(cpu_seconds "${workers[@]}")
    ww1=$(wait_seconds "${workers[@]}")
    page1=$(scrape)
    echo "   ${result%%$'\n'*}"
    json=${result#*$'\n'}
    wall=$(calc "$t1 - $t0")
    inf=$(calc "$(metric "$page1" numaserve_inferences_total "$name") - \
$(metric "$page0" numaserve_inferences_total "$name")")
    exe=$(calc "$(metric "$page1" numaserve_executions_total "$name") - \
$(metric "$page0" numaserve_executions_total "$name")")
    read -r busy_mean busy_low nslots <<<"$(slot_busy "$page0" "$page1" "$wall")"
    summary+=("$(awk -v name="$name" -v what="$what" -v served="$(field rows_per_second "$json")" \
      -v ref="$ref" -v refwhat="$refwhat" -v inf="$inf" -v exe="$exe" \
      -v fe="$(calc "$fe1 - $fe0")" -v wk="$(calc "$wk1 - $wk0")" -v wall="$wall" \
      -v ww="$(calc "$ww1 - $ww0")" \
      -v cli="$(field client_cpu_us_per_request "$json")" -v p50="$(field p50_ms "$json")" \
      -v p99="$(field p99_ms "$json")" -v errors="$(field errors "$json")" \
      -v busy="$busy_mean / $busy_low ($nslots)" 'BEGIN {
        printf "| %s | %s | %.1f | %.1f (%s) | %.2f | %.0f / %.0f | %s | %s | %s | %s | %s | %s |",
          name, what, served, ref, refwhat, (ref > 0 ? served / ref : 0), p50, p99,
          (exe > 0 ? sprintf("%.1f", inf / exe) : "n/a"),
          (inf > 0 ? sprintf("%.0f", fe * 1e6 / inf) : "n/a"), cli,
          (wall > 0 ? sprintf("%.0f%%", 100 * wk / wall) : "n/a"),
          (wall > 0 ? sprintf("%.0f%%", 100 * ww / wall) : "n/a"), busy
        if (errors + 0 > 0) printf " %d errors", errors }')")
    stop_server
    rm -rf "$repo"
  done
done
echo "== summary (ratio = served / in-process reference; target (a), (b) >= 0.9; load: \
$(uptime | sed 's/.*load average/load average/'))"
echo "| model | layout | served rows/s | in-process reference rows/s | ratio | p50 / p99 ms | batch | fe_us/req | cli_us/req | workers% | wait% | slots busy% mean / lowest (slots) |"
echo "|---|---|---|---|---|---|---|---|---|---|---|---|"
printf '%s\n' "${summary[@]}"

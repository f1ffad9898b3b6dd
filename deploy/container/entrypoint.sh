#!/bin/sh
# Entrypoint of the numaserve image: `numaserve serve` on every interface of
# the container, the model repository at /models, gRPC on 8001 and metrics on
# 8002. Arguments that start with "-" are appended to `serve` (a flag given
# again wins); a numaserve command (topology, infer, ...) or any other
# program given instead is run as such.
#
# Environment (defaults in brackets):
#   NUMASERVE_MODEL_REPOSITORY [/models]   NUMASERVE_HOST [0.0.0.0]
#   NUMASERVE_GRPC_PORT [8001]             NUMASERVE_METRICS_PORT [8002]
#   NUMASERVE_HTTP_PORT [-1: off]          the HTTP/REST port (8000 is the usual one)
#   NUMASERVE_METRICS_HOST [NUMASERVE_HOST]  where /metrics listens: in
#                                          Kubernetes the pod's IP (Prometheus
#                                          scrapes it there), 127.0.0.1 for a
#                                          sidecar agent; an IPv6 address is
#                                          bracketed for --metrics-address
#   NUMASERVE_ARGS                         more `serve` options, split on spaces
#   NUMASERVE_BIN [numaserve on PATH]
#   NUMASERVE_CGROUP_ROOT [/sys/fs/cgroup]  where the CPU quota is read
#
# cpus: numaserve plans its workers over the cpus the container may run on
# (its cgroup cpuset and affinity mask: docker --cpuset-cpus/--cpuset-mems,
# Kubernetes' static CPU manager), one per NUMA node by default. A CPU quota
# alone (docker --cpus, a Kubernetes limit without the static policy) does
# not narrow that set: the workers would start a thread on every visible cpu
# and be throttled. This script says what the container may use and warns in
# that case.
set -eu

NUMASERVE_BIN=${NUMASERVE_BIN:-numaserve}
NUMASERVE_MODEL_REPOSITORY=${NUMASERVE_MODEL_REPOSITORY:-/models}
NUMASERVE_HOST=${NUMASERVE_HOST:-0.0.0.0}
NUMASERVE_GRPC_PORT=${NUMASERVE_GRPC_PORT:-8001}
NUMASERVE_HTTP_PORT=${NUMASERVE_HTTP_PORT:--1}
NUMASERVE_METRICS_PORT=${NUMASERVE_METRICS_PORT:-8002}
NUMASERVE_METRICS_HOST=${NUMASERVE_METRICS_HOST:-$NUMASERVE_HOST}
NUMASERVE_ARGS=${NUMASERVE_ARGS:-}
cgroup=${NUMASERVE_CGROUP_ROOT:-/sys/fs/cgroup}

log() { echo "numaserve-entrypoint: $*" >&2; }

# Counts the cpus of a list such as 0-3,8,10-11.
count_cpus() {
  echo "$1" | tr ',' '\n' | awk -F- 'NF == 2 { n += $2 - $1 + 1; next } NF == 1 && $1 != "" { n++ }
                                      END { print n + 0 }'
}

# The CPU quota in whole cpus (rounded up), or nothing when there is none:
# cgroup v2 cpu.max ("max 100000" or "QUOTA PERIOD"), else v1's cfs files.
cpu_quota() {
  if [ -r "$cgroup/cpu.max" ]; then
    read -r quota period < "$cgroup/cpu.max" || return 0
  elif [ -r "$cgroup/cpu/cpu.cfs_quota_us" ] && [ -r "$cgroup/cpu/cpu.cfs_period_us" ]; then
    quota=$(cat "$cgroup/cpu/cpu.cfs_quota_us")
    period=$(cat "$cgroup/cpu/cpu.cfs_period_us")
  else
    return 0
  fi
  case "$quota" in max | -1 | "") return 0 ;; esac
  [ "${period:-0}" -gt 0 ] 2>/dev/null || return 0
  echo $(((quota + period - 1) / period))
}

report_cpus() {
  cpus=$(awk '/^Cpus_allowed_list:/ { print $2 }' /proc/self/status 2>/dev/null || true)
  mems=$(awk '/^Mems_allowed_list:/ { print $2 }' /proc/self/status 2>/dev/null || true)
  [ -n "$cpus" ] || return 0
  ncpus=$(count_cpus "$cpus")
  quota=$(cpu_quota || true)
  log "cpus ${cpus} (${ncpus}), memory nodes ${mems:-?}${quota:+, cpu quota ${quota} cpus}"
  if [ -n "$quota" ] && [ "$quota" -lt "$ncpus" ]; then
    log "warning: a quota of ${quota} cpus over ${ncpus} usable cpus: numaserve plans workers over" \
        "all ${ncpus} and is throttled. Give the container a cpuset of its own (docker" \
        "--cpuset-cpus/--cpuset-mems; Kubernetes: static CPU manager policy, integer cpu" \
        "requests equal to limits) or pass --cpuset or --max-workers."
  fi
}

# HOST:PORT for --metrics-address; an IPv6 address (it has a colon) in brackets.
case "$NUMASERVE_METRICS_HOST" in
  \[*) metrics_address="$NUMASERVE_METRICS_HOST:$NUMASERVE_METRICS_PORT" ;;
  *:*) metrics_address="[$NUMASERVE_METRICS_HOST]:$NUMASERVE_METRICS_PORT" ;;
  *) metrics_address="$NUMASERVE_METRICS_HOST:$NUMASERVE_METRICS_PORT" ;;
esac

case "${1:-}" in
  "" | -*)
    report_cpus
    # NUMASERVE_ARGS is split on whitespace on purpose.
    # shellcheck disable=SC2086
    exec "$NUMASERVE_BIN" serve \
      --model-repository "$NUMASERVE_MODEL_REPOSITORY" \
      --host "$NUMASERVE_HOST" \
      --grpc-port "$NUMASERVE_GRPC_PORT" \
      --http-port "$NUMASERVE_HTTP_PORT" \
      --metrics-address "$metrics_address" \
      $NUMASERVE_ARGS "$@"
    ;;
  serve | topology | infer | train | bench | profile | quantize)
    exec "$NUMASERVE_BIN" "$@"
    ;;
  *)
    exec "$@"
    ;;
esac

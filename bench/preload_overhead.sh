#!/usr/bin/env bash
# Pass-through overhead of libcxlkv_preload.so on a mixed small-allocation workload, and
# large allocations (2..64 MiB) through the shim vs glibc and jemalloc. Each configuration is
# a separate process; configurations are interleaved, REPS times, and the median reported.
#   BUILD=<dir with preload/libcxlkv_preload.so and bench/preload_overhead> [REPS=9]
set -euo pipefail
BUILD="${BUILD:-build/bench-preload}"
REPS="${REPS:-9}"
SHIM="$(realpath "$BUILD/preload/libcxlkv_preload.so")"
H="$BUILD/bench/preload_overhead"
JE=/usr/lib/x86_64-linux-gnu/libjemalloc.so.2
POOL_FILE=/dev/shm/cxlkv-bench-preload-$$
trap 'rm -f "$POOL_FILE"' EXIT
median() { sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }

# run CONFIG ARGS...: one measurement.
run() {
  local cfg="$1"; shift
  case "$cfg" in
    plain) "$H" "$@" ;;
    shim-off) env LD_PRELOAD="$SHIM" "$H" "$@" ;;  # loaded, no pool
    shim) env LD_PRELOAD="$SHIM" CXLKV_POOL="file:$POOL_FILE?size=2G&reserve=0" "$H" "$@" ;;
    shim-stats) env LD_PRELOAD="$SHIM" CXLKV_POOL="file:$POOL_FILE?size=2G&reserve=0" \
                  CXLKV_STATS=/dev/null "$H" "$@" ;;
    jemalloc) env LD_PRELOAD="$JE" "$H" "$@" ;;
  esac
}

echo "date: $(date -u +%FT%TZ); load: $(cut -d' ' -f1-3 /proc/loadavg); reps: $REPS"
for threads in 1 2; do
  declare -A r=()
  for i in $(seq "$REPS"); do
    for cfg in plain shim-off shim shim-stats; do
      r[$cfg]+="$(run $cfg small "$threads" 20000000) "
    done
  done
  base="$(echo ${r[plain]} | tr ' ' '\n' | median)"
  for cfg in plain shim-off shim shim-stats; do
    m="$(echo ${r[$cfg]} | tr ' ' '\n' | median)"
    printf "small threads=%d %-10s %7.3f ns/op  %+6.2f%%   [%s]\n" "$threads" "$cfg" "$m" \
      "$(awk -v m="$m" -v b="$base" 'BEGIN {print (m / b - 1) * 100}')" "${r[$cfg]% }"
  done
  unset r
done
for mib in 2 8 32 64; do
  bytes=$((mib << 20))
  iters=$((2048 / mib))
  declare -A r=()
  for i in $(seq "$REPS"); do
    for cfg in plain jemalloc shim; do
      r[$cfg]+="$(CXLKV_MIN_BYTES=1M run $cfg large "$bytes" "$iters") "
    done
  done
  for cfg in plain jemalloc shim; do
    m="$(echo ${r[$cfg]} | tr ' ' '\n' | median)"
    printf "large %2d MiB %-9s %10.1f ns/alloc (malloc + touch every page + free)\n" "$mib" "$cfg" "$m"
  done
  unset r
done

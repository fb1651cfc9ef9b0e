#!/usr/bin/env bash
# Runs kv_replay (the KV trace replay of issue #7) and plots its output with gnuplot.
#   bench/replay.sh [kv_replay options...]
# Environment: CXLKV_BENCH_BUILD_DIR (default build/bench), CXLKV_REPLAY_OUT (default
# bench/results/replay). Writes table.txt, summary.{csv,json}, per-run CSVs, ttft.png and
# occupancy.png into the output directory.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${CXLKV_BENCH_BUILD_DIR:-build/bench}
OUT=${CXLKV_REPLAY_OUT:-bench/results/replay}
BIN="$BUILD/bench/kv_replay"
[ -x "$BIN" ] || { echo "replay.sh: $BIN not built (ninja -C $BUILD kv_replay)" >&2; exit 1; }
command -v gnuplot >/dev/null || { echo "replay.sh: gnuplot missing (apt-get install gnuplot-nox)" >&2; exit 1; }
mkdir -p "$OUT"
echo "# $BIN --out $OUT $* ($(date -u +%Y-%m-%dT%H:%M:%SZ), load $(cut -d' ' -f1-3 /proc/loadavg))" \
  > "$OUT/table.txt"
set +e
"$BIN" --out "$OUT" "$@" | tee -a "$OUT/table.txt"
rc=${PIPESTATUS[0]}
set -e
[ "$rc" -eq 0 ] || { echo "replay.sh: kv_replay failed ($rc)" >&2; exit "$rc"; }

# TTFT by policy per trace: mean and p99, one cluster per trace.
read -r -a header < <(head -1 "$OUT/ttft.dat" | sed 's/^# //')
mean_plot="" p99_plot=""
for ((i = 1; i < ${#header[@]}; i += 2)); do
  name=${header[$i]%_mean}
  sep=$([ -n "$mean_plot" ] && echo ", " || true)
  mean_plot+="${sep}'$OUT/ttft.dat' using $((i + 1)):xtic(1) title '$name'"
  p99_plot+="${sep}'$OUT/ttft.dat' using $((i + 2)):xtic(1) title '$name'"
done
gnuplot <<GP
set terminal pngcairo size 1000,700 font ",10"
set output "$OUT/ttft.png"
set multiplot layout 2,1 title "Modeled TTFT by policy (equal CXL capacity; $(basename "$OUT"))"
set style data histograms
set style histogram clustered gap 1
set style fill solid 0.8 border -1
set grid ytics
set logscale y
set key outside right
set ylabel "mean TTFT (ms)"
plot $mean_plot
set ylabel "p99 TTFT (ms)"
plot $p99_plot
unset multiplot
GP

# Tier occupancy over time: the rule against the two-tier LRU, per trace.
traces=$(tail -n +2 "$OUT/ttft.dat" | cut -d' ' -f1)
n=$(echo "$traces" | wc -w)
{
  echo "set terminal pngcairo size 1000,$((220 * n)) font \",9\""
  echo "set output \"$OUT/occupancy.png\""
  echo "set multiplot layout $n,1 title \"Tier occupancy over trace time\""
  echo "set datafile separator ','"
  echo "set key outside right"
  echo "set grid"
  echo "set ylabel 'CXL used (fraction)'"
  echo "set yrange [0:1.05]"
  echo "set y2label 'NVMe (modeled GiB)'"
  echo "set y2tics"
  echo "set ytics nomirror"
  for t in $traces; do
    echo "set title '$t'"
    plots=()
    for p in rule lru-spill cxl-lru; do
      f="$OUT/${t}_${p}_occupancy.csv"
      [ -f "$f" ] && plots+=("'$f' using 1:3 with lines lw 2 title '$p CXL'")
    done
    for p in rule lru-spill; do
      f="$OUT/${t}_${p}_occupancy.csv"
      [ -f "$f" ] && plots+=("'$f' using 1:5 axes x1y2 with lines dt 2 title '$p NVMe'")
    done
    (IFS=,; echo "plot ${plots[*]}")
  done
  echo "unset multiplot"
} | gnuplot
echo "replay.sh: plots $OUT/ttft.png $OUT/occupancy.png"

#!/usr/bin/env bash
# The issue-7 target over many mixed traces: kv_replay on the mixed trace for every seed and
# load given, all policies, then one line per run: the rule's modeled TTFT mean and p99 against
# the best baseline of the same run and the unlimited-CXL bound's p99, and the verdict: WIN
# (mean and p99 below every baseline), floor (mean below, p99 equal to the best baseline's
# and to the bound's, which no policy can go below), or no.
#   bench/replay_sweep.sh [--seeds "1 2 3 4 5"] [--loads "0.5 0.7 1.0"] [kv_replay options...]
# Environment: CXLKV_BENCH_BUILD_DIR (default build/bench), CXLKV_REPLAY_OUT (default
# bench/results/replay-sweep; one directory per run plus sweep.txt).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${CXLKV_BENCH_BUILD_DIR:-build/bench}
OUT=${CXLKV_REPLAY_OUT:-bench/results/replay-sweep}
BIN="$BUILD/bench/kv_replay"
[ -x "$BIN" ] || { echo "replay_sweep.sh: $BIN not built (ninja -C $BUILD kv_replay)" >&2; exit 1; }
seeds="1 2 3 4 5" loads="0.5 0.7 1.0"
while [ $# -gt 0 ]; do
  case "$1" in
    --seeds) seeds=$2; shift 2 ;;
    --loads) loads=$2; shift 2 ;;
    *) break ;;
  esac
done
mkdir -p "$OUT"
for s in $seeds; do
  for l in $loads; do
    echo "replay_sweep: seed $s load $l" >&2
    "$BIN" --traces mixed --seed "$s" --load "$l" --out "$OUT/seed$s-load$l" "$@" >"$OUT/seed$s-load$l.txt"
  done
done
python3 - "$OUT" <<'PY' | tee "$OUT/sweep.txt"
import glob, json, os, sys
out = sys.argv[1]
print(f"{'run':16} {'rule mean':>10} {'best other':>22} {'diff':>7}   {'rule p99':>9} {'best other':>22} {'diff':>7} {'bound p99':>10}  verdict")
n = wins = mean_wins = p99_wins = p99_ties = floor = 0
for d in sorted(glob.glob(os.path.join(out, "seed*-load*/summary.json"))):
    doc = json.load(open(d))
    runs = {r["policy"]: r for r in doc["runs"]}
    rule = runs.pop("rule")
    bound = doc.get("bound", {}).get("mixed", {}).get("ttft_ms", {}).get("p99")
    bm = min((r["ttft_ms"]["mean"], p) for p, r in runs.items())
    bp = min((r["ttft_ms"]["p99"], p) for p, r in runs.items())
    m, p = rule["ttft_ms"]["mean"], rule["ttft_ms"]["p99"]
    at_floor = bound is not None and p <= bound
    win = m < bm[0] and p < bp[0]
    n += 1; wins += win; mean_wins += m < bm[0]; p99_wins += p < bp[0]; p99_ties += p == bp[0]
    floor += at_floor
    verdict = "WIN" if win else ("floor" if m < bm[0] and p <= bp[0] and at_floor else "no")
    btxt = f"{bound:8.1f}ms" if bound is not None else f"{'-':>10}"
    print(f"{os.path.basename(os.path.dirname(d)):16} {m:8.1f}ms {bm[0]:8.1f}ms ({bm[1]:>9}) {100 * (m / bm[0] - 1):+6.1f}%   "
          f"{p:7.1f}ms {bp[0]:8.1f}ms ({bp[1]:>9}) {100 * (p / bp[0] - 1):+6.1f}% {btxt}  {verdict}")
print(f"rule beats every baseline on mean and p99: {wins} of {n}; on mean: {mean_wins}; "
      f"on p99: {p99_wins} (ties {p99_ties}); rule p99 at the unlimited-CXL bound (no policy can "
      f"be lower): {floor}")
PY

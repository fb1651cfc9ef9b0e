#!/usr/bin/env bash
# capi_tier_before_after.sh — the C API tier's per-call cost (place, read, explain) before and
# after a change, in one run (issue #31). It builds libcxlkv (Release) at two commits, each in
# a git worktree and build directory of its own under the work directory, compiles
# bench/capi_tier_benchmark.cc from this checkout against each (the public header and
# libcxlkv.so alone, so the same source serves both), and runs the two binaries interleaved
# (before, after, before, after, ...: a drift of the machine hits both alike), each run with
# --benchmark_repetitions. It prints one table: per benchmark, the median and minimum over
# every repetition of every round for each side, after/before of the medians, and each
# round's median (how steady the machine was).
#
#   bench/capi_tier_before_after.sh [--before REV] [--after REV] [--rounds N]
#       [--repetitions K] [--filter REGEX] [--min-time S] [--work DIR] [--jobs J] [--clean]
#
#   --before REV   default 1d9835d^1: the tier before it was rebuilt over tier::TieredStore
#                  (the first parent of the merge of h-tier)
#   --after REV    default main
#   --rounds N     default 2 (A B A B)
#   --repetitions  default 5 per run
#   --filter       --benchmark_filter (default: every benchmark)
#   --min-time S   --benchmark_min_time per repetition, seconds (default 0.2)
#   --work DIR     default /tmp/cxlkv-tier-ab: worktrees src-<sha>, builds build-<sha>,
#                  binaries, results/ (the JSON of every run, kept for a closer look)
#   --jobs J       build parallelism (default 2; builds run under nice -n 10)
#   --clean        remove the work directory's worktrees and everything in it, then exit
#
# Needs git, cmake, ninja, a C++20 compiler, Google Benchmark (libbenchmark-dev) and
# /usr/bin/python3. The NVMe store of the read benchmarks lives under $TMPDIR or /tmp (it must
# be a file system with O_DIRECT; set CXLKV_BENCH_NVME_DIR to choose). A quiet machine
# matters: the script prints the load average before and after.
set -euo pipefail

before="1d9835d^1"
after="main"
rounds=2
reps=5
filter=""
min_time="0.2"
work="/tmp/cxlkv-tier-ab"
jobs=2
clean=0
while (($#)); do
  case "$1" in
    --before) before="$2"; shift 2 ;;
    --after) after="$2"; shift 2 ;;
    --rounds) rounds="$2"; shift 2 ;;
    --repetitions) reps="$2"; shift 2 ;;
    --filter) filter="$2"; shift 2 ;;
    --min-time) min_time="$2"; shift 2 ;;
    --work) work="$2"; shift 2 ;;
    --jobs) jobs="$2"; shift 2 ;;
    --clean) clean=1; shift ;;
    -h | --help) sed -n '2,32p' "$0"; exit 0 ;;
    *) echo "capi_tier_before_after.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bench_src="$repo/bench/capi_tier_benchmark.cc"
[[ -f "$bench_src" ]] || { echo "capi_tier_before_after.sh: $bench_src is missing" >&2; exit 2; }

if ((clean)); then
  for wt in "$work"/src-*; do
    [[ -d "$wt" ]] && git -C "$repo" worktree remove --force "$wt"
  done
  rm -rf "$work"
  git -C "$repo" worktree prune
  echo "removed $work"
  exit 0
fi

for tool in git cmake ninja /usr/bin/python3; do
  command -v "$tool" >/dev/null || { echo "capi_tier_before_after.sh: $tool not found" >&2; exit 2; }
done
if ! echo '#include <benchmark/benchmark.h>' | c++ -x c++ -fsyntax-only - 2>/dev/null; then
  echo "capi_tier_before_after.sh: Google Benchmark headers not found (apt-get install libbenchmark-dev)" >&2
  exit 2
fi

sha_of() {
  git -C "$repo" rev-parse --verify --quiet "$1^{commit}" ||
    { echo "capi_tier_before_after.sh: '$1' is not a commit here" >&2; exit 2; }
}
before_sha="$(sha_of "$before")"
after_sha="$(sha_of "$after")"
mkdir -p "$work/results"
launcher=()
command -v ccache >/dev/null && launcher=(-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache)

# Builds libcxlkv at $1 (a sha) and the benchmark against it; prints the binary's path.
build_side() {
  local sha="$1" name="$2"
  local short="${sha:0:12}"
  local src="$work/src-$short" build="$work/build-$short" bin="$work/capi_tier_benchmark-$name-$short"
  if [[ ! -d "$src" ]]; then
    git -C "$repo" worktree add --detach "$src" "$sha" >&2
  fi
  [[ "$(git -C "$src" rev-parse HEAD)" == "$sha" ]] ||
    { echo "capi_tier_before_after.sh: $src is not at $sha (remove it, or --clean)" >&2; exit 2; }
  if [[ ! -f "$build/build.ninja" ]]; then
    cmake -S "$src" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCXLKV_WERROR=OFF \
      -DCXLKV_BUILD_TESTS=OFF -DCXLKV_BUILD_BENCH=OFF "${launcher[@]}" >"$build.configure.log" 2>&1 ||
      { echo "capi_tier_before_after.sh: configure of $name ($short) failed: $build.configure.log" >&2; exit 1; }
  fi
  echo "building libcxlkv ($name, $short) in $build ..." >&2
  nice -n 10 cmake --build "$build" -j "$jobs" --target cxlkv >"$build.build.log" 2>&1 ||
    { echo "capi_tier_before_after.sh: build of $name ($short) failed: $build.build.log" >&2; exit 1; }
  local lib
  lib="$(dirname "$(find "$build" -name 'libcxlkv.so' -print -quit)")"
  [[ -n "$lib" ]] || { echo "capi_tier_before_after.sh: no libcxlkv.so in $build" >&2; exit 1; }
  nice -n 10 c++ -std=c++20 -O2 -DNDEBUG "$bench_src" -I "$src/include" -L "$lib" \
    -Wl,-rpath,"$lib" -lcxlkv -lbenchmark -pthread -o "$bin" >&2
  # The binary must resolve the library it was built against, not an installed one.
  ldd "$bin" | grep -q "$lib/libcxlkv.so" ||
    { echo "capi_tier_before_after.sh: $bin does not load $lib/libcxlkv.so" >&2; exit 1; }
  echo "$bin"
}

bin_before="$(build_side "$before_sha" before)"
bin_after="$(build_side "$after_sha" after)"

echo "before: $before = $before_sha ($bin_before)"
echo "after:  $after = $after_sha ($bin_after)"
echo "load before the runs: $(uptime)"
run_args=(--benchmark_repetitions="$reps" --benchmark_min_time="$min_time"
          --benchmark_format=console --benchmark_out_format=json)
[[ -n "$filter" ]] && run_args+=(--benchmark_filter="$filter")
stamp="$(date -u +%Y%m%dT%H%M%SZ)"
outs=()
for ((r = 1; r <= rounds; r++)); do
  for side in before after; do
    bin="bin_$side"
    out="$work/results/$stamp-r$r-$side.json"
    echo "round $r/$rounds: $side ..."
    "${!bin}" "${run_args[@]}" --benchmark_out="$out" >"$out.log" 2>&1 ||
      { echo "capi_tier_before_after.sh: the $side run failed: $out.log" >&2; tail -20 "$out.log" >&2; exit 1; }
    outs+=("$side:$r:$out")
  done
done
echo "load after the runs: $(uptime)"

/usr/bin/python3 - "${outs[@]}" <<'EOF'
import json, statistics, sys

# side -> name -> round -> [real_time ns of each repetition]
data = {"before": {}, "after": {}}
order = []
for arg in sys.argv[1:]:
    side, rnd, path = arg.split(":", 2)
    with open(path) as f:
        doc = json.load(f)
    for b in doc["benchmarks"]:
        if b.get("run_type") != "iteration":
            continue
        if b.get("error_occurred"):
            sys.exit(f"{path}: {b['name']}: {b.get('error_message')}")
        name = b.get("run_name", b["name"])
        if name not in order:
            order.append(name)
        scale = {"ns": 1, "us": 1e3, "ms": 1e6, "s": 1e9}[b.get("time_unit", "ns")]
        data[side].setdefault(name, {}).setdefault(int(rnd), []).append(b["real_time"] * scale)

def us(x):
    return f"{x / 1e3:9.3f}"

print()
print("per call, microseconds (real time); median and min over every repetition of every round")
hdr = f"{'benchmark':34} {'before med':>10} {'before min':>10} {'after med':>10} {'after min':>10} {'after/before':>12}  rounds' medians (before | after)"
print(hdr)
print("-" * len(hdr))
for name in order:
    b = data["before"].get(name, {})
    a = data["after"].get(name, {})
    ball = [x for r in sorted(b) for x in b[r]]
    aall = [x for r in sorted(a) for x in a[r]]
    if not ball or not aall:
        print(f"{name:34} (missing on one side)")
        continue
    bm, am = statistics.median(ball), statistics.median(aall)
    rb = " ".join(us(statistics.median(b[r])).strip() for r in sorted(b))
    ra = " ".join(us(statistics.median(a[r])).strip() for r in sorted(a))
    print(f"{name:34} {us(bm):>10} {us(min(ball)):>10} {us(am):>10} {us(min(aall)):>10} {am / bm:12.3f}  {rb} | {ra}")
EOF
echo
echo "JSON of every run: $work/results/$stamp-*.json"

#!/usr/bin/env bash
# Builds the benchmark suites (the `release` preset), runs each one with 5 repetitions and
# JSON output, and prints a table of medians. bench/RESULTS.md records a run of this script.
#
#   bench/run_benchmarks.sh [extra Google Benchmark flags, e.g. --benchmark_filter=AllocFree]
#
# Environment:
#   CXLKV_BENCH_BUILD_DIR  use this already-configured build tree instead of the preset's
#                          build/release (only the benchmark targets are built in it)
#   CXLKV_BENCH_OUT        where the JSON files go (default: <build dir>/bench-results)
#   CXLKV_BENCH_REPS       repetitions (default 5)
# Takes about 3 minutes on 2 vCPUs. Nothing else should run meanwhile: every figure is a
# median of the repetitions, but a busy machine still shifts it.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
suites=(allocator_benchmark arena_benchmark copy_benchmark)

if [[ -n ${CXLKV_BENCH_BUILD_DIR:-} ]]; then
  build=$CXLKV_BENCH_BUILD_DIR
  cmake --build "$build" --target "${suites[@]}"
else
  build=$root/build/release
  cd "$root"
  [[ -f $build/CMakeCache.txt ]] || cmake --preset release
  # Only the benchmark targets: a broken test or tool elsewhere in the tree must not stop
  # a benchmark run.
  cmake --build --preset release --target "${suites[@]}"
fi

out=${CXLKV_BENCH_OUT:-$build/bench-results}
reps=${CXLKV_BENCH_REPS:-5}
mkdir -p "$out"

# Per-suite minimum time per benchmark (seconds): the allocator pairs are nanoseconds and
# stable quickly; copies move megabytes per iteration. arena_benchmark fixes its own
# iteration counts (its untimed setup includes 1 GiB fallocates).
declare -A min_time=([allocator_benchmark]=0.1 [arena_benchmark]= [copy_benchmark]=0.5)

{
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "host: $(uname -srm), $(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2-)"
  echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
} | tee "$out/run-info.txt"

for s in "${suites[@]}"; do
  args=(--benchmark_repetitions="$reps" --benchmark_report_aggregates_only=true
        --benchmark_out="$out/$s.json" --benchmark_out_format=json)
  [[ -n ${min_time[$s]} ]] && args+=(--benchmark_min_time="${min_time[$s]}")
  echo "== $build/bench/$s ${args[*]} $*" | tee -a "$out/run-info.txt"
  "$build/bench/$s" "${args[@]}" "$@"
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$out/run-info.txt"

python3 - "$out" "${suites[@]}" <<'PY'
"""Medians from the Google Benchmark JSON files, as compact tables, and the targets."""
import json
import os
import re
import sys

out, suites = sys.argv[1], sys.argv[2:]
NS = {"ns": 1.0, "us": 1e3, "ms": 1e6, "s": 1e9}
medians, cvs, errors, contexts = {}, {}, {}, {}
for s in suites:
    path = os.path.join(out, s + ".json")
    if not os.path.exists(path) or os.path.getsize(path) == 0:
        continue  # the suite did not run, or a filter matched none of its benchmarks
    with open(path) as f:
        doc = json.load(f)
    contexts[s] = doc.get("context", {})
    for b in doc["benchmarks"]:
        name = b.get("run_name", b["name"])
        if b.get("error_occurred"):
            errors[name] = b.get("error_message", "")
        elif b.get("aggregate_name") == "median":
            medians[name] = b
        elif b.get("aggregate_name") == "cv":
            cvs[name] = b


def find(pattern):
    """Median entries whose run name matches pattern, keyed by the match groups."""
    rx = re.compile(pattern)
    found = {}
    for name, b in medians.items():
        m = rx.fullmatch(name)
        if m:
            found[m.groups()] = b
    return found


def t_ns(b, key="cpu_time"):
    return b[key] * NS[b["time_unit"]]


def cv(name, key="cpu_time"):
    c = cvs.get(name)
    return "" if c is None else f" ±{100 * c[key]:.0f}%"


def size(n):
    n = int(n)
    return f"{n >> 20} MiB" if n >= 1 << 20 else f"{n >> 10} KiB"


def table(header, rows):
    widths = [max(len(str(r[i])) for r in [header] + rows) for i in range(len(header))]
    line = lambda r: "| " + " | ".join(str(c).ljust(w) for c, w in zip(r, widths)) + " |"
    print(line(header))
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for r in rows:
        print(line(r))
    print()


targets = []
for s, ctx in contexts.items():
    keys = [k for k in ctx if k.startswith(("process_malloc", "memkind_dax", "cxlkv_arena",
                                             "active_", "cpu_copy", "destination"))]
    for k in keys:
        print(f"{s}: {k} = {ctx[k]}")
print()

# 1. alloc+free pairs: cpu ns per pair per thread.
pairs = find(r"AllocFree/([^/]+)/(\d+)/threads:(\d+)")
if pairs:
    peers = sorted({k[0] for k in pairs}, key=lambda p: (p != "cxlkv", p))
    rows = []
    for sz in sorted({int(k[1]) for k in pairs}):
        for th in sorted({k[2] for k in pairs}):
            row = [size(sz), th]
            for p in peers:
                b = pairs.get((p, str(sz), th))
                row.append("-" if b is None else f"{t_ns(b):.1f}{cv(b['run_name'])}")
            rows.append(row)
            mine = pairs.get(("cxlkv", str(sz), th))
            if mine:
                others = {p: t_ns(b) for (p, z, t), b in pairs.items()
                          if p != "cxlkv" and z == str(sz) and t == th}
                best = min(others.items(), key=lambda kv: kv[1]) if others else None
                if th == "1":
                    targets.append((f"alloc+free {size(sz)} 1T <= 4 ns", t_ns(mine) <= 4.0,
                                    f"{t_ns(mine):.2f} ns"))
                if best:
                    targets.append((f"alloc+free {size(sz)} {th}T faster than every peer",
                                    t_ns(mine) < best[1],
                                    f"cxlkv {t_ns(mine):.2f} ns vs best peer {best[0]} "
                                    f"{best[1]:.2f} ns"))
    print("## alloc+free, CPU ns per pair per thread (median ±cv)")
    table(["size", "threads"] + peers, rows)

# 2. bulk: ns per block and us per batch of 1,024.
bulk = find(r"BulkAlloc/([^/]+)/(\d+)/real_time")
if bulk:
    peers = sorted({k[0] for k in bulk}, key=lambda p: (not p.startswith("cxlkv"), p))
    rows = []
    for sz in sorted({int(k[1]) for k in bulk}):
        row = [size(sz)]
        for p in peers:
            b = bulk.get((p, str(sz)))
            if b is None:
                row.append("-")
            else:
                batch = t_ns(b, "real_time")
                row.append(f"{batch / 1024:.1f} ns / {batch / 1e3:.1f} us")
        rows.append(row)
    print("## bulk: 1,024 allocs then 1,024 frees, real time per block / per batch (median)")
    table(["size"] + peers, rows)

# 3. region create, format, open: ms.
timed = find(r"(RegionCreate|ArenaFormat|ArenaOpen)/(\w+)/(\w+)(?:/block:(\d+))?/iterations:\d+"
             r"/manual_time")
if timed:
    rows = []
    for (what, src, sz, blk), b in sorted(timed.items(),
                                          key=lambda kv: (kv[0][0], kv[0][1], kv[0][2],
                                                          int(kv[0][3] or 0))):
        rows.append([what, src, sz, size(blk) if blk else "-",
                     f"{t_ns(b, 'real_time') / 1e6:.3f}{cv(b['run_name'], 'real_time')}",
                     f"{b['region_ms']:.3f}" if "region_ms" in b else "-",
                     f"{b['teardown_ms']:.3f}"])
    print("## region / format / open, ms (median ±cv); region_ms and teardown_ms are untimed")
    table(["op", "source", "region", "block", "ms", "region_ms", "teardown_ms"], rows)

# 4. copies: GB/s and ratio to memcpy.
copies = find(r"CopyToBlock/([^/]+)/(\d+)/real_time")
if copies:
    methods = ["memcpy", "memcpy_flush", "CopyNt"] + sorted(
        {k[0] for k in copies} - {"memcpy", "memcpy_flush", "CopyNt"})
    sizes = sorted({int(k[1]) for k in copies})
    rows = []
    for m in methods:
        row = [m]
        for sz in sizes:
            b = copies.get((m, str(sz)))
            base = copies.get(("memcpy", str(sz)))
            if b is None:
                row.append("-")
                continue
            gbs = b["bytes_per_second"] / 1e9
            r = None if base is None else b["bytes_per_second"] / base["bytes_per_second"]
            ratio = "" if r is None else f" ({r:.2f}x)"
            row.append(f"{gbs:.1f}{cv(b['run_name'], 'real_time')}{ratio}")
            if m == "CopyNt" and r is not None:
                targets.append((f"CopyNt {size(sz)} >= 1.3x memcpy", r >= 1.3, f"{r:.2f}x"))
        label = next((copies[k].get("label", "") for k in copies if k[0] == m), "")
        row.append(label)
        rows.append(row)
    print("## copy into a cold block, GB/s (median ±cv of time; ratio to memcpy)")
    table(["method"] + [size(s) for s in sizes] + ["note"], rows)

# 5. metadata overhead.
meta = find(r"MetadataOverhead/memfd/(\w+)/block:(\d+)/iterations:1")
if meta:
    rows = []
    for (sz, blk), b in sorted(meta.items(), key=lambda kv: (int(kv[0][0][:-3]), int(kv[0][1]))):
        rows.append([sz, size(blk), f"{int(b['blocks'])}", f"{int(b['metadata_bytes'])}",
                     f"{b['metadata_pct']:.4f}", f"{b['slack_pct']:.4f}"])
        targets.append((f"metadata {sz} {size(blk)} <= 0.1 %", b["metadata_pct"] <= 0.1,
                        f"{b['metadata_pct']:.4f} %"))
    print("## metadata overhead (header + owner table + map + hints) as % of the region")
    table(["region", "block", "blocks", "metadata bytes", "metadata %", "slack %"], rows)

if errors:
    print("## not measured")
    for name, msg in sorted(errors.items()):
        print(f"- {name}: {msg}")
    print()

if targets:
    print("## targets")
    table(["target", "met", "measured"], [[t, "yes" if ok else "NO", v] for t, ok, v in targets])
PY

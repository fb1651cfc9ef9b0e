#!/usr/bin/env bash
# The NVMe tier against fio in one run: nvme_benchmark and fio with the same engine
# (io_uring), O_DIRECT, directory (so the same file system and device), block sizes and queue
# depths, case by case and interleaved; prints medians and the ratio cxlkv / fio. The target
# is >= 90 % of fio.
#
#   bench/nvme_vs_fio.sh [directory]      (default /var/tmp/cxlkv-nvme-bench)
#
# Environment:
#   CXLKV_BENCH_BUILD_DIR   a configured build tree with CXLKV_BUILD_BENCH=ON (default: the
#                           release preset's build/release); only nvme_benchmark is built
#   CXLKV_BENCH_OUT         where the JSON files go (default: <build dir>/bench-results)
#   CXLKV_NVME_BENCH_SECONDS  fio runtime and the benchmark's min time per case (default 5)
#   CXLKV_NVME_BENCH_MB     file size of each side, MiB (default 512; the disk is shared)
#   CXLKV_NVME_BENCH_REPS   interleaved repetitions of every case (default 3): medians reported
# Pairs: cxlkv NvmeWrite (new blocks into free slots) vs fio randwrite, NvmeRead vs fio
# randread, both at QD 32; NvmeReadLatency vs fio randread at QD 1: the wall time of one
# synchronous Get against fio's total latency (lat = slat + clat; fio's io_uring_enter hands
# the read to the device, so clat alone leaves out part of what a Get waits for; clat is
# printed beside it).
# cxlkv counts payload bytes only; each of its writes also carries a 4 KiB slot header.
#
# The limit: where the kernel has 2 MiB huge pages free (sysctl vm.nr_hugepages=8 or more;
# the script does not change the machine), every QD 1 case also runs fio with its buffer in
# them (--iomem=shmhuge), a read with no per-page cost in the buffer: what the disk itself
# takes. The store stages reads through such pages where that is faster (docs/nvme.md, "Read
# staging"), so against fio's default buffer it can beat fio; the limit row says by how much
# anything could.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
dir=${1:-/var/tmp/cxlkv-nvme-bench}
secs=${CXLKV_NVME_BENCH_SECONDS:-5}
reps=${CXLKV_NVME_BENCH_REPS:-3}
mb=${CXLKV_NVME_BENCH_MB:-512}
command -v fio >/dev/null || { echo "fio not found: apt-get install fio (scripts/deps)" >&2; exit 1; }

if [[ -n ${CXLKV_BENCH_BUILD_DIR:-} ]]; then
  build=$CXLKV_BENCH_BUILD_DIR
else
  build=$root/build/release
  [[ -f $build/CMakeCache.txt ]] || (cd "$root" && cmake --preset release)
fi
cmake --build "$build" --target nvme_benchmark
out=${CXLKV_BENCH_OUT:-$build/bench-results}
mkdir -p "$out" "$dir"
trap 'rm -rf "$dir/store" "$dir"/fio-*.dat' EXIT

{
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "host: $(uname -srm), $(nproc) CPUs"
  echo "directory: $dir on $(df --output=source,fstype "$dir" | tail -1)"
  echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
} | tee "$out/nvme-run-info.txt"

# Interleaved: per case and repetition, one side then the other (the order alternates), so
# a drift of the shared disk or of the host's cache hits both sides alike.
cases=()
for bs in 65536 262144 2097152; do
  cases+=("randwrite $bs 32 NvmeWrite/$bs/qd:32" "randread $bs 32 NvmeRead/$bs/qd:32")
  [[ $bs -le 262144 ]] && cases+=("randread $bs 1 NvmeReadLatency/$bs/qd:1")
done
run_cxlkv() {  # name rep
  local cmd=("$build/bench/nvme_benchmark" --benchmark_min_time="$secs"
             --benchmark_filter="^$1/" --benchmark_out="$out/cxlkv-${1//\//_}-$2.json"
             --benchmark_out_format=json)
  echo "== CXLKV_NVME_BENCH_DIR=$dir/store CXLKV_NVME_BENCH_MB=$mb ${cmd[*]}" >>"$out/nvme-run-info.txt"
  CXLKV_NVME_BENCH_DIR="$dir/store" CXLKV_NVME_BENCH_MB="$mb" "${cmd[@]}" >/dev/null
}
run_fio() {  # rw bs qd rep
  local fio_cmd=(fio --name="$1-$2-$3" --directory="$dir" --filename="fio-$2.dat" --size="${mb}M"
                 --ioengine=io_uring --direct=1 --rw="$1" --bs="$2" --iodepth="$3"
                 --time_based --runtime="$secs" --ramp_time=1 --randrepeat=0 --lat_percentiles=1 --output-format=json)
  echo "== ${fio_cmd[*]}" >>"$out/nvme-run-info.txt"
  "${fio_cmd[@]}" >"$out/fio-$1-$2-$3-$4.json"
}
run_fio_huge() {  # bs rep: QD 1 randread with the buffer in 2 MiB huge pages
  local fio_cmd=(fio --name="huge-$1" --directory="$dir" --filename="fio-$1.dat" --size="${mb}M"
                 --ioengine=io_uring --direct=1 --rw=randread --bs="$1" --iodepth=1
                 --iomem=shmhuge --hugepage-size=2m
                 --time_based --runtime="$secs" --ramp_time=1 --randrepeat=0 --lat_percentiles=1 --output-format=json)
  echo "== ${fio_cmd[*]}" >>"$out/nvme-run-info.txt"
  "${fio_cmd[@]}" >"$out/fio-huge-$1-$2.json"
}
huge_free=$(awk '/^HugePages_Free:/ {print $2}' /proc/meminfo)
if ((${huge_free:-0} >= 8)) && [[ $(awk '/^Hugepagesize:/ {print $2}' /proc/meminfo) == 2048 ]]; then
  huge=1
else
  huge=0
  echo "no fio limit rows: ${huge_free:-0} huge pages free (sysctl vm.nr_hugepages=8 gives them)" |
    tee -a "$out/nvme-run-info.txt"
fi
for ((rep = 1; rep <= reps; rep++)); do
  for c in "${cases[@]}"; do
    read -r rw bs qd name <<<"$c"
    echo "rep $rep/$reps: $name vs fio $rw bs=$bs iodepth=$qd" >&2
    if ((rep % 2)); then
      run_cxlkv "$name" "$rep"; run_fio "$rw" "$bs" "$qd" "$rep"
      ((huge && qd == 1)) && run_fio_huge "$bs" "$rep"
    else
      ((huge && qd == 1)) && run_fio_huge "$bs" "$rep"
      run_fio "$rw" "$bs" "$qd" "$rep"; run_cxlkv "$name" "$rep"
    fi
  done
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$out/nvme-run-info.txt"

python3 - "$out" "$reps" <<'PY'
import json, os, statistics, sys
out, reps = sys.argv[1], int(sys.argv[2])

def cxlkv(name, rep):
    path = os.path.join(out, f"cxlkv-{name.replace('/', '_')}-{rep}.json")
    if not os.path.exists(path):  # a case not run (no QD 1 latency at 2 MiB)
        return None
    with open(path) as f:
        for b in json.load(f)["benchmarks"]:
            if b["name"].startswith(name) and not b.get("error_occurred"):
                return b
    return None

def fio(rw, bs, qd, rep, name=None):
    path = os.path.join(out, name or f"fio-{rw}-{bs}-{qd}-{rep}.json")
    if name is not None and not os.path.exists(path):
        return None
    with open(path) as f:
        job = json.load(f)["jobs"][0]
    side = job["write" if "write" in rw else "read"]
    # lat = slat + clat: from fio's submit to its completion, the span a synchronous Get has
    # (clat alone leaves out the io_uring_enter that hands the read to the device).
    lat = side["lat_ns"]
    return side["bw_bytes"], lat["mean"] / 1e3, lat.get("percentile", {}), side["clat_ns"]["mean"] / 1e3

med = statistics.median

def size(n):
    n = int(n)
    return f"{n >> 20} MiB" if n >= 1 << 20 else f"{n >> 10} KiB"

rows, per_rep = [], []
for bs in (65536, 262144, 2097152):
    for kind, rw in (("NvmeWrite", "randwrite"), ("NvmeRead", "randread")):
        name = f"{kind}/{bs}/qd:32"
        mine, theirs, ratio = [], [], []
        for rep in range(1, reps + 1):
            b = cxlkv(name, rep)
            if b is None:
                continue
            f_bw = fio(rw, bs, 32, rep)[0]
            mine.append(b["bytes_per_second"]); theirs.append(f_bw)
            ratio.append(b["bytes_per_second"] / f_bw)
        if not mine:
            continue
        rows.append([f"{kind[4:].lower()} bandwidth", size(bs), "32",
                     f"{med(mine) / 1e6:.0f} MB/s", f"{med(theirs) / 1e6:.0f} MB/s",
                     f"{100 * med(ratio):.0f} % ({100 * min(ratio):.0f}-{100 * max(ratio):.0f})"])
    name = f"NvmeReadLatency/{bs}/qd:1"
    mine, theirs, ratio, p50, p99, fp50, fp99, fclat = [], [], [], [], [], [], [], []
    limit, lratio = [], []
    for rep in range(1, reps + 1):
        b = cxlkv(name, rep)
        if b is None:
            continue
        us = b["real_time"] * {"ns": 1e-3, "us": 1, "ms": 1e3}[b["time_unit"]]
        _, f_us, pct, f_clat = fio("randread", bs, 1, rep)
        mine.append(us); theirs.append(f_us); ratio.append(f_us / us); fclat.append(f_clat)
        p50.append(b["p50_us"]); p99.append(b["p99_us"])
        fp50.append(pct.get("50.000000", 0) / 1e3); fp99.append(pct.get("99.000000", 0) / 1e3)
        h = fio("randread", bs, 1, rep, f"fio-huge-{bs}-{rep}.json")
        if h is not None:
            limit.append(h[1]); lratio.append(h[1] / us)
    if mine:
        rows.append(["read latency (mean)", size(bs), "1", f"{med(mine):.0f} us",
                     f"{med(theirs):.0f} us (clat {med(fclat):.0f})",
                     f"{100 * med(ratio):.0f} % ({100 * min(ratio):.0f}-{100 * max(ratio):.0f}) (fio/cxlkv)"])
        rows.append(["read latency p50 / p99", size(bs), "1",
                     f"{med(p50):.0f} / {med(p99):.0f} us", f"{med(fp50):.0f} / {med(fp99):.0f} us",
                     ""])
        per_rep.append(f"QD 1 {size(bs)}, fio / cxlkv per repetition: "
                       + " / ".join(f"{100 * r:.1f}" for r in ratio) + " %")
        if limit:
            rows.append(["read latency, fio buffer in 2 MiB pages (limit)", size(bs), "1", "",
                         f"{med(limit):.0f} us",
                         f"{100 * med(lratio):.0f} % ({100 * min(lratio):.0f}-{100 * max(lratio):.0f}) (limit/cxlkv)"])
            per_rep.append(f"QD 1 {size(bs)}, limit / cxlkv per repetition: "
                           + " / ".join(f"{100 * r:.1f}" for r in lratio) + " %")
print(f"medians of {reps} interleaved repetitions; the ratio is the median of the per-repetition "
      "ratios (min-max in brackets)")
head = ["case", "block", "QD", "cxlkv", "fio", "cxlkv vs fio"]
w = [max(len(str(r[i])) for r in [head] + rows) for i in range(len(head))]
line = lambda r: "| " + " | ".join(str(c).ljust(x) for c, x in zip(r, w)) + " |"
print(line(head))
print("|" + "|".join("-" * (x + 2) for x in w) + "|")
for r in rows:
    print(line(r))
for p in per_rep:
    print(p)
PY

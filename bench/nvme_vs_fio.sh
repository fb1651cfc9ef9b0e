#!/usr/bin/env bash
# The NVMe tier against fio in one run: nvme_benchmark, then fio with the same engine
# (io_uring), O_DIRECT, directory (so the same file system and device), block sizes and queue
# depths; prints both and the ratio cxlkv / fio. The target is >= 90 % of fio.
#
#   bench/nvme_vs_fio.sh [directory]      (default /var/tmp/cxlkv-nvme-bench)
#
# Environment:
#   CXLKV_BENCH_BUILD_DIR   a configured build tree with CXLKV_BUILD_BENCH=ON (default: the
#                           release preset's build/release); only nvme_benchmark is built
#   CXLKV_BENCH_OUT         where the JSON files go (default: <build dir>/bench-results)
#   CXLKV_NVME_BENCH_SECONDS  fio runtime and the benchmark's min time per case (default 5)
#   CXLKV_NVME_BENCH_MB     file size of each side, MiB (default 512; the disk is shared)
# Pairs: cxlkv NvmeWrite (new blocks into free slots) vs fio randwrite, NvmeRead vs fio
# randread, both at QD 32; NvmeReadLatency vs fio randread at QD 1 (mean completion latency).
# cxlkv counts payload bytes only; each of its I/Os also carries a 4 KiB slot header.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
dir=${1:-/var/tmp/cxlkv-nvme-bench}
secs=${CXLKV_NVME_BENCH_SECONDS:-5}
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

cmd=("$build/bench/nvme_benchmark" --benchmark_min_time="$secs"
     --benchmark_out="$out/nvme_benchmark.json" --benchmark_out_format=json)
echo "== CXLKV_NVME_BENCH_DIR=$dir/store CXLKV_NVME_BENCH_MB=$mb ${cmd[*]}" |
  tee -a "$out/nvme-run-info.txt"
CXLKV_NVME_BENCH_DIR="$dir/store" CXLKV_NVME_BENCH_MB="$mb" "${cmd[@]}"

cases=()
for bs in 65536 262144 2097152; do
  cases+=("randwrite $bs 32" "randread $bs 32")
  [[ $bs -le 262144 ]] && cases+=("randread $bs 1")
done
for c in "${cases[@]}"; do
  read -r rw bs qd <<<"$c"
  fio_cmd=(fio --name="$rw-$bs-$qd" --directory="$dir" --filename="fio-$bs.dat" --size="${mb}M"
           --ioengine=io_uring --direct=1 --rw="$rw" --bs="$bs" --iodepth="$qd"
           --time_based --runtime="$secs" --ramp_time=1 --randrepeat=0 --output-format=json)
  echo "== ${fio_cmd[*]}" | tee -a "$out/nvme-run-info.txt"
  "${fio_cmd[@]}" >"$out/fio-$rw-$bs-$qd.json"
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$out/nvme-run-info.txt"

python3 - "$out" <<'PY'
import json, os, sys
out = sys.argv[1]
with open(os.path.join(out, "nvme_benchmark.json")) as f:
    bench = {b["name"]: b for b in json.load(f)["benchmarks"]}

def fio(rw, bs, qd):
    with open(os.path.join(out, f"fio-{rw}-{bs}-{qd}.json")) as f:
        job = json.load(f)["jobs"][0]
    side = job["write" if "write" in rw else "read"]
    return side["bw_bytes"], side["clat_ns"]["mean"] / 1e3, side["clat_ns"].get("percentile", {})

def size(n):
    n = int(n)
    return f"{n >> 20} MiB" if n >= 1 << 20 else f"{n >> 10} KiB"

rows = []
for bs in (65536, 262144, 2097152):
    for kind, rw in (("NvmeWrite", "randwrite"), ("NvmeRead", "randread")):
        b = bench.get(f"{kind}/{bs}/qd:32/real_time")
        if b is None or b.get("error_occurred"):
            continue
        mine = b["bytes_per_second"]
        theirs, _, _ = fio(rw, bs, 32)
        rows.append([f"{kind[4:].lower()} bandwidth", size(bs), "32",
                     f"{mine / 1e6:.0f} MB/s", f"{theirs / 1e6:.0f} MB/s",
                     f"{100 * mine / theirs:.0f} %"])
    b = bench.get(f"NvmeReadLatency/{bs}/qd:1/real_time")
    if b is not None and not b.get("error_occurred"):
        mine_us = b["real_time"] * {"ns": 1e-3, "us": 1, "ms": 1e3}[b["time_unit"]]
        _, theirs_us, pct = fio("randread", bs, 1)
        rows.append(["read latency (mean)", size(bs), "1", f"{mine_us:.0f} us",
                     f"{theirs_us:.0f} us", f"{100 * theirs_us / mine_us:.0f} % (fio/cxlkv)"])
        rows.append(["read latency p50 / p99", size(bs), "1",
                     f"{b['p50_us']:.0f} / {b['p99_us']:.0f} us",
                     f"{pct.get('50.000000', 0) / 1e3:.0f} / {pct.get('99.000000', 0) / 1e3:.0f} us",
                     ""])
head = ["case", "block", "QD", "cxlkv", "fio", "cxlkv vs fio"]
w = [max(len(str(r[i])) for r in [head] + rows) for i in range(len(head))]
line = lambda r: "| " + " | ".join(str(c).ljust(x) for c, x in zip(r, w)) + " |"
print(line(head))
print("|" + "|".join("-" * (x + 2) for x in w) + "|")
for r in rows:
    print(line(r))
PY

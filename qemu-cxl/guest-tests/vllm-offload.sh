#!/bin/sh
# vllm-offload: modern vLLM's CPU KV offload region lands on the CXL node with no change to
# the engine. Two workers of vllm_offload (tests/preload/vllm_offload.cc: create or wait,
# ftruncate, mmap MAP_SHARED, MADV_POPULATE_WRITE, cudaHostRegister, write and check every
# slice) run under the preload shim with CXLKV_POOL=kmem:node=N and CXLKV_SHM naming their
# /dev/shm file; move_pages must find every page of the region on node N and its policy must
# be MPOL_BIND to N. A third run without CXLKV_SHM is the control: its pages are not on N.
# When the device is still in devdax mode (nothing onlined it yet), first the same workers with
# CXLKV_POOL=devdax:/dev/daxX.Y: the file's pages stay unused (st_blocks 0), the pool's arena
# shows the extent persisted while they run (cxlkvctl arena info) and free after; the region
# (7 MiB) is not a multiple of the device alignment, so the extent, the mapping and the
# workers' munmap all take the rounding.
# Then the kmem part needs the device onlined as system RAM: it does that itself unless an
# earlier test (kmem) or --kmem did, so run it after kmem or alone.
# needs: vllm_offload libcxlkv_preload.so cxlkvctl
set -eu
out="${CXLKV_OUT:-/tmp}"
shim="$CXLKV_BIN/libcxlkv_preload.so"
# The guest's /dev is a devtmpfs without /dev/shm: give it the tmpfs a distribution mounts.
if ! grep -q " /dev/shm " /proc/mounts; then
  mkdir -p /dev/shm
  mount -t tmpfs tmpfs /dev/shm
fi

# Bytes of the pool's blocks that are persisted (what CXLKV_SHM extents hold).
persisted_bytes() {
  "$CXLKV_BIN/cxlkvctl" arena info "$1" --json | tr -d ' \n' |
    grep -o '"persisted":[0-9]*,"stride_bytes":[0-9]*' |
    awk -F'[:,]' '{ s += $2 * $4 } END { print s + 0 }'
}

# Still in devdax mode? (Onlined as system RAM, the character device stays but is bound to the
# kmem driver and cannot be opened.)
dax_driver="$(readlink "/sys/bus/dax/devices/$(basename "${CXLKV_DAX:-none}")/driver" 2>/dev/null || true)"
if [ -z "${CXLKV_KMEM_NODE:-}" ] && [ "${dax_driver##*/}" = device_dax ]; then
  spec="devdax:$CXLKV_DAX"
  dir="$out/vllm-offload-devdax"
  rm -rf "$dir"; mkdir -p "$dir/barrier"
  file=/dev/shm/vllm_offload_guest_dax.mmap
  dbytes=$((7 << 20))
  echo "+ two workers under the shim, CXLKV_POOL=$spec CXLKV_SHM=/dev/shm/vllm_offload_* ($dbytes bytes)"
  for rank in 0 1; do
    env LD_PRELOAD="$shim" CXLKV_POOL="$spec" CXLKV_SHM='/dev/shm/vllm_offload_*' CXLKV_LOG=info \
      "$CXLKV_BIN/vllm_offload" "$file" "$dbytes" --rank "$rank" --world 2 \
      --barrier "$dir/barrier" --hold "$dir/release" > "$dir/out.$rank" 2> "$dir/err.$rank" &
    eval "dpid$rank=\$!"
    [ "$rank" = 0 ] && sleep 1
  done
  i=0
  until grep -q "vllm_offload: {" "$dir/out.0" 2>/dev/null &&
        grep -q "vllm_offload: {" "$dir/out.1" 2>/dev/null; do
    i=$((i + 1))
    [ "$i" -gt 240 ] && { cat "$dir"/err.*; echo "vllm-offload: FAIL: devdax workers did not report"; exit 1; }
    sleep 0.5
  done
  cat "$dir/out.0" "$dir/out.1"
  grep -q '"data_ok": true' "$dir/out.0" && grep -q '"data_ok": true' "$dir/out.1" ||
    { cat "$dir"/err.*; echo "vllm-offload: FAIL: devdax: a worker read other bytes back"; exit 1; }
  # Device-DAX pages are no node's RAM: move_pages reports an error for each (-ENOENT), where a
  # tmpfs page would report node 0.
  grep -q '"nodes": {"-[0-9]*": [0-9]*}' "$dir/out.0" ||
    { cat "$dir"/err.*; echo "vllm-offload: FAIL: devdax: the region's pages are ordinary RAM"; exit 1; }
  fblocks="$(stat -c %b "$file")"
  held="$(persisted_bytes "$spec")"
  echo "devdax: the file has $fblocks blocks of its own; the pool holds $held persisted bytes"
  [ "$fblocks" = 0 ] ||
    { cat "$dir"/err.*; echo "vllm-offload: FAIL: devdax: the /dev/shm file got pages"; exit 1; }
  [ "$held" -ge "$dbytes" ] ||
    { cat "$dir"/err.*; echo "vllm-offload: FAIL: devdax: the pool does not hold the region ($held bytes)"; exit 1; }
  touch "$dir/release"
  rc=0
  wait "$dpid0" || rc=1
  wait "$dpid1" || rc=1
  cat "$dir"/err.* >&2
  [ "$rc" = 0 ] || { echo "vllm-offload: FAIL: devdax: a worker failed (munmap of the rounded mapping?)"; exit 1; }
  left="$(persisted_bytes "$spec")"
  [ "$left" = 0 ] ||
    { echo "vllm-offload: FAIL: devdax: $left bytes still persisted after the workers exit"; exit 1; }
  [ -z "$(ls -a /dev/shm | grep '\.cxlkv$' || true)" ] ||
    { echo "vllm-offload: FAIL: devdax: a binding record was left in /dev/shm"; exit 1; }
  echo "vllm-offload: devdax ok: the region lived in $spec and was freed after"
fi

node="${CXLKV_KMEM_NODE:-}"
if [ -z "$node" ]; then
  # Onlined by the kmem test of this run: the CPU-less node with memory.
  for d in /sys/devices/system/node/node[0-9]*; do
    [ -z "$(cat "$d/cpulist")" ] && grep -q "MemTotal: *[1-9]" "$d/meminfo" && node="${d##*node}"
  done
fi
if [ -z "$node" ]; then
  dev="${CXLKV_DAX:?}"
  echo "+ daxctl reconfigure-device --mode=system-ram ${dev#/dev/}"
  node="$(daxctl reconfigure-device --mode=system-ram "${dev#/dev/}" |
          sed -n 's/.*"target_node":\([0-9]*\).*/\1/p' | head -n 1)"
fi
[ -n "$node" ] || { echo "vllm-offload: FAIL: no kmem NUMA node"; exit 1; }
bytes=$((8 << 20))

# run TAG EXPECT_NODE ENV...: two workers of one region; prints their summaries.
run() {
  tag="$1"; expect="$2"; shift 2
  dir="$out/vllm-offload-$tag"
  rm -rf "$dir"; mkdir -p "$dir/barrier"
  file="/dev/shm/vllm_offload_guest_$tag.mmap"
  for rank in 0 1; do
    env "$@" "$CXLKV_BIN/vllm_offload" "$file" "$bytes" --rank "$rank" --world 2 \
      --barrier "$dir/barrier" $expect > "$dir/out.$rank" 2> "$dir/err.$rank" &
    eval "pid$rank=\$!"
    [ "$rank" = 0 ] && sleep 1
  done
  rc=0
  wait "$pid0" || rc=1
  wait "$pid1" || rc=1
  cat "$dir/out.0" "$dir/out.1"
  cat "$dir/err.0" "$dir/err.1" >&2
  return "$rc"
}

echo "+ two workers under the shim, CXLKV_POOL=kmem:node=$node CXLKV_SHM=/dev/shm/vllm_offload_*"
run shim "--expect-node $node" LD_PRELOAD="$shim" CXLKV_POOL="kmem:node=$node" \
  CXLKV_SHM='/dev/shm/vllm_offload_*' CXLKV_LOG=info ||
  { echo "vllm-offload: FAIL: the region is not all on node $node (or a worker failed)"; exit 1; }
grep -q "\"policy\": \"bind:$node\"" "$out/vllm-offload-shim/out.0" ||
  { echo "vllm-offload: FAIL: the region's policy is not MPOL_BIND to node $node"; exit 1; }
grep -q "bound to node $node" "$out/vllm-offload-shim/err.0" "$out/vllm-offload-shim/err.1" ||
  { echo "vllm-offload: FAIL: the shim did not log the binding"; exit 1; }

echo "+ control: the same without CXLKV_SHM"
run control "" LD_PRELOAD="$shim" CXLKV_POOL="kmem:node=$node" ||
  { echo "vllm-offload: FAIL: the control run failed"; exit 1; }
if grep -q "\"nodes\": {\"$node\": " "$out/vllm-offload-control/out.0" &&
   ! grep -q "\"nodes\": {\"$node\": [0-9]*, " "$out/vllm-offload-control/out.0"; then
  echo "vllm-offload: FAIL: without CXLKV_SHM the region is on node $node too: the check proves nothing"
  exit 1
fi
echo "vllm-offload: ok: 2 workers' 8 MiB region on kmem node $node under the shim, elsewhere without it"

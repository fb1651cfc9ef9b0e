#!/bin/sh
# kmem: the CXL dax device onlined as system RAM becomes a CPU-less NUMA node; cxlkvctl lists
# it as a kmem source, memkind's MEMKIND_DAX_KMEM and a kmem:node=N arena allocate there.
# Reconfigures the device itself unless the run was started with --kmem, so run it last.
# needs: cxlkvctl cxlkv-guest-kmem
set -eu
node="${CXLKV_KMEM_NODE:-}"
if [ -z "$node" ]; then
  dev="${CXLKV_DAX:?}"
  echo "+ daxctl reconfigure-device --mode=system-ram ${dev#/dev/}"
  out="$(daxctl reconfigure-device --mode=system-ram "${dev#/dev/}")"
  echo "$out"
  node="$(echo "$out" | sed -n 's/.*"target_node":\([0-9]*\).*/\1/p' | head -n 1)"
fi
[ -n "$node" ] || { echo "kmem: FAIL: no target node"; exit 1; }
"$CXLKV_BIN/cxlkvctl" topology --json > "${CXLKV_OUT:-/tmp}/topology-kmem.json"
grep -q "\"kmem:node=$node\"" "${CXLKV_OUT:-/tmp}/topology-kmem.json" ||
  { echo "kmem: FAIL: cxlkvctl topology does not list kmem:node=$node"; exit 1; }
"$CXLKV_BIN/cxlkvctl" topology
# The preload shim on the kmem node: an unmodified multithreaded program's large allocations
# go to memkind's MEMKIND_DAX_KMEM kind on node $node (proved by the shim's own stats).
if [ -x "$CXLKV_BIN/preload_stress" ] && [ -e "$CXLKV_BIN/libcxlkv_preload.so" ]; then
  stats="${CXLKV_OUT:-/tmp}/preload-kmem.json"
  echo "+ LD_PRELOAD=libcxlkv_preload.so CXLKV_POOL=kmem:node=$node preload_stress 2 60 7"
  LD_PRELOAD="$CXLKV_BIN/libcxlkv_preload.so" CXLKV_POOL="kmem:node=$node" CXLKV_MIN_BYTES=4096 \
    CXLKV_STATS="$stats" CXLKV_LOG=info "$CXLKV_BIN/preload_stress" 2 60 7 ||
    { echo "kmem: FAIL: preload_stress under the shim on kmem:node=$node"; exit 1; }
  cxl="$(tr -d ' \n' < "$stats" | sed -n 's/.*"malloc":{"pass":{[^}]*},"cxl":{"allocs":\([0-9]*\).*/\1/p')"
  echo "kmem: preload_stress under the shim: ${cxl:-0} malloc allocations served from kmem:node=$node"
  [ "${cxl:-0}" -gt 0 ] || { echo "kmem: FAIL: no allocation reached the kmem node"; cat "$stats"; exit 1; }
fi
exec "$CXLKV_BIN/cxlkv-guest-kmem" "$node"

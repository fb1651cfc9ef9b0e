#!/bin/sh
# kmem: the CXL dax device onlined as system RAM becomes a CPU-less NUMA node; cxlkvctl lists
# it as a kmem source, memkind's MEMKIND_DAX_KMEM and a kmem:node=N arena allocate there.
# Reconfigures the device itself unless the run was started with --kmem, so run it last.
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
exec "$CXLKV_BIN/cxlkv-guest-kmem" "$node"

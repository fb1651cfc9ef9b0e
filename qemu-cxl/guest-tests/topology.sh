#!/bin/sh
# topology: `cxlkvctl topology --json` agrees with `cxl list` and `daxctl list` on memdevs,
# regions and dax devices, and classifies the devdax source as the topology expects
# (CXLKV_EXPECT_CLASS: expanded or switch-pooled). On a shared topology the operator
# declares the device shared, as a config would.
# needs: cxlkvctl cxlkv-guest-topocheck
set -u
out="${CXLKV_OUT:-/tmp}"
cxl list -M > "$out/memdevs.json" || exit 1
cxl list -R > "$out/regions.json" || exit 1
daxctl list > "$out/daxctl.json" || exit 1
declared=""
[ "${CXLKV_SHARED:-0}" = 1 ] && declared="--declared-shared devdax:$CXLKV_DAX"
# shellcheck disable=SC2086  # $declared is an option and its value, or nothing
"$CXLKV_BIN/cxlkvctl" topology --json $declared > "$out/topology.json" || exit 1
"$CXLKV_BIN/cxlkvctl" topology $declared
exec "$CXLKV_BIN/cxlkv-guest-topocheck" "$out/memdevs.json" "$out/regions.json" \
  "$out/daxctl.json" "$out/topology.json" "${CXLKV_EXPECT_CLASS:?}"

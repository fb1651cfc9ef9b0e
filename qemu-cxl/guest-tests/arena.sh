#!/bin/sh
# arena: a KV arena on the real /dev/daxX.Y: format honouring the device alignment, allocate,
# copy with streaming stores and read back, misuse detection, two processes at once, kill -9
# and recovery; then `cxlkvctl arena info` and the KV workload driver on the same device.
# needs: cxlkvctl cxlkv-guest-pool cxlkv-workload
set -eu
spec="devdax:${CXLKV_DAX:?}"
"$CXLKV_BIN/cxlkv-guest-pool" devdax "$spec"
"$CXLKV_BIN/cxlkvctl" arena info "$spec"
# A small layout (4 KiB blocks) keeps the data volume within what TCG's MMIO emulation moves.
"$CXLKV_BIN/cxlkv-workload" --pool "$spec" --format --force --layout L=1,H=1,D=64,B=2,T=16 \
  --procs 2 --seconds 2 --fill-bytes 64

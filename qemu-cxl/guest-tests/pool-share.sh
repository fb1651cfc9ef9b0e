#!/bin/sh
# pool-share (two-host): guest a formats an arena on the shared device and publishes blocks
# (written with streaming stores, persisted, map flushed); guest b waits for that arena,
# opens it read-only and reads every published block by BlockRef, checking its content and
# that its generation did not change while it was read.
# needs: cxlkv-guest-pool
set -eu
spec="devdax:${CXLKV_DAX:?}"
case "${CXLKV_ROLE:-}" in
  a) exec "$CXLKV_BIN/cxlkv-guest-pool" publish "$spec" 16 ;;
  b) exec "$CXLKV_BIN/cxlkv-guest-pool" consume "$spec" 16 90 ;;
  *) echo "pool-share: needs the two-host topology (role a or b)"; exit 77 ;;
esac

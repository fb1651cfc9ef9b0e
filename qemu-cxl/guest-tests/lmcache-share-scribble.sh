#!/bin/sh
# lmcache-share-scribble (two-host; by hand, not a default test): the negative check of
# lmcache-share. The same run, except that guest b corrupts 3 of guest a's objects between
# a's publish and b's read (the kit's --scribble 3). Passes only if lmcache-share fails the
# way it must: on b, role b NOT QUALIFIED with exactly 3 of a's objects corrupt; on a, role a
# QUALIFIED and the test failing on b's verdict.
#   qemu-cxl/run two-host lmcache-share-scribble
# needs: cxlkv-orchestrator liblmcache_shared_l1_visibility.so
set -u
out="${CXLKV_OUT:-/tmp}"
case "${CXLKV_ROLE:-}" in
  a|b) ;;
  *) echo "lmcache-share-scribble: needs the two-host topology (role a or b)"; exit 77 ;;
esac
LMCACHE_SHARE_NAME=lmcache-share-scribble LMCACHE_SHARE_SCRIBBLE=3 \
  sh "$(dirname "$0")/lmcache-share.sh" >"$out/lmcache-share.out" 2>&1
rc=$?
sed 's/^/  | /' "$out/lmcache-share.out"
fail() { echo "lmcache-share-scribble: FAIL: $*"; exit 1; }
[ "$rc" = 1 ] || fail "lmcache-share exited $rc with 3 of a's objects scribbled on; expected 1"
report="$out/qualify-$CXLKV_ROLE.json"
if [ "$CXLKV_ROLE" = b ]; then
  grep -q '"result": "FAIL"' "$report" || fail "role b's visibility gate did not fail ($report)"
  grep -q '"corrupt": 3,' "$report" || fail "role b should count 3 corrupt objects ($report)"
  grep -q 'role b is NOT QUALIFIED' "$out/lmcache-share.out" || fail "the failure is not role b's"
else
  grep -q '"result": "pass"' "$report" || fail "role a should pass: b's objects are intact ($report)"
  grep -q 'guest b: role b is NOT QUALIFIED' "$out/lmcache-share.out" ||
    fail "guest a's test should fail on guest b's verdict"
fi
echo "lmcache-share-scribble: OK: lmcache-share failed as it must (role $CXLKV_ROLE)"

#!/bin/sh
# lmcache-share (two-host): LMCache's shared-L1 qualification kit (tools/lmcache-qualify,
# docs/lmcache.md "Qualification") across the two guests, one role each, through the real
# visibility library and a real coordinator on the shared /dev/dax0.0.
#
# Guest a runs cxlkv-orchestrator with [lmcache] (the coordinator on CXLKV_NET_ADDR:9400, one
# token, mode 600): the domain's pool is 32 MiB of the device at 128 MiB (2 extents of 16 MiB),
# the coordinator's region its last extent (device bytes 144..160 MiB), the prefix domain the
# 4 MiB after the pool; nothing the earlier two-host tests use (pool-share's arena spans the
# device, but b has left it before it says it started this test; lease-share stays below
# 96 MiB + 64 bytes). Each guest then runs the kit's visibility gate in its role
# (`--role a` / `--role b`, one run id): writes and publishes its objects through
# liblmcache_shared_l1_visibility.so, then looks up, acquires, reads and checks every one of
# the other guest's. Each role's --json report comes back as results/<guest>/lmcache-share/
# qualify-<role>.json. The guests exchange messages through the shared device (daxio, a
# 64-byte slot each at 168 MiB): b says it started, a says its coordinator serves, b gives its
# verdict, then a gives its own once it has read b's (so b, going on to another test, never
# overwrites its verdict unread); the test fails on both guests if either role is NOT
# QUALIFIED.
#
# QEMU shares the device's memory coherently (one host file): this shows that the kit, the
# library and the coordinator agree on the mapping, the layout and the wire across two kernels
# and two address spaces, not that the library's cache flushes are needed or enough (the
# simulator seam, "The kit over the non-coherence simulator's seam", shows that).
#
# LMCACHE_SHARE_SCRIBBLE=N (set by lmcache-share-scribble.sh, the negative check): guest b
# corrupts N of a's objects between a's publish and its own read (the kit's --scribble).
# LMCACHE_SHARE_LIBRARY=PATH: another visibility library under test (default: the real one).
# needs: cxlkv-orchestrator liblmcache_shared_l1_visibility.so
# shellcheck disable=SC2317  # the small predicates below run through wait_until
set -u
name="${LMCACHE_SHARE_NAME:-lmcache-share}"
scribble="${LMCACHE_SHARE_SCRIBBLE:-0}"
out="${CXLKV_OUT:-/tmp}"
work="/tmp/$name"
mkdir -p "$work"
MiB=1048576
port=9400
pool_off=$((128 * MiB))
pool_len=$((32 * MiB))
region_len=$((16 * MiB))
dom_off=$((pool_off + pool_len))
dom_len=$((4 * MiB))
mark_off=$((dom_off + dom_len + 4 * MiB))   # a's slot; b's is 4 KiB after
objects=16
kit=/cxlkv/tools/lmcache-qualify/lmcache_qualify.py
lib="${LMCACHE_SHARE_LIBRARY:-$CXLKV_BIN/liblmcache_shared_l1_visibility.so}"

fail() { echo "$name: FAIL: $*"; exit 1; }
note() { echo "$name: $*"; }
# shellcheck source-path=SCRIPTDIR source=lib/wait.sh
. "${CXLKV_TESTS:-$(dirname "$0")}/lib/wait.sh"

case "${CXLKV_ROLE:-}" in
  a) peer=b ;;
  b) peer=a ;;
  *) echo "$name: needs the two-host topology (role a or b)"; exit 77 ;;
esac
if [ -z "${CXLKV_NET_ADDR:-}" ] || [ -z "${CXLKV_NET_PEER:-}" ]; then
  fail "no private link (CXLKV_NET_ADDR/CXLKV_NET_PEER unset: the topology sets them)"
fi
[ "${CXLKV_DAX_SIZE:?}" -gt $((mark_off + 8192)) ] || fail "$CXLKV_DAX is too small ($CXLKV_DAX_SIZE bytes)"
_t=$(ms)
pyver="$(python3 -c 'import sys; print(sys.version.split()[0])' 2>&1)" ||
  fail "python3 does not start in the guest (qemu-cxl/build-guest puts it in): $pyver"
note "python3 $pyver starts in $(($(ms) - _t)) ms"
[ -f "$kit" ] || fail "$kit: not in the guest image"
[ -f "$lib" ] || fail "$lib: not in the guest image"

# The coordinator's token: both guests derive it from the run id (the link is private to it).
token="$work/lmcache.token"
echo "cxlkv-lmq-$(echo "$CXLKV_RUN_ID" | sha256sum | cut -c1-40)" >"$token"
chmod 600 "$token"

# mark TEXT: writes this guest's 64-byte message in its slot; marked WHO: WHO's message of
# this run (empty if none yet).
slot() { if [ "$1" = a ]; then echo "$mark_off"; else echo $((mark_off + 4096)); fi; }
mark() {
  printf '%-63s\n' "$name $CXLKV_RUN_ID $CXLKV_ROLE $1" >"$work/mark.out"
  daxio -i "$work/mark.out" -o "$CXLKV_DAX" -s "$(slot "$CXLKV_ROLE")" -l 64 >/dev/null 2>&1 ||
    echo "$name: could not write '$1' for the other guest"
}
marked() {
  daxio -i "$CXLKV_DAX" -o "$work/mark.in" -k "$(slot "$1")" -l 64 >/dev/null 2>&1 &&
    sed -n "s/^$name $CXLKV_RUN_ID $1 \([^ ]*\).*/\1/p" "$work/mark.in"
}
# Whatever ends this test before its verdict is given tells the other guest so.
verdict=''
trap '_rc=$?; [ -n "$verdict" ] || mark "rc=$((_rc ? _rc : 1))"' EXIT
# peer_said OLD: the other guest's message is there and is not OLD; it is then in $said.
peer_said() { said="$(marked "$peer")"; [ -n "$said" ] && [ "$said" != "$1" ]; }

# qualify: this guest's role of the kit; its report in $out/qualify-ROLE.json. Returns its exit.
qualify() {
  _extra=''
  [ "$scribble" -gt 0 ] && [ "$CXLKV_ROLE" = b ] && _extra="--scribble $scribble"
  _t=$(ms)
  # shellcheck disable=SC2086  # $_extra is an option and its value, or nothing
  python3 "$kit" --endpoint "http://$ep:$port" --token-file "$token" --pool "$CXLKV_DAX" \
    --mapping-offset $((pool_off + pool_len - region_len)) --library "$lib" \
    --role "$CXLKV_ROLE" --run-id "$CXLKV_RUN_ID-$name" --objects "$objects" \
    --peer-wait-s 90 $_extra --json >"$out/qualify-$CXLKV_ROLE.json" 2>"$out/qualify-$CXLKV_ROLE.err"
  _rc=$?
  _detail="$(sed -n 's/^ *"detail": "\(.*\)",$/\1/p' "$out/qualify-$CXLKV_ROLE.json")"
  if [ "$_rc" = 0 ]; then _v=QUALIFIED; else _v="NOT QUALIFIED"; fi
  note "role $CXLKV_ROLE: $_v (exit $_rc, $(($(ms) - _t)) ms): ${_detail:-no report}"
  if [ -s "$out/qualify-$CXLKV_ROLE.err" ]; then
    sed 's/^/  | /' "$out/qualify-$CXLKV_ROLE.err"
  else
    rm -f "$out/qualify-$CXLKV_ROLE.err"
  fi
  return "$_rc"
}

# --- guest a: the coordinator, then role a ------------------------------------------------------
run_a() {
  ep="$CXLKV_NET_ADDR"
  note "waiting for guest b to start this test (daxio, $CXLKV_DAX at $(slot b))"
  wait_until 120 "guest b to start $name" peer_said ''
  [ "$said" = started ] || fail "guest b ended before it started: $said"

  cat >"$work/domain.toml" <<EOF
[domain]
name = "qemu-$name"
pool = "devdax:$CXLKV_DAX?shared=1&offset=$pool_off&length=$pool_len"
prefix_domain = "devdax:$CXLKV_DAX?shared=1&offset=$dom_off&length=$dom_len"
extent_size = "16M"
state_file = "$work/domain.state"
max_hosts = 4
index_entries = 256

[rpc]
socket = "$work/orchestrator.sock"

[metrics]
listen = ""

[lmcache]
listen = "$CXLKV_NET_ADDR:$port"
token_file = "$token"
layout_id = "qemu-two-host"
region_size = "16M"
alignment = 4096
EOF
  cp "$work/domain.toml" "$out/"
  "$CXLKV_BIN/cxlkv-orchestrator" --config "$work/domain.toml" --new-domain >"$out/orchestrator.log" 2>&1 &
  opid=$!
  serving() {
    grep -q "lmcache coordinator on http://$CXLKV_NET_ADDR:$port" "$out/orchestrator.log" && return 0
    kill -0 "$opid" 2>/dev/null && return 1
    sed 's/^/  | /' "$out/orchestrator.log"
    fail "cxlkv-orchestrator exited before its coordinator served"
  }
  wait_until 60 "the coordinator on $CXLKV_NET_ADDR:$port" serving
  grep "lmcache coordinator on" "$out/orchestrator.log" | sed 's/^/  | /'
  # The kit maps the device at the region's device offset: the pool's offset on the device plus
  # the region's offset in the pool, which is what the coordinator reports.
  grep -q "at pool offset $((pool_len - region_len)), $region_len bytes" "$out/orchestrator.log" ||
    fail "the coordinator's region is not the pool's last $region_len bytes (see orchestrator.log)"
  mark serving

  qualify
  rc=$?
  note "waiting for guest b's verdict"
  wait_until 150 "guest b's verdict" peer_said started
  b_verdict="$said"
  mark "rc=$rc"
  verdict=$rc
  kill -TERM "$opid"
  wait "$opid"
  orc=$?
  [ "$orc" = 0 ] || fail "cxlkv-orchestrator exited with $orc on SIGTERM (log: orchestrator.log)"
  [ "$rc" = 0 ] || fail "role a is NOT QUALIFIED (qualify-a.json)"
  [ "$b_verdict" = rc=0 ] || fail "guest b: role b is NOT QUALIFIED ($b_verdict; its qualify-b.json)"
  note "OK: both roles QUALIFIED: each guest read the other's $objects objects intact"
}

# --- guest b: role b against a's coordinator ------------------------------------------------------
run_b() {
  ep="$CXLKV_NET_PEER"
  mark started
  note "waiting for guest a's coordinator (daxio, $CXLKV_DAX at $(slot a))"
  wait_until 200 "guest a's coordinator" peer_said ''
  [ "$said" = serving ] || fail "guest a's coordinator did not start: $said"
  qualify
  rc=$?
  mark "rc=$rc"
  verdict=$rc
  wait_until 150 "guest a's verdict" peer_said serving
  [ "$rc" = 0 ] || fail "role b is NOT QUALIFIED (qualify-b.json)"
  [ "$said" = rc=0 ] || fail "guest a: role a is NOT QUALIFIED ($said; its qualify-a.json)"
  note "OK: both roles QUALIFIED: each guest read the other's $objects objects intact"
}

if [ "$CXLKV_ROLE" = a ]; then run_a; else run_b; fi
exit 0

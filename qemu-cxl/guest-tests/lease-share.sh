#!/bin/sh
# lease-share (two-host): the shared-prefix lease protocol end to end between the two guests —
# orchestrator and hosts as processes, the control plane over the guests' private link, the
# prefix index and the KV blocks in the CXL memory both guests map — with a host killed
# (kill -9) in the middle and nothing leaked after.
#
# Guest a runs cxlkv-orchestrator on the shared /dev/dax0.0: the pooled region is its first
# 64 MiB (4 extents of 16 MiB), the prefix domain the 4 MiB after; the control plane listens
# on a Unix socket and on TCP at CXLKV_NET_ADDR (rpc.tcp, every call carrying the domain's
# token). Host 0 (a process on guest a, over the Unix socket) grows an extent, writes and
# publishes 4 prefixes of 8 blocks (16 KiB each) and serves them. Guest b, over TCP:
#   1. host 2 grows an extent, publishes 2 prefixes and leases all 48 blocks (host 0's and
#      its own), renewing the leases; host 3 leases the 8 blocks of host 2's prefix 100 and
#      keeps them; host 2 is killed with kill -9;
#   2. `cxlkvctl --json` shows host 2 fenced and its extent quarantined — which happens only
#      once its capacity lease has run out — naming its arena, whose 16 blocks are retired;
#      the 8 nobody leases are reclaimed after the grace period while the extent stays
#      quarantined under host 3's 8 leases; host 0's 32 blocks stay published. Host 3 then
#      finds the bytes under its leases unchanged and the entries retired, releases, and the
#      extent becomes free;
#   3. host 2 comes back as a new incarnation, is lent an extent and publishes again;
#   4. host 1 leases, copies and checks every byte of all 48 blocks, releases, leaves;
#   5. host 2 stops (gives its extent back, leaves); b hands its verdict to a through the
#      shared device (daxio, 64 bytes at 96 MiB).
# Guest a touches the device only after b said (the same way) that it has started this test:
# until then b may still be reading pool-share's arena at the start of the device.
# Guest a then stops host 0 and checks that nothing leaked: no host live, every extent free,
# the index empty, and every block ever published (32 + 16 + 16) reclaimed. Logs of every
# process and b's timeline come back under results/<guest>/lease-share/.
#
# Timing (domain.toml below): host and lease TTL 5 s, heartbeats every second, capacity lease
# 6 s, grace 1 s: generous for TCG, where a guest on a busy machine can stall for seconds. A cxlkvctl call costs
# about a second there (process start, gRPC), so each look at the domain runs the calls it
# needs at once and the checks read that snapshot.
# shellcheck disable=SC2317  # the small predicates below run through wait_until
set -u
out="${CXLKV_OUT:-/tmp}"
work=/tmp/lease-share
mkdir -p "$work"
MiB=1048576
port=7443
pool_len=$((64 * MiB))
dom_off=$pool_len
dom_len=$((4 * MiB))
mark_off=$((96 * MiB))   # messages between the guests: outside the pool and the domain
blocks_a=32              # host 0: prefixes 0..3 x 8 blocks
blocks_v=16              # host 2: prefixes 100..101 x 8 blocks
blocks_h=8               # host 3 holds prefix 100

fail() { echo "lease-share: FAIL: $*"; exit 1; }
note() { echo "lease-share: $*"; }
# shellcheck source-path=SCRIPTDIR source=lib/wait.sh
. "${CXLKV_TESTS:-$(dirname "$0")}/lib/wait.sh"

case "${CXLKV_ROLE:-}" in
  a|b) ;;
  *) echo "lease-share: needs the two-host topology (role a or b)"; exit 77 ;;
esac
if [ -z "${CXLKV_NET_ADDR:-}" ] || [ -z "${CXLKV_NET_PEER:-}" ]; then
  fail "no private link (CXLKV_NET_ADDR/CXLKV_NET_PEER unset: the topology sets them)"
fi
[ "${CXLKV_DAX_SIZE:?}" -gt $((mark_off + MiB)) ] || fail "$CXLKV_DAX is too small ($CXLKV_DAX_SIZE bytes)"

# The domain's token: both guests derive it from the run id (the link is private to this run).
token="$work/rpc.token"
echo "cxlkv-qemu-$(echo "$CXLKV_RUN_ID" | sha256sum | cut -c1-40)" >"$token"
chmod 600 "$token"
export CXLKV_RPC_TOKEN_FILE="$token"

# --- cxlkvctl --json as the oracle -------------------------------------------------------------
ep=   # the orchestrator endpoint, set per role
snaps=0 calls=0 snap_ms=0
# snap REPLY...: one look at the domain: for each of status, hosts, extents, prefixes, runs
# `cxlkvctl REPLY --json` (all at once) and keeps the reply in $work/REPLY.json, whitespace
# removed, one object per line (the reply first, then each element of its list).
snap() {
  _t=$(ms) _pids=''
  for _r in "$@"; do
    _extra=''
    [ "$_r" = prefixes ] && _extra='--limit 1'   # the counts, not the entries
    # shellcheck disable=SC2086  # $_extra is an option and its value, or nothing
    "$CXLKV_BIN/cxlkvctl" "$_r" $_extra --json --socket "$ep" 2>"$work/$_r.err" |
      tr -d ' \n' | sed 's/\[{/\n{/; s/},{/}\n{/g' >"$work/$_r.json" &
    _pids="$_pids $!"
  done
  # shellcheck disable=SC2086  # a list of pids
  wait $_pids
  snaps=$((snaps + 1)) calls=$((calls + $#)) snap_ms=$((snap_ms + $(ms) - _t))
}
# field NAME: the first value of "NAME" on stdin (a string's contents or a number).
field() { sed -n "s/.*\"$1\":\"\{0,1\}\([^\",}]*\).*/\1/p" | head -n1; }
host_field() { grep "\"host_id\":$1," "$work/hosts.json" | field "$2"; }
extent_field() { grep "\"index\":$1," "$work/extents.json" | field "$2"; }
status_field() { field "$1" <"$work/status.json"; }
index_field() { field "$1" <"$work/prefixes.json"; }   # published | retired
# show REPLY: the last snapshot of REPLY for the log, an object a line, as key:value pairs.
show() {
  awk -F'[,{}]' -v r="$1" '{
    s = ""
    for (i = 1; i <= NF; i++) {
      gsub(/[]"]/, "", $i)
      if ($i != "" && $i !~ /:$/) s = s " " $i   # no list names, no empty values
    }
    if (s != "") print "  " r ":" s
  }' "$work/$1.json"
}

# ready PID FILE LOG: FILE exists; fails the test, showing LOG, if PID exited first.
ready() {
  [ -e "$2" ] && return 0
  kill -0 "$1" 2>/dev/null && return 1
  cat "$3"
  fail "pid $1 exited before writing $2"
}
key() { sed -n "s/^$1=//p" "$2"; }
expect() {  # expect WHAT GOT WANT
  [ "$2" = "$3" ] || fail "$1: got '$2', expected '$3'"
}
indent() { sed 's/^/  | /' "$@"; }
# stop PID LOG WHO: SIGTERM, and the process must exit 0.
stop() {
  kill -TERM "$1"
  wait "$1"
  _rc=$?
  indent "$2" | tail -n 1
  [ "$_rc" = 0 ] || fail "$3 exited with $_rc on SIGTERM (log: $2)"
}

# mark TEXT: writes this run's 64-byte message for the other guest at mark_off.
mark() {
  printf '%-63s\n' "lease-share $CXLKV_RUN_ID $1" >"$work/mark.out"
  daxio -i "$work/mark.out" -o "$CXLKV_DAX" -s "$mark_off" -l 64 >/dev/null 2>&1 ||
    echo "lease-share: could not write '$1' for the other guest"
}
# marked: the message of this run at mark_off (empty if none yet).
marked() {
  daxio -i "$CXLKV_DAX" -o "$work/mark.in" -k "$mark_off" -l 64 >/dev/null 2>&1 &&
    sed -n "s/^lease-share $CXLKV_RUN_ID \([^ ]*\).*/\1/p" "$work/mark.in"
}

# --- guest a: the orchestrator and host 0 --------------------------------------------------------
run_a() {
  ep="$work/orchestrator.sock"
  note "waiting for guest b to start this test (daxio, $CXLKV_DAX at $mark_off)"
  b_said() { [ -n "$(marked)" ]; }
  wait_until 120 "guest b to start lease-share" b_said
  [ "$(marked)" = started ] || fail "guest b ended before it started: $(marked)"

  cat >"$work/domain.toml" <<EOF
[domain]
name = "qemu-lease-share"
pool = "devdax:$CXLKV_DAX?shared=1&offset=0&length=$pool_len"
prefix_domain = "devdax:$CXLKV_DAX?shared=1&offset=$dom_off&length=$dom_len"
extent_size = "16M"
state_file = "$work/domain.state"
max_hosts = 4
index_entries = 256
lease_rows = 64
ring_slots = 16

[rpc]
socket = "$ep"
tcp = "$CXLKV_NET_ADDR:$port"
token_file = "$token"

[metrics]
listen = ""

[timing]
lease_ttl_ms = 5000
host_ttl_ms = 5000
heartbeat_period_ms = 1000
grace_ms = 1000
capacity_lease_ms = 6000
owner_period_ms = 10

[hosts]
allowed = [0, 1, 2, 3]

[capacity]
default_share = 0.5
EOF
  cp "$work/domain.toml" "$out/"
  # --new-domain: the first start of this domain creates its state file.
  "$CXLKV_BIN/cxlkv-orchestrator" --config "$work/domain.toml" --new-domain >"$out/orchestrator.log" 2>&1 &
  opid=$!
  wait_until 60 "the orchestrator's socket $ep" ready "$opid" "$ep" "$out/orchestrator.log"
  indent "$out/orchestrator.log"

  "$CXLKV_BIN/cxlkv-guest-lease" serve --endpoint "$ep" --host 0 --prefixes 0:4 --blocks 8 \
    --ready "$work/host0.ready" >"$out/host0.log" 2>&1 &
  h0=$!
  wait_until 90 "host 0 to publish" ready "$h0" "$work/host0.ready" "$out/host0.log"
  indent "$out/host0.log"

  note "waiting for guest b's verdict"
  b_done() { [ "$(marked)" != started ]; }
  wait_until 150 "guest b's verdict" b_done
  [ "$(marked)" = rc=0 ] || fail "guest b failed ($(marked); see its lease-share log)"
  snap hosts
  note "guest b passed; the hosts as b left them:"
  show hosts
  expect "host 0" "$(host_field 0 state)" live
  expect "host 1 (the reader)" "$(host_field 1 state)" left
  expect "host 2 (restarted)" "$(host_field 2 state)" left
  expect "host 2's incarnation" "$(host_field 2 incarnation)" 2
  expect "host 3 (the holder)" "$(host_field 3 state)" left

  stop "$h0" "$out/host0.log" "host 0"
  # Nothing leaked: every block ever published was reclaimed, every extent is free.
  clean() {
    snap status prefixes hosts extents
    [ "$(status_field extents_free)" = 4 ] && [ "$(status_field hosts_live)" = 0 ] &&
      [ "$(index_field published)" = 0 ] && [ "$(index_field retired)" = 0 ] &&
      [ "$(status_field prefixes_reclaimed)" = $((blocks_a + 2 * blocks_v)) ]
  }
  t0="$(ms)"
  wait_until 30 "every extent free and every block reclaimed" clean
  note "clean $(($(ms) - t0)) ms after host 0 left"
  show status
  show hosts
  show extents
  expect "extents" "$(status_field extents_total)" 4
  expect "quarantined extents" "$(status_field extents_quarantined)" 0
  expect "assigned extents" "$(status_field extents_assigned)" 0
  expect "fenced hosts" "$(status_field hosts_fenced)" 0
  expect "duplicate publications" "$(status_field prefix_duplicates)" 0

  stop "$opid" "$out/orchestrator.log" cxlkv-orchestrator
  note "OK: no host live, 4 of 4 extents free, $((blocks_a + 2 * blocks_v)) of $((blocks_a + 2 * blocks_v)) published blocks reclaimed, index empty ($calls cxlkvctl calls in $snaps looks, $((snap_ms / snaps)) ms a look)"
}

# --- guest b: the killed host, its new incarnation, the holder, the reader -----------------------
run_b() {
  ep="tcp:$CXLKV_NET_PEER:$port"
  trap 'rc=$?; mark "rc=$rc"' EXIT   # the verdict for guest a
  mark started
  tl="$out/timeline.txt"
  wait_until 60 "guest a on the private link ($CXLKV_NET_PEER)" \
    eval "ping -c 1 -W 1 $CXLKV_NET_PEER >/dev/null 2>&1"
  note "guest a answers on the private link; waiting for its orchestrator on $ep"
  a_ready() { snap status; [ "$(status_field prefixes_published)" = "$blocks_a" ]; }
  wait_until 150 "guest a's orchestrator and host 0's $blocks_a blocks" a_ready
  show status

  # 1. Host 2: an extent, its own blocks, leases on all 48; host 3: leases on 8 of host 2's.
  "$CXLKV_BIN/cxlkv-guest-lease" serve --endpoint "$ep" --host 2 --prefixes 100:2 --blocks 8 \
    --hold 0:4,100:2 --ready "$work/victim.ready" >"$out/host2-killed.log" 2>&1 &
  victim=$!
  wait_until 90 "host 2 to publish and lease" ready "$victim" "$work/victim.ready" "$out/host2-killed.log"
  indent "$out/host2-killed.log"
  inc1="$(key incarnation "$work/victim.ready")"
  ext="$(key extent "$work/victim.ready")"
  arena="$(key arena "$work/victim.ready")"
  expect "host 2's leases" "$(key leases "$work/victim.ready")" $((blocks_a + blocks_v))
  "$CXLKV_BIN/cxlkv-guest-lease" hold --endpoint "$ep" --host 3 --prefixes 100:1 --blocks 8 \
    --ready "$work/hold.ready" >"$out/host3.log" 2>&1 &
  h3=$!
  wait_until 90 "host 3 to lease host 2's blocks" ready "$h3" "$work/hold.ready" "$out/host3.log"
  indent "$out/host3.log"
  snap hosts extents prefixes
  show extents
  expect "host 2" "$(host_field 2 state)" live
  expect "extent $ext" "$(extent_field "$ext" state)" assigned
  expect "extent $ext's holder" "$(extent_field "$ext" host_id)" 2
  expect "published blocks" "$(index_field published)" $((blocks_a + blocks_v))

  kill -9 "$victim"
  t0="$(ms)"
  wait "$victim"
  note "kill -9 host 2 (pid $victim, incarnation $inc1): it held extent $ext (arena $arena) and $((blocks_a + blocks_v)) leases"
  echo "0 ms: kill -9 host 2 (extent $ext, arena $arena)" >"$tl"
  event() { note "$1 ms: $2"; echo "$1 ms: $2" >>"$tl"; }

  # 2. Host 2 fenced; its extent quarantined (its capacity lease ran out), naming its arena.
  # Times are when the look that saw it ended; the replies of one look are not one atomic
  # view (the index counts may be from just before the quarantine).
  fenced_at='' quarantined_at=''
  while [ -z "$fenced_at" ] || [ -z "$quarantined_at" ]; do
    [ $(($(ms) - t0)) -lt 60000 ] ||
      fail "60 s after the kill: host 2 fenced at '$fenced_at' ms, extent $ext quarantined at '$quarantined_at' ms"
    snap hosts extents prefixes
    now=$(($(ms) - t0))
    if [ -z "$fenced_at" ] && [ "$(host_field 2 state)" = fenced ]; then
      fenced_at=$now
      event "$now" "host 2 fenced"
    fi
    st="$(extent_field "$ext" state)"
    case "$st" in
      assigned) ;;
      quarantined)
        if [ -z "$quarantined_at" ]; then
          quarantined_at=$now
          expect "the arena quarantined with extent $ext" "$(extent_field "$ext" arena)" "$arena"
          event "$now" "extent $ext quarantined (arena $arena); index: $(index_field published) published, $(index_field retired) retired"
        fi ;;
      *) fail "extent $ext: state '$st' while host 3 holds leases on its blocks" ;;
    esac
  done
  # The 8 unleased blocks of the revoked arena are reclaimed after the grace period; the 8
  # under host 3's leases stay retired and hold the extent in quarantine; host 0's 32 blocks
  # stay published.
  reclaimed_unleased() {
    snap extents prefixes
    st="$(extent_field "$ext" state)"
    [ "$st" = quarantined ] || fail "extent $ext is $st while host 3 still holds leases on its blocks"
    [ "$(index_field retired)" = "$blocks_h" ]
  }
  wait_until 30 "the unleased blocks of host 2 to be reclaimed" reclaimed_unleased
  expect "published blocks while host 3 holds" "$(index_field published)" "$blocks_a"
  event $(($(ms) - t0)) "extent $ext still quarantined; index: $(index_field published) published, $(index_field retired) retired (under host 3's leases)"
  show extents

  # Host 3 lets go: the bytes under its leases never changed; its entries were retired.
  stop "$h3" "$out/host3.log" "host 3"
  grep -q "$blocks_h of $blocks_h blocks intact, $blocks_h of them retired" "$out/host3.log" ||
    fail "host 3 should find its $blocks_h blocks intact and retired"
  released_at=$(($(ms) - t0))
  event "$released_at" "host 3 released its leases and left"
  extent_free() { snap extents hosts prefixes; [ "$(extent_field "$ext" state)" = free ]; }
  wait_until 30 "extent $ext to be free once host 3 let go" extent_free
  free_at=$(($(ms) - t0))
  event "$free_at" "extent $ext free"
  show hosts
  show extents
  expect "host 2 after the kill" "$(host_field 2 state)" fenced
  expect "published blocks after the kill" "$(index_field published)" "$blocks_a"
  expect "retired blocks after the kill" "$(index_field retired)" 0
  expect "host 0 after the kill" "$(host_field 0 state)" live
  expect "host 0's extents after the kill" "$(host_field 0 extents)" 1

  # 3. Host 2 again: a new incarnation, lent an extent, publishing again.
  "$CXLKV_BIN/cxlkv-guest-lease" serve --endpoint "$ep" --host 2 --prefixes 100:2 --blocks 8 \
    --ready "$work/host2.ready" >"$out/host2.log" 2>&1 &
  h2=$!
  wait_until 90 "host 2's new incarnation to publish" ready "$h2" "$work/host2.ready" "$out/host2.log"
  indent "$out/host2.log"
  inc2="$(key incarnation "$work/host2.ready")"
  ext2="$(key extent "$work/host2.ready")"
  [ "$inc2" -gt "$inc1" ] || fail "host 2 rejoined with incarnation $inc2, not above $inc1"
  event $(($(ms) - t0)) "host 2 back as incarnation $inc2 on extent $ext2 (the killed one held extent $ext)"

  # 4. Host 1 reads every block of both publishers, byte by byte.
  "$CXLKV_BIN/cxlkv-guest-lease" read --endpoint "$ep" --host 1 --prefixes 0:4,100:2 --blocks 8 \
    --timeout 60 >"$out/host1.log" 2>&1
  rc=$?
  indent "$out/host1.log"
  [ "$rc" = 0 ] || fail "host 1 (the reader) failed"
  grep -q "verified $((blocks_a + blocks_v)) blocks" "$out/host1.log" || fail "host 1 did not verify every block"

  # 5. Host 2 stops cleanly.
  stop "$h2" "$out/host2.log" "host 2"
  snap hosts
  show hosts
  expect "host 1 at the end" "$(host_field 1 state)" left
  expect "host 2 at the end" "$(host_field 2 state)" left
  expect "host 2's incarnation at the end" "$(host_field 2 incarnation)" "$inc2"
  event $(($(ms) - t0)) "done"
  note "OK: after kill -9, host 2 fenced (seen at $fenced_at ms), its extent quarantined (seen at $quarantined_at ms) and held there by host 3's leases until $released_at ms, free at $free_at ms; host 0's $blocks_a blocks never lost; $((blocks_a + blocks_v)) blocks read back exactly ($calls cxlkvctl calls in $snaps looks, $((snap_ms / snaps)) ms a look)"
}

if [ "$CXLKV_ROLE" = a ]; then run_a; else run_b; fi
exit 0

#!/usr/bin/env bash
# Model-checks coherence/model/prefix.pml with SPIN (docs/model.md says what each check means).
#
#   check.sh              the correct model must pass every property (safety: assertions and
#                         index invariants; liveness under weak fairness), and every bug
#                         variant must FAIL (SPIN must find its counterexample).
#   check.sh --extended   also the slower checks (long: see docs/model.md): two reader hosts
#                         and every reader cache kept (bitstate searches: not exhaustive),
#                         3 publishes instead of 2, each liveness property on its own, and
#                         informational variants (info_*: they show which steps are not
#                         load-bearing, and what a forged PUBLISH can do).
#   check.sh --trail NAME  after the run, prints the counterexample of bug variant NAME
#   check.sh --jobs N     N checks at once (default: the cores, at most 4)
#                         (spin -t -p, trimmed) — for reading, not for the verdict.
#   check.sh --only REGEX  only the checks whose name matches (grep -E), e.g. --only failover
#
# Works from any directory; builds in a temporary directory it removes; exits non-zero when a
# verdict is not the expected one. Needs spin (Debian package `spin`) and a C compiler.
set -uo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
model="$here/prefix.pml"
extended=0
trail=""
only=""
jobs_arg=""
while [ $# -gt 0 ]; do
  case "$1" in
    --extended) extended=1 ;;
    --trail) trail="${2:-}"; shift ;;
    --only) only="${2:-}"; shift ;;
    --jobs) jobs_arg="${2:-}"; shift ;;
    *) echo "usage: $0 [--extended] [--trail BUG_NAME] [--only REGEX] [--jobs N]" >&2; exit 2 ;;
  esac
  shift
done

if ! command -v spin >/dev/null; then
  if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null; then
    echo "check.sh: installing spin" >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq spin >/dev/null 2>&1 ||
      { apt-get update -qq >/dev/null 2>&1 &&
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq spin >/dev/null 2>&1; }
  fi
  command -v spin >/dev/null || { echo "check.sh: spin is not installed (apt-get install spin)" >&2; exit 2; }
fi
CC="${CC:-gcc}"
command -v "$CC" >/dev/null || { echo "check.sh: no C compiler ($CC)" >&2; exit 2; }

work="$(mktemp -d "${TMPDIR:-/tmp}/cxlkv-model.XXXXXX")"
trap 'rm -rf "$work"' EXIT
jobs_max="$(nproc 2>/dev/null || echo 2)"
[ "$jobs_max" -gt 4 ] && jobs_max=4
if [ -n "$jobs_arg" ]; then
  [[ "$jobs_arg" =~ ^[1-9][0-9]*$ ]] || { echo "check.sh: --jobs takes a positive number, got '$jobs_arg'" >&2; exit 2; }
  jobs_max="$jobs_arg"
fi

# Checks: name | expect (pass|fail) | spin -D flags | cc flags | pan flags [| model file in
# this directory, prefix.pml when absent]
# The base configuration (BASE) is the one docs/model.md describes: the owner, the publisher
# (host 0) and one reader host, with an owner crash, a publisher crash, torn host rows and the
# explicit lease clock. Every bug variant is BASE plus one -D. Safety runs: assertions
# (S1-S3) + the Monitor's invariants (S4) + invalid end states, exhaustive (depth-first: a
# bug variant's counterexample is found in seconds, but it is long; --trail prints its end).
# -m: the depth bound is large enough that no pass is truncated (checked below).
BASE="-DIDLE_HOST2"
SAFE_CC="-DNOCLAIM -DSAFETY -DCOLLAPSE"
SAFE_PAN="-m4000000 -w25"
LIVE_CC="-DNFAIR=3 -DCOLLAPSE"
LIVE_PAN="-a -f -m4000000 -w25"
# Longest first, so that two at a time finish together.
checks=(
  "liveness|pass|$BASE -DLIVENESS|$LIVE_CC|$LIVE_PAN -N live"
  "safety|pass|$BASE|$SAFE_CC|$SAFE_PAN"
  "BUG_SAMPLE_BEFORE_READ|fail|$BASE -DBUG_SAMPLE_BEFORE_READ|$SAFE_CC|$SAFE_PAN"
  "BUG_STALE_RETURN|fail|$BASE -DBUG_STALE_RETURN|$SAFE_CC|$SAFE_PAN"
  "BUG_TORN_ROW_SKIPPED|fail|$BASE -DBUG_TORN_ROW_SKIPPED|$SAFE_CC|$SAFE_PAN"
  "BUG_NO_GEN_FREE|fail|$BASE -DBUG_NO_GEN_FREE|$SAFE_CC|$SAFE_PAN"
  "BUG_NO_FLUSH_LEASE|fail|$BASE -DBUG_NO_FLUSH_LEASE|$SAFE_CC|$SAFE_PAN"
  "BUG_NO_REVALIDATE|fail|$BASE -DBUG_NO_REVALIDATE|$SAFE_CC|$SAFE_PAN"
  "BUG_STALE_REVALIDATE|fail|$BASE -DBUG_STALE_REVALIDATE|$SAFE_CC|$SAFE_PAN"
  "BUG_NO_FLUSH_RETIRE|fail|$BASE -DBUG_NO_FLUSH_RETIRE|$SAFE_CC|$SAFE_PAN"
  "BUG_NO_VALIDATE_AFTER_COPY|fail|$BASE -DBUG_NO_VALIDATE_AFTER_COPY|$SAFE_CC|$SAFE_PAN"
  "BUG_NO_INVALIDATE_BLOCK|fail|$BASE -DBUG_NO_INVALIDATE_BLOCK|$SAFE_CC|$SAFE_PAN"
  "BUG_UNACKED_HEARTBEAT|fail|$BASE -DBUG_UNACKED_HEARTBEAT|$SAFE_CC|$SAFE_PAN"
  "BUG_DUP_REF|fail|$BASE -DBUG_DUP_REF -DDUP_REQUEST|$SAFE_CC|$SAFE_PAN"
  "BUG_RENEW_NO_SECOND_LOOK|fail|$BASE -DBUG_RENEW_NO_SECOND_LOOK|$SAFE_CC|$SAFE_PAN"
  "BUG_SCAN_ALL_ROWS|fail|$BASE -DLIVENESS -DBUG_SCAN_ALL_ROWS|$LIVE_CC|$LIVE_PAN -N live"
  "BUG_NEVER_FENCE|fail|$BASE -DLIVENESS -DBUG_NEVER_FENCE|$LIVE_CC|$LIVE_PAN -N fenced0"
  "BUG_ROOM_BEFORE_SCAN|fail|$BASE -DLIVENESS -DBUG_ROOM_BEFORE_SCAN|$LIVE_CC|$LIVE_PAN -N live"
  # failover.pml: a leader change of orchestrator HA with a zombie leader (docs/model.md,
  # "Leader change with a zombie leader"); small: a second or two each, compile included.
  # The bug variants are checked on S1 alone (-DNO_S2): their counterexample is the harm (a
  # published entry naming a freed block), not only a late store.
  "failover|pass||$SAFE_CC|-m100000|failover.pml"
  "failover_BUG_NO_WRITEBACK|fail|-DNO_S2 -DBUG_NO_WRITEBACK|$SAFE_CC|-m100000|failover.pml"
  "failover_BUG_NO_RELEASE_WAIT|fail|-DNO_S2 -DBUG_NO_RELEASE_WAIT|$SAFE_CC|-m100000|failover.pml"
)
if [ "$extended" -eq 1 ]; then
  # Bitstate searches (-DBITSTATE, a 2^32-bit table) visit a large part of a state space that
  # is too big to store here, not all of it: a pass there is evidence, not proof.
  BIT_CC="-DNOCLAIM -DSAFETY -DBITSTATE"
  BIT_PAN="-m4000000 -w32"
  checks=(
    "safety_2readers_bitstate|pass||$BIT_CC|$BIT_PAN"
    "safety_full_caches_bitstate|pass|$BASE -DFULL_CACHES|$BIT_CC|$BIT_PAN"
    "safety_maxpub3|pass|$BASE -DMAXPUB=3|$SAFE_CC|-m4000000 -w27"
    "live_reclaim0|pass|$BASE -DLIVENESS|$LIVE_CC|$LIVE_PAN -N reclaim0"
    "live_reclaim1|pass|$BASE -DLIVENESS|$LIVE_CC|$LIVE_PAN -N reclaim1"
    "live_fenced0|pass|$BASE -DLIVENESS|$LIVE_CC|$LIVE_PAN -N fenced0"
    "info_NO_GRACE|pass|$BASE -DBUG_NO_GRACE|$SAFE_CC|$SAFE_PAN"
    "info_NO_DEADLINE_CHECK|pass|$BASE -DNO_DEADLINE_CHECK=1|$SAFE_CC|$SAFE_PAN"
    "info_NO_GEN_CHECK|pass|$BASE -DNO_GEN_CHECK=1|$SAFE_CC|$SAFE_PAN"
    # A PUBLISH of a ref its host does not hold (replayed or forged) that the owner applies
    # after the ref's block was freed: the owner publishes a free block. Publishers are
    # trusted to name only blocks they hold (docs/model.md); this shows why.
    "info_DUP_REQUEST|fail|$BASE -DDUP_REQUEST|$SAFE_CC|$SAFE_PAN"
    "${checks[@]}"
  )
fi

if [ -n "$only" ]; then
  kept=()
  for c in "${checks[@]}"; do
    if grep -qE -- "$only" <<<"${c%%|*}"; then kept+=("$c"); fi
  done
  [ "${#kept[@]}" -gt 0 ] || { echo "check.sh: no check matches --only '$only'" >&2; exit 2; }
  checks=("${kept[@]}")
fi

# One check: spin -a, compile, run pan; writes $work/$name/verdict.
run_check() {
  local name="$1" expect="$2" sflags="$3" cflags="$4" pflags="$5" file="${6:-prefix.pml}"
  local d="$work/$name"
  mkdir -p "$d" && cd "$d" || return 1
  local t0=$SECONDS
  # shellcheck disable=SC2086
  if ! spin $sflags -a "$here/$file" >spin.txt 2>&1; then
    echo "ERROR spin -a failed (see spin.txt)" >verdict; return
  fi
  # shellcheck disable=SC2086
  if ! "$CC" -O2 -w $cflags -o pan pan.c >cc.txt 2>&1; then
    echo "ERROR cc failed" >verdict; return
  fi
  # shellcheck disable=SC2086
  ./pan $pflags >pan.txt 2>&1
  local errors states depth secs got what
  errors="$(sed -n 's/.*errors: \([0-9]*\).*/\1/p' pan.txt | head -1)"
  states="$(sed -n 's/^ *\([0-9.e+]*\) states, stored.*/\1/p' pan.txt | head -1)"
  depth="$(sed -n 's/.*depth reached \([0-9]*\).*/\1/p' pan.txt | head -1)"
  secs="$(sed -n 's/^pan: elapsed time \([0-9.e+]*\) seconds.*/\1/p' pan.txt | head -1)"
  what="$(grep -m1 -E '^pan:[0-9]+: ' pan.txt | sed 's/^pan:[0-9]*: *//' | cut -c1-60)"
  if [ -z "$errors" ]; then
    got="ERROR"; what="pan did not finish (see pan.txt)"
  elif [ "$errors" = "0" ]; then
    got="pass"
    if grep -q "max search depth too small" pan.txt; then got="ERROR"; what="search truncated (-m)"; fi
  else
    got="fail"
  fi
  echo "$got|$states|$depth|${secs:-?}|$((SECONDS - t0))|$what" >verdict
}

start=$SECONDS
echo "SPIN model check of $model and $here/failover.pml (up to $jobs_max at once)"
running=0
for c in "${checks[@]}"; do
  IFS='|' read -r name expect sflags cflags pflags file <<<"$c"
  run_check "$name" "$expect" "$sflags" "$cflags" "$pflags" "$file" &
  running=$((running + 1))
  if [ "$running" -ge "$jobs_max" ]; then wait -n; running=$((running - 1)); fi
done
wait

status=0
printf '\n%-28s %-6s %-6s %12s %9s %8s %7s  %s\n' check expect got states depth pan_s wall_s \
  "first violation"
for c in "${checks[@]}"; do
  IFS='|' read -r name expect _ _ _ <<<"$c"
  IFS='|' read -r got states depth secs wall what <"$work/$name/verdict" ||
    { got="ERROR"; what="no verdict"; }
  mark=""
  if [ "$got" != "$expect" ]; then mark="   <-- UNEXPECTED"; status=1; fi
  printf '%-28s %-6s %-6s %12s %9s %8s %7s  %s%s\n' "$name" "$expect" "$got" "${states:-?}" \
    "${depth:-?}" "${secs:-?}" "${wall:-?}" "${what:-}" "$mark"
done

if [ -n "$trail" ]; then
  d="$work/$trail"
  if compgen -G "$d/*.pml.trail" >/dev/null; then
    echo; echo "== counterexample of $trail (spin -t -p, steps of the processes)"
    IFS='|' read -r _ _ sflags _ _ file <<<"$(printf '%s\n' "${checks[@]}" | grep "^$trail|")"
    file="${file:-prefix.pml}"
    # pan wrote the trail next to it, named after the model: spin -t reads it from there.
    cp "$here/$file" "$d/$file"
    # shellcheck disable=SC2086
    (cd "$d" && spin -t -p -g -l $sflags "$file" | grep -E '^ *[0-9]+:|assert' | tail -n 120)
  else
    echo "no trail for $trail"
  fi
fi

echo
if [ "$status" -eq 0 ]; then
  echo "coherence/model: all verdicts as expected ($((SECONDS - start)) s)"
else
  echo "coherence/model: UNEXPECTED verdicts ($((SECONDS - start)) s)"
fi
exit "$status"

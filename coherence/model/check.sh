#!/usr/bin/env bash
# Checks coherence/model/prefix.pml with SPIN: the protocol model must satisfy every safety
# assertion and, under weak fairness, the liveness properties; each seeded bug variant must
# be caught (a counterexample). Runs in a temp dir; about 1.5 minutes on 2 vCPUs.
set -euo pipefail
model="$(cd "$(dirname "$0")" && pwd)/prefix.pml"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
cd "$work"
fail=0

build() {  # build <extra spin -D flags...> ; compiles pan with the given gcc flags in $CFLAGS
  spin "$@" -a "$model" >/dev/null
  gcc -O2 $CFLAGS -o pan pan.c
}

safety() {  # safety NAME [spin -D flags...]: expect no errors
  local name="$1"; shift
  CFLAGS="-DSAFETY -DCOLLAPSE" build "$@"
  local out; out="$(./pan -m400000 -w26 2>&1)"
  local stored; stored="$(echo "$out" | grep -m1 'states, stored' | awk '{print $1}')"
  if echo "$out" | grep -q 'errors: 0'; then
    echo "ok    $name: no assertion violated ($stored states)"
  else
    echo "FAIL  $name:"; echo "$out" | grep -E 'assertion|errors' ; fail=1
  fi
}

bug() {  # bug FLAG: the model with FLAG must violate an assertion
  CFLAGS="-DSAFETY -DCOLLAPSE" build "-D$1"
  local out; out="$(./pan -m400000 -w26 2>&1)"
  if echo "$out" | grep -q 'errors: 0'; then
    echo "FAIL  $1: the bug was NOT caught"; fail=1
  else
    echo "ok    $1 caught: $(echo "$out" | grep -m1 -E 'assertion violated|acceptance cycle' | cut -c1-110)"
  fi
}

live() {  # live LTL-NAME: liveness under weak fairness
  CFLAGS="-DNFAIR=3 -DCOLLAPSE" build -DLIVENESS
  local out; out="$(./pan -a -f -m400000 -w26 -N "$1" 2>&1)"
  local stored; stored="$(echo "$out" | grep -m1 'states, stored' | awk '{print $1}')"
  if echo "$out" | grep -q 'errors: 0'; then
    echo "ok    liveness $1 under weak fairness ($stored states)"
  else
    echo "FAIL  liveness $1:"; echo "$out" | grep -E 'acceptance|errors'; fail=1
  fi
}

safety "safety (3 hosts, 2 entries, 2 blocks, crashes, pauses, stale caches)"
live reclaim0
live fenced0
for b in BUG_NO_FLUSH_LEASE BUG_NO_REVALIDATE BUG_UNACKED_HEARTBEAT BUG_NO_VALIDATE_AFTER_COPY; do
  bug "$b"
done
exit "$fail"

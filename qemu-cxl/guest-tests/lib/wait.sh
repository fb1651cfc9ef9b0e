# shellcheck shell=sh
# Sourced by the guest tests (POSIX sh): the guest's uptime clock and a bounded poll. The test
# defines fail() (its own "NAME: FAIL: ..." line) before sourcing this.

# ms: milliseconds since boot.
ms() { awk '{ printf "%d\n", $1 * 1000 }' /proc/uptime; }

# wait_until SECS WHAT CMD...: runs CMD until it succeeds, every 0.2 s; fails after SECS.
wait_until() {
  _end=$(($(ms) + $1 * 1000)) _what="$2"
  shift 2
  until "$@"; do
    [ "$(ms)" -lt "$_end" ] || fail "timed out waiting for $_what"
    sleep 0.2
  done
}

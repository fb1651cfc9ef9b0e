#!/usr/bin/env bash
# Runs an unmodified program with and without libcxlkv_preload.so and checks that
#   1. both runs succeed and print the same output (the program's own checks, plus ours),
#   2. under the shim a real share of its allocations landed in CXL (from CXLKV_STATS files,
#      one per process: the program's children load the shim too).
#
# Usage: run_program.sh SHIM SCENARIO [BUILD_DIR]
#   SCENARIO: python | sqlite | git | sort | stress | config-errors | bad-pool | pool-full |
#             valgrind | standin
#   BUILD_DIR: where preload_stress and serving_standin are
# Exit 0 on success; on failure, prints what differed and keeps the work directory.
set -euo pipefail

SHIM="$1"
SCENARIO="$2"
BUILD_DIR="${3:-}"
HERE="$(cd "$(dirname "$0")" && pwd)"
WORK="$(mktemp -d "${TMPDIR:-/tmp}/cxlkv-preload-${SCENARIO}.XXXXXX")"
POOL_FILE="/dev/shm/cxlkv-preload-test-${SCENARIO}-$$"
cleanup() {
  local rc=$?
  rm -f "$POOL_FILE"
  if [ "$rc" -eq 0 ]; then rm -rf "$WORK"; else echo "work directory kept: $WORK" >&2; fi
}
trap cleanup EXIT
[ -f "$SHIM" ] || { echo "no shim at $SHIM" >&2; exit 1; }
SEED="${CXLKV_TEST_SEED:-$RANDOM}"  # stress scenarios; replay with CXLKV_TEST_SEED
# A clean environment for both runs: no CXLKV_* from the caller.
for v in $(env | grep -o '^CXLKV_[A-Z_]*' || true); do unset "$v"; done

fail() { echo "FAIL ($SCENARIO): $*" >&2; exit 1; }
# Debian's interpreter itself, not a wrapper script (pyenv shims exec several images).
PY=python3
[ -x /usr/bin/python3 ] && PY=/usr/bin/python3

# run_both OUTNAME CMD...: reference run, then the same under the shim.
run_both() {
  local name="$1"; shift
  (cd "$WORK/ref" && "$@") >"$WORK/$name.ref" 2>"$WORK/$name.ref.err" ||
    fail "reference run failed: $* (see $WORK/$name.ref.err)"
  # Exported in the subshell, not through env(1): only the program gets the shim.
  (cd "$WORK/cxl" && export LD_PRELOAD="$SHIM" CXLKV_POOL="$POOL" CXLKV_MIN_BYTES="$MIN" \
      CXLKV_STATS="$WORK/stats/%p.json" CXLKV_LOG="warn,$WORK/shim.log" && exec "$@") \
    >"$WORK/$name.cxl" 2>"$WORK/$name.cxl.err" ||
    fail "run under the shim failed: $* (stderr: $(tail -n 5 "$WORK/$name.cxl.err"))"
  if ! cmp -s "$WORK/$name.ref" "$WORK/$name.cxl"; then
    diff "$WORK/$name.ref" "$WORK/$name.cxl" | head -n 20 >&2
    fail "output differs under the shim: $*"
  fi
}

# check_stats MIN_CXL_ALLOCS [CLASS]: sums every process's stats file.
check_stats() {
  python3 - "$WORK/stats" "$1" "${2:-}" <<'PY'
import glob, json, sys
d, need, cls = sys.argv[1], int(sys.argv[2]), sys.argv[3]
files = sorted(glob.glob(d + "/*.json"))
if not files:
    sys.exit("no CXLKV_STATS files were written")
tot = {"cxl": 0, "pass": 0, "cxl_bytes": 0, "fallbacks": 0}
for f in files:
    j = json.load(open(f))
    if j["state"] != "cxl":
        sys.exit(f"{f}: the shim was not active: {j['detail']}")
    for c, v in j["classes"].items():
        if cls and c != cls:
            continue
        tot["cxl"] += v["cxl"]["allocs"]
        tot["pass"] += v["pass"]["allocs"]
        tot["cxl_bytes"] += v["cxl"]["bytes"]
    tot["fallbacks"] += j["fallbacks"]
print(f"stats: {len(files)} process(es), CXL allocations {tot['cxl']} ({tot['cxl_bytes']} bytes), "
      f"pass-through {tot['pass']}, fallbacks {tot['fallbacks']}")
if tot["cxl"] < need:
    sys.exit(f"only {tot['cxl']} allocations landed in CXL, expected at least {need}")
PY
}

mkdir -p "$WORK/ref" "$WORK/cxl" "$WORK/stats"
POOL="file:${POOL_FILE}?size=512M&reserve=0"
MIN=64

case "$SCENARIO" in
  python)
    run_both out "$PY" "$HERE/stdlib_workload.py"
    cat "$WORK/out.cxl"
    check_stats 2000
    ;;
  sqlite)
    cat >"$WORK/q.sql" <<'SQL'
create table kv(id integer primary key, layer int, tokens int, payload blob);
with recursive c(x) as (select 1 union all select x + 1 from c where x < 200000)
  insert into kv(layer, tokens, payload) select x % 80, x % 4096, zeroblob(64 + x % 200) from c;
create index kv_layer on kv(layer, tokens);
select count(*), sum(layer), sum(tokens), sum(length(payload)) from kv;
select layer, count(*), max(tokens) from kv where layer in (0, 7, 79) group by layer order by layer;
delete from kv where id % 3 = 0;
vacuum;
select count(*), sum(id) from kv;
pragma integrity_check;
SQL
    for d in ref cxl; do rm -f "$WORK/$d/kv.db"; done
    run_both out sh -c "sqlite3 kv.db < '$WORK/q.sql'"
    # Independent arithmetic: 200000 rows; layer = x % 80; tokens = x % 4096.
    expect="$(python3 -c "
n=200000
print(f'{n}|{sum(x%80 for x in range(1,n+1))}|{sum(x%4096 for x in range(1,n+1))}|{sum(64+x%200 for x in range(1,n+1))}')
print('\n'.join(f'{l}|{sum(1 for x in range(1,n+1) if x%80==l)}|{max(x%4096 for x in range(1,n+1) if x%80==l)}' for l in (0,7,79)))
k=[x for x in range(1,n+1) if x%3]
print(f'{len(k)}|{sum(k)}')
print('ok')")"
    [ "$(cat "$WORK/out.cxl")" = "$expect" ] || fail "sqlite3 output: $(cat "$WORK/out.cxl") != $expect"
    cat "$WORK/out.cxl"
    check_stats 2000
    ;;
  git)
    export HOME="$WORK" GIT_CONFIG_NOSYSTEM=1 GIT_AUTHOR_NAME=cxlkv GIT_AUTHOR_EMAIL=cxlkv@test \
      GIT_COMMITTER_NAME=cxlkv GIT_COMMITTER_EMAIL=cxlkv@test \
      GIT_AUTHOR_DATE="2026-01-01T00:00:00Z" GIT_COMMITTER_DATE="2026-01-01T00:00:00Z"
    cat >"$WORK/git.sh" <<'SH'
set -e
git init -q -b main repo && cd repo
for i in $(seq 1 40); do seq $i 3 30000 > "f$i.txt"; done
git add . && git commit -q -m "first"
for i in $(seq 1 40 | sed -n '1~3p'); do seq 1 $i 20000 > "f$i.txt"; done
git mv f2.txt moved.txt && git commit -q -am "second"
git checkout -q -b side HEAD~1 && echo side > side.txt && git add side.txt && git commit -q -m side
git checkout -q main && git merge -q --no-edit side
git log --format='%H %s' --graph
git diff --stat HEAD~2 HEAD | tail -n 1
git gc -q --aggressive
git fsck --full --strict 2>&1
git count-objects -v | grep -E '^(count|in-pack|packs)'
git rev-parse HEAD:moved.txt
git archive HEAD | md5sum
SH
    run_both out bash "$WORK/git.sh"
    cat "$WORK/out.cxl"
    check_stats 2000
    ;;
  sort)
    # 1.5M shuffled numbers (a fixed permutation), sorted with a 64 MiB buffer.
    python3 -c "
import random
r = random.Random(3); xs = list(range(1, 1500001)); r.shuffle(xs)
print('\n'.join(map(str, xs)))" >"$WORK/in.txt"
    run_both out sort -n -S 64M --parallel=2 "$WORK/in.txt"
    [ "$(md5sum <"$WORK/out.cxl")" = "$(seq 1 1500000 | md5sum)" ] || fail "sort output is not 1..1500000"
    check_stats 1
    python3 - "$WORK/stats" <<'PY'
import glob, json, sys
big = sum(json.load(open(f))["classes"]["malloc"]["cxl"]["bytes"] for f in glob.glob(sys.argv[1] + "/*.json"))
print(f"sort: {big} bytes of malloc requests served from CXL")
if big < 32 << 20:
    sys.exit("sort's buffer did not land in CXL")
PY
    ;;
  stress)
    echo "seed $SEED"
    run_both out "$BUILD_DIR/preload_stress" 4 4000 "$SEED"
    grep -q "preload_stress: ok" "$WORK/out.cxl" || fail "stress did not report ok"
    check_stats 5000
    ;;
  config-errors)
    # An unknown key: reported once on stderr, the program runs as without the shim.
    out="$(env LD_PRELOAD="$SHIM" CXLKV_POOL="$POOL" CXLKV_MINBYTES=64 \
      CXLKV_STATS="$WORK/stats/%p.json" "$PY" -c 'print(sum(range(10**6)))' 2>"$WORK/err")"
    [ "$out" = "499999500000" ] || fail "program output: $out"
    [ "$(grep -c 'unknown setting CXLKV_MINBYTES' "$WORK/err")" = 1 ] ||
      fail "expected one error line about CXLKV_MINBYTES, got: $(cat "$WORK/err")"
    grep -q '"state": "pass-through"' "$WORK"/stats/*.json || fail "shim should pass through"
    echo "config error reported once; pass-through"
    ;;
  bad-pool)
    # A pool file holding foreign data is never formatted: logged once, pass-through.
    head -c 4M /dev/urandom >"$POOL_FILE"
    sum_before="$(md5sum <"$POOL_FILE")"
    out="$(env LD_PRELOAD="$SHIM" CXLKV_POOL="file:$POOL_FILE" CXLKV_MIN_BYTES=64 \
      CXLKV_STATS="$WORK/stats/%p.json" "$PY" -c 'print(len(str(list(range(10**5)))))' 2>"$WORK/err")"
    [ "$out" = "688890" ] || fail "program output: $out"
    [ "$(grep -c "$POOL_FILE" "$WORK/err")" = 1 ] || fail "expected one log line: $(cat "$WORK/err")"
    [ "$(md5sum <"$POOL_FILE")" = "$sum_before" ] || fail "the foreign pool file was modified"
    grep -q '"state": "pass-through"' "$WORK"/stats/*.json || fail "shim should pass through"
    cat "$WORK/err"
    ;;
  pool-full)
    # A 16 MiB pool fills up: logged once, later requests pass through, the program is fine.
    POOL="memfd:?size=16M"
    echo "seed $SEED"
    run_both out "$BUILD_DIR/preload_stress" 2 3000 "$SEED"
    # Logged once per process (the stress program forks: each process has its own heap).
    [ "$(grep -c 'cannot serve' "$WORK/shim.log")" -ge 1 ] ||
      fail "expected a 'cannot serve' line: $(cat "$WORK/shim.log")"
    [ -z "$(grep 'cannot serve' "$WORK/shim.log" | grep -o '^cxlkv-preload\[[0-9]*\]' | sort | uniq -d)" ] ||
      fail "a process logged 'cannot serve' more than once: $(cat "$WORK/shim.log")"
    python3 - "$WORK/stats" <<'PY'
import glob, json, sys
j = [json.load(open(f)) for f in glob.glob(sys.argv[1] + "/*.json")]
fb = sum(x["fallbacks"] for x in j); cxl = sum(x["classes"]["malloc"]["cxl"]["allocs"] for x in j)
print(f"pool-full: {cxl} CXL allocations, {fb} fell back to the process allocator")
if fb == 0 or cxl == 0:
    sys.exit("expected both CXL allocations and fallbacks")
PY
    ;;
  valgrind)
    # memcheck over the stress program under the shim. somalloc=nouserintercepts: valgrind
    # replaces libc's malloc (what the shim passes through to), not the shim's own.
    echo "seed $SEED"
    env LD_PRELOAD="$SHIM" CXLKV_POOL="memfd:?size=256M" CXLKV_MIN_BYTES=256 \
      CXLKV_STATS="$WORK/stats/%p.json" valgrind -q --soname-synonyms=somalloc=nouserintercepts \
      --error-exitcode=99 --leak-check=no "$BUILD_DIR/preload_stress" 2 400 "$SEED" \
      >"$WORK/out" 2>"$WORK/err" || fail "valgrind: $(tail -n 30 "$WORK/err")"
    grep -q "preload_stress: ok" "$WORK/out" || fail "stress did not report ok"
    check_stats 200 malloc
    ;;
  standin)
    # Without the shim, on a machine without a GPU, cudaHostAlloc fails; with it, the KV
    # buffers come from CXL (registration skipped, reason logged). With a GPU both work and
    # the shim's buffers are registered (pinned) and copied to the device and back.
    set +e
    "$BUILD_DIR/serving_standin" >"$WORK/plain" 2>&1
    plain_rc=$?
    env LD_PRELOAD="$SHIM" CXLKV_POOL="memfd:?size=256M" CXLKV_STATS="$WORK/stats/%p.json" \
      CXLKV_LOG="info,$WORK/shim.log" "$BUILD_DIR/serving_standin" >"$WORK/shim" 2>&1
    shim_rc=$?
    set -e
    echo "--- without the shim (rc $plain_rc):"; cat "$WORK/plain"
    echo "--- with the shim (rc $shim_rc):"; cat "$WORK/shim"; cat "$WORK/shim.log"
    [ "$shim_rc" = 0 ] && grep -q "kv buffers ok" "$WORK/shim" || fail "stand-in failed under the shim"
    python3 - "$WORK/stats" <<'PY'
import glob, json, sys
j = json.load(open(glob.glob(sys.argv[1] + "/*.json")[0]))
c = j["classes"]["cuda_host"]["cxl"]
if c["allocs"] != 9 or c["frees"] != 9 or c["bytes"] < 8 * (5 << 20):
    sys.exit(f"expected 9 cuda host blocks in CXL (8 KV + 1 staging), got {c}")
print(f"cuda host blocks in CXL: {c}, registered {j['cuda_registered']}, not registered {j['cuda_unregistered']}")
PY
    if grep -q "^devices: 0" "$WORK/plain"; then
      [ "$plain_rc" != 0 ] && grep -q "cudaHostAlloc failed" "$WORK/plain" ||
        fail "without a GPU the stand-in should fail without the shim"
      grep -q "without registration (not pinned): cudaGetDeviceCount" "$WORK/shim.log" ||
        fail "the shim did not log why registration was skipped"
      grep -q '"cuda_unregistered": 9' "$WORK"/stats/*.json || fail "expected 9 unregistered blocks"
    else
      [ "$plain_rc" = 0 ] || fail "with a GPU the stand-in should work without the shim too"
      grep -q "pinned: yes" "$WORK/shim" && grep -q "device copy ok" "$WORK/shim" ||
        fail "with a GPU the shim's buffers must be pinned and copy to the device"
      grep -q '"cuda_registered": 9' "$WORK"/stats/*.json || fail "expected 9 registered blocks"
    fi
    ;;
  *)
    fail "unknown scenario"
    ;;
esac
echo "PASS ($SCENARIO)"

#!/bin/sh
# smoke: the topology's CXL memory is enumerated as expected and really holds data.
#
# Checks the counts of memdevs / regions / dax devices against CXLKV_EXPECT_*, that the
# devdax size is sane and could be onlined as system RAM (whole memory blocks), and that
# data written through $CXLKV_DAX reads back (a mis-programmed HDM decoder reads zeros while
# every command succeeds). On a shared topology (CXLKV_SHARED=1) the guests hand a pattern to
# each other through the shared device. Prints the tools' views for the log.
# Device DAX has no read(2)/write(2), so I/O goes through daxio (pmdk-tools), which mmaps.
# needs: cxlkvctl

fail() { echo "smoke: FAIL: $*"; exit 1; }
show() { echo "+ $*"; "$@"; }
mib() { echo $(($1 / 1048576)); }

show cxl list -vvv
show ndctl list -N
show daxctl list
echo "+ cxlkvctl topology --json"
if [ -x "$CXLKV_BIN/cxlkvctl" ]; then
  "$CXLKV_BIN/cxlkvctl" topology --json || echo "(cxlkvctl exited with $?)"
else
  echo "(no cxlkvctl in this image)"
fi

# --- Enumeration -------------------------------------------------------------------------------
memdevs="$(cxl list -M | grep -c '"memdev":')"
regions="$(cxl list -R | grep -c '"region":')"
daxdevs="$(daxctl list | grep -c '"chardev":')"
echo "smoke: $memdevs memdev(s), $regions region(s), $daxdevs dax device(s)"
[ "$memdevs" -eq "${CXLKV_EXPECT_MEMDEVS:?}" ] || fail "expected $CXLKV_EXPECT_MEMDEVS memdev(s)"
[ "$regions" -eq "${CXLKV_EXPECT_REGIONS:?}" ] || fail "expected $CXLKV_EXPECT_REGIONS region(s)"
[ "$daxdevs" -eq "${CXLKV_EXPECT_DAX:?}" ] || fail "expected $CXLKV_EXPECT_DAX dax device(s)"

region_size=$(($(cat "/sys/bus/cxl/devices/${CXLKV_REGION:?}/size")))   # sysfs says hex
ways="$(cat "/sys/bus/cxl/devices/$CXLKV_REGION/interleave_ways")"
echo "smoke: $CXLKV_REGION: $(mib "$region_size") MiB, $ways-way; nd region $CXLKV_ND_REGION"

if [ "$CXLKV_KMEM" = 1 ]; then
  # Onlined as system RAM: the device node is gone, the memory is a CPU-less NUMA node.
  node="${CXLKV_KMEM_NODE:?}"
  total_kb="$(sed -n 's/.*MemTotal: *\([0-9]*\) kB/\1/p' "/sys/devices/system/node/node$node/meminfo")"
  echo "smoke: kmem node $node: $((total_kb / 1024)) MiB"
  [ "${total_kb:-0}" -gt 0 ] || fail "node $node has no memory after daxctl reconfigure-device"
  show cat /proc/buddyinfo
  exit 0
fi

# --- Size: sane, and whole memory blocks for `daxctl reconfigure-device --mode=system-ram` -------
dax="${CXLKV_DAX#/dev/}"
size="${CXLKV_DAX_SIZE:?}"
start="$(cat "/sys/bus/dax/devices/$dax/resource" 2>/dev/null || echo)"
[ -n "$start" ] && start=$((start))
echo "smoke: $CXLKV_DAX: $(mib "$size") MiB at ${start:-?}, align ${CXLKV_DAX_ALIGN:-?}"
{ [ "$size" -gt 0 ] && [ "$size" -le "$region_size" ]; } || fail "devdax size $size vs region $region_size"
# --map=mem keeps the page array in RAM: only the info block and alignment padding are lost.
[ $((region_size - size)) -le $((32 * 1048576)) ] || fail "devdax loses more than 32 MiB of the region"
if [ -n "$start" ]; then
  block=$((0x$(cat /sys/devices/system/memory/block_size_bytes)))
  first=$(((start + block - 1) / block))
  last=$(((start + size) / block))
  echo "smoke: $((last - first)) whole $(mib "$block") MiB memory block(s) for kmem"
  [ "$last" -gt "$first" ] || fail "no whole memory block: system-ram mode impossible"
fi

# --- Data round trip through the mapping ---------------------------------------------------------
# On a shared device each guest keeps to its own half: a the lower, b the upper.
lo=0
span="$size"
if [ "${CXLKV_SHARED:-0}" = 1 ]; then
  span=$((size / 2))
  [ "$CXLKV_ROLE" = b ] && lo="$span"
fi
len=65536
head -c "$len" /dev/urandom >/tmp/smoke.pat
for off in "$lo" $((lo + 1048576 + 4096)) $((lo + span - len)); do
  daxio -i /tmp/smoke.pat -o "$CXLKV_DAX" -s "$off" -l "$len" >/dev/null 2>&1 ||
    fail "daxio write at $off"
  daxio -i "$CXLKV_DAX" -o /tmp/smoke.back -k "$off" -l "$len" >/dev/null 2>&1 ||
    fail "daxio read at $off"
  if ! cmp -s /tmp/smoke.pat /tmp/smoke.back; then
    echo "wrote:"; head -c 64 /tmp/smoke.pat | hexdump -C
    echo "read:"; head -c 64 /tmp/smoke.back | hexdump -C
    fail "64 KiB at offset $off did not read back"
  fi
done
echo "smoke: 3 x 64 KiB round trips verified at $lo, +1 MiB + 4 KiB and $((lo + span - len))"
cp /tmp/smoke.pat "$CXLKV_OUT/pattern.bin"

# --- Shared device: a hands a pattern to b, b answers ---------------------------------------------
[ "${CXLKV_SHARED:-0}" = 1 ] || exit 0
pattern() { yes "cxlkv smoke $CXLKV_RUN_ID from $1" | head -c 4096; }
pattern a >/tmp/pat.a
pattern b >/tmp/pat.b
off_a=$((4 * 1048576))   # a writes here, b reads (both in a's half, apart from its I/O above)
off_b=$((8 * 1048576))   # b writes here, a reads
seen() {  # seen FILE OFFSET: the shared device holds FILE at OFFSET
  daxio -i "$CXLKV_DAX" -o /tmp/seen -k "$2" -l 4096 >/dev/null 2>&1 && cmp -s "$1" /tmp/seen
}
deadline=$(($(cut -d. -f1 /proc/uptime) + 120))
case "$CXLKV_ROLE" in
  a)
    # Keep rewriting until b's answer shows up: b may still be setting its side up.
    until seen /tmp/pat.b "$off_b"; do
      [ "$(cut -d. -f1 /proc/uptime)" -lt "$deadline" ] || fail "no answer from guest b"
      daxio -i /tmp/pat.a -o "$CXLKV_DAX" -s "$off_a" -l 4096 >/dev/null 2>&1 || fail "daxio write"
      sleep 0.5
    done
    echo "smoke: guest a saw guest b's answer through the shared device"
    ;;
  b)
    until seen /tmp/pat.a "$off_a"; do
      [ "$(cut -d. -f1 /proc/uptime)" -lt "$deadline" ] || fail "nothing from guest a"
      sleep 0.5
    done
    daxio -i /tmp/pat.b -o "$CXLKV_DAX" -s "$off_b" -l 4096 >/dev/null 2>&1 || fail "daxio write"
    echo "smoke: guest b saw guest a's pattern and answered"
    ;;
  *) fail "shared topology without a role" ;;
esac

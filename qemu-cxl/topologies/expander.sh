# shellcheck shell=sh disable=SC2034  # the TOPO_* and CXLKV_* variables are read by run/init
# expander: one CXL Type-3 memory expander on one host bridge.
#
#   CFMWS window (4 GiB, 1 target) -- pxb-cxl "cxl.1" -- cxl-rp rp0 -- cxl-type3 mem0 (256 MiB)
#                                                      \- cxl-rp rp1 (empty)
#
# The second root port is there on purpose: with a single dport Linux 6.1 treats the host
# bridge as a passthrough and never programs its HDM decoder, and QEMU 7.2 then routes
# nothing (reads return zeros, every command succeeds).
#
# Guest setup: cxl create-region -m -t pmem -d decoder0.0 -w 1 -g 4096 mem0 -> region0,
# then ndctl create-namespace -m devdax --map=mem -> /dev/dax0.0 (about 254 MiB).
# This file is read by qemu-cxl/run (bash, host side: TOPO_* and topo_qemu_args) and by the
# guest's init (busybox sh: topo_setup), so it stays POSIX sh.

TOPO_DESCRIPTION="one Type-3 expander on a host bridge"
TOPO_HOSTS=1                     # guests booted together
TOPO_ROLES=""                    # CXLKV_ROLE of each guest
TOPO_TIMEOUT_S=120               # boot + setup + default tests + poweroff, generous for CI
TOPO_DEFAULT_TESTS="smoke topology arena"

CXLKV_EXPECT_MEMDEVS=1
CXLKV_EXPECT_REGIONS=1
CXLKV_EXPECT_DAX=1
CXLKV_EXPECT_CLASS=expanded
CXLKV_SHARED=0

# topo_qemu_args DIR ROLE: the QEMU arguments, one per line. DIR is a fresh directory for
# this run's backing files (QEMU creates them); ROLE is this guest's role.
topo_qemu_args() {
  cat <<ARGS
-machine
q35,cxl=on
-object
memory-backend-file,id=cxl-mem0,share=on,mem-path=$1/mem0.raw,size=256M
-object
memory-backend-file,id=cxl-lsa0,share=on,mem-path=$1/lsa0.raw,size=256K
-device
pxb-cxl,bus_nr=12,bus=pcie.0,id=cxl.1
-device
cxl-rp,port=0,bus=cxl.1,id=rp0,chassis=0,slot=2
-device
cxl-rp,port=1,bus=cxl.1,id=rp1,chassis=0,slot=3
-device
cxl-type3,bus=rp0,memdev=cxl-mem0,lsa=cxl-lsa0,id=cxl-pmem0
-M
cxl-fmw.0.targets.0=cxl.1,cxl-fmw.0.size=4G,cxl-fmw.0.interleave-granularity=4k
ARGS
}

# topo_setup: guest side, run by init after the modules are loaded.
topo_setup() {
  cxlkv_wait_memdevs 1 &&
    cxlkv_create_region 1 4096 mem0 &&
    cxlkv_create_devdax
}

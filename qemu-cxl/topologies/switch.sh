# shellcheck shell=sh disable=SC2034  # the TOPO_* and CXLKV_* variables are read by run/init
# switch: a CXL switch with two Type-3 devices, one region interleaved 2 ways across them.
#
#   CFMWS (4 GiB) -- pxb-cxl cxl.1 -- cxl-rp rp0 -- cxl-upstream us0 -- cxl-downstream dsp0 -- mem (256 MiB)
#                                  \- cxl-rp rp1 (empty)            \- cxl-downstream dsp1 -- mem (256 MiB)
#
# Every host bridge and switch keeps at least two ports: Linux 6.1 skips the HDM decoder of a
# component with a single dport (passthrough) and QEMU 7.2 then routes nothing.
#
# Guest setup: cxl create-region -m -t pmem -d decoder0.0 -w 2 -g 4096 memX memY -> region0
# (512 MiB; the switch decoder splits 4 KiB granules between the two devices), then
# ndctl create-namespace -m devdax --map=mem -> /dev/dax0.0 (about 510 MiB).
# POSIX sh: read by qemu-cxl/run (host) and by the guest's init; see expander.sh.

TOPO_DESCRIPTION="a CXL switch with two Type-3 devices, 2-way interleaved region"
TOPO_HOSTS=1
TOPO_ROLES=""
TOPO_TIMEOUT_S=300   # kmem + preload_stress + vllm-offload take minutes when TCG shares a busy machine
TOPO_DEFAULT_TESTS="smoke topology arena kmem vllm-offload"

CXLKV_EXPECT_MEMDEVS=2
CXLKV_EXPECT_REGIONS=1
CXLKV_EXPECT_DAX=1
CXLKV_EXPECT_CLASS=switch-pooled
CXLKV_SHARED=0

topo_qemu_args() {
  cat <<ARGS
-machine
q35,cxl=on
-object
memory-backend-file,id=cxl-mem0,share=on,mem-path=$1/mem0.raw,size=256M
-object
memory-backend-file,id=cxl-mem1,share=on,mem-path=$1/mem1.raw,size=256M
-object
memory-backend-file,id=cxl-lsa0,share=on,mem-path=$1/lsa0.raw,size=256K
-object
memory-backend-file,id=cxl-lsa1,share=on,mem-path=$1/lsa1.raw,size=256K
-device
pxb-cxl,bus_nr=12,bus=pcie.0,id=cxl.1
-device
cxl-rp,port=0,bus=cxl.1,id=rp0,chassis=0,slot=2
-device
cxl-rp,port=1,bus=cxl.1,id=rp1,chassis=0,slot=3
-device
cxl-upstream,bus=rp0,id=us0
-device
cxl-downstream,port=0,bus=us0,id=dsp0,chassis=0,slot=4
-device
cxl-downstream,port=1,bus=us0,id=dsp1,chassis=0,slot=5
-device
cxl-type3,bus=dsp0,memdev=cxl-mem0,lsa=cxl-lsa0,id=cxl-pmem0
-device
cxl-type3,bus=dsp1,memdev=cxl-mem1,lsa=cxl-lsa1,id=cxl-pmem1
-M
cxl-fmw.0.targets.0=cxl.1,cxl-fmw.0.size=4G,cxl-fmw.0.interleave-granularity=4k
ARGS
}

# shellcheck disable=SC2046  # $(cxlkv_memdevs): one argument per memdev
topo_setup() {
  cxlkv_wait_memdevs 2 &&
    cxlkv_create_region 2 4096 $(cxlkv_memdevs) &&
    cxlkv_create_devdax
}

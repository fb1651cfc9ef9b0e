# shellcheck shell=sh disable=SC2034  # the TOPO_* and CXLKV_* variables are read by run/init
# two-host: two guests booted together, each with a switch-attached Type-3 device whose
# memory is the SAME host file (share=on): a switch-pooled device shared by two hosts.
#
#   guest a: CFMWS -- pxb-cxl -- rp0 -- us0 -- dsp0 -- mem0 ---+
#                              \- rp1      \- dsp1 (empty)     +-- $DIR/shared.raw (256 MiB)
#   guest b: (the same)                                     ---+
#
# Each guest has its own fresh LSA file: labels (and so the namespace uuid) are per host, the
# media is common. Both sets of HDM decoders map the device at the same device address, and
# --map=mem keeps each guest's page array in its own RAM, so both /dev/dax0.0 show the same
# bytes at the same offsets. QEMU's sharing is coherent on the host; this topology proves
# mapping and layout compatibility, not cache flushing.
#
# The guests also share a private Ethernet link and nothing else: a virtio-net NIC each,
# joined by a pair of Unix datagram sockets in the run's backing directory (QEMU's
# `-netdev dgram`: no host network, no port to collide with a concurrent run, and either
# guest may boot first — frames sent before the peer is up are dropped, ARP retries).
# Guest a is CXLKV_NET_A, guest b CXLKV_NET_B; each sees its own address as CXLKV_NET_ADDR and
# the other's as CXLKV_NET_PEER. The orchestrator's control plane runs over it (lease-share).
#
# Guest setup, on each guest: cxl create-region -m -t pmem -d decoder0.0 -w 1 -g 4096 mem0
# -> region0, ndctl create-namespace -m devdax --map=mem -> /dev/dax0.0 (about 254 MiB), then
# the link: ip addr add CXLKV_NET_ADDR/24 dev eth0.
# CXLKV_ROLE is a or b. POSIX sh: read by qemu-cxl/run (host) and by the guest's init.

TOPO_DESCRIPTION="two guests sharing one switch-attached Type-3 device (one host file)"
TOPO_HOSTS=2
TOPO_ROLES="a b"
TOPO_TIMEOUT_S=300
TOPO_DEFAULT_TESTS="smoke topology pool-share lease-share lmcache-share"

CXLKV_EXPECT_MEMDEVS=1
CXLKV_EXPECT_REGIONS=1
CXLKV_EXPECT_DAX=1
CXLKV_EXPECT_CLASS=switch-pooled
CXLKV_SHARED=1
CXLKV_NET_A=10.76.0.1
CXLKV_NET_B=10.76.0.2

topo_qemu_args() {
  _peer=b _mac=01
  [ "$2" = b ] && _peer=a _mac=02
  cat <<ARGS
-machine
q35,cxl=on
-object
memory-backend-file,id=cxl-mem0,share=on,mem-path=$1/shared.raw,size=256M
-object
memory-backend-file,id=cxl-lsa0,share=on,mem-path=$1/lsa-$2.raw,size=256K
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
-M
cxl-fmw.0.targets.0=cxl.1,cxl-fmw.0.size=4G,cxl-fmw.0.interleave-granularity=4k
-netdev
dgram,id=net0,local.type=unix,local.path=$1/net-$2.sock,remote.type=unix,remote.path=$1/net-$_peer.sock
-device
virtio-net-pci,bus=pcie.0,netdev=net0,mac=52:54:00:c7:00:$_mac
ARGS
}

topo_setup() {
  if [ "$CXLKV_ROLE" = b ]; then
    CXLKV_NET_ADDR="$CXLKV_NET_B" CXLKV_NET_PEER="$CXLKV_NET_A"
  else
    CXLKV_NET_ADDR="$CXLKV_NET_A" CXLKV_NET_PEER="$CXLKV_NET_B"
  fi
  export CXLKV_NET_ADDR CXLKV_NET_PEER
  hostname "$CXLKV_TOPOLOGY-$CXLKV_ROLE"   # names the guest in the orchestrator's host list
  cxlkv_wait_memdevs 1 &&
    cxlkv_create_region 1 4096 mem0 &&
    cxlkv_create_devdax &&
    cxlkv_net_up "$CXLKV_NET_ADDR/24"
}

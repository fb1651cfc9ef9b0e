// Topology discovery: which CXL, DAX and NUMA memory this host can see, and which of it
// cxlkv can use as a pool source.
//
// DiscoverTopology() asks libcxl (buses, ports, endpoints, memdevs, decoders, regions),
// libdaxctl (dax regions and devices: size, alignment, mode, target node) and libnuma
// (nodes, their CPUs, size and free bytes) -- it never hand-parses sysfs -- and derives
// the usable Sources, each named by its spec string (`devdax:/dev/dax0.0`, `kmem:node=2`)
// and classified `expanded` (host-local Type-3 memory) or `switch-pooled` (memory behind a
// CXL switch, or declared shared by configuration). A host without CXL is a normal outcome,
// not an error: `cxl_present` is false and `emulated_options` lists the `file:` / `memfd:`
// specs to use instead.
//
// Key types: Topology, a plain value made of vectors of small structs (no handles into the
// libraries; copy it, compare it, build it by hand in tests); Source; and Classify(), the
// pure function that derives sources and cross-references from discovered facts.
// Rendering: TopologyToJson() (stable snake_case keys equal to the field names below, sizes in
// bytes as integers: the test oracle and the `cxlkvctl topology --json` output) and
// TopologyToText() (human tables).
//
// Thread-safety: every function is reentrant and may run concurrently; DiscoverTopology()
// creates and releases its own library contexts per call. Everything returns by value.
#ifndef CXLKV_POOL_TOPOLOGY_H_
#define CXLKV_POOL_TOPOLOGY_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace cxlkv::pool {

// A CXL bus: one CXL root (ACPI0017 "root0", or "cxl_test" under emulation).
struct CxlBus {
  std::string name;       // "root0"
  std::string provider;   // "ACPI.CXL"
  std::string root_port;  // name of the bus's root port in Topology::cxl_ports
};

// A CXL port other than an endpoint. libcxl reports every port that is neither the root
// nor an endpoint as a "switch" port, host bridges (depth 1) included; only such a port
// below a host bridge (depth >= 2) is a physical CXL switch. See IsPhysicalSwitch().
struct CxlPort {
  std::string name;    // "root0", "port1"
  std::string bus;     // "root0"
  std::string parent;  // parent port name; empty for a root port
  std::string host;    // the device behind the port (uport), e.g. "pci0000:34"
  int depth = 0;       // 0 for the root, 1 for a host bridge
  bool is_root = false;
  bool libcxl_is_switch = false;  // cxl_port_is_switch(): true for host bridges too
  bool enabled = false;
  int dport_count = 0;
};

// Whether a port is a physical CXL switch (a switch upstream port below a host bridge).
[[nodiscard]] bool IsPhysicalSwitch(const CxlPort& port);

// An endpoint port: where one memdev attaches to the port hierarchy.
struct CxlEndpoint {
  std::string name;         // "endpoint5"
  std::string memdev;       // "mem0"; empty if libcxl cannot tell
  std::string parent_port;  // "port2"
  std::string host;
  bool enabled = false;
};

// A CXL memory device (Type-3 expander).
struct CxlMemdev {
  std::string name;  // "mem0"
  uint64_t serial = 0;
  uint64_t ram_size_bytes = 0;
  uint64_t pmem_size_bytes = 0;
  std::string host;      // PCI device, e.g. "0000:35:00.0"
  int numa_node = -1;    // the device's proximity node, not the node its memory lands in
  std::string bus;       // "root0"
  std::string endpoint;  // "endpoint5"; empty when the endpoint is not enumerated
  // Ports from the endpoint's parent up to and including the root, nearest first.
  std::vector<std::string> port_path;
  bool enabled = false;
};

// An HDM decoder at any level of the hierarchy.
struct CxlDecoder {
  std::string name;    // "decoder0.0"
  std::string port;    // owning port or endpoint
  std::string kind;    // "root", "host-bridge", "switch" or "endpoint"
  std::string mode;    // "ram", "pmem", "mixed" or "none"
  uint64_t start = 0;  // host physical address; 0 when unknown
  uint64_t size_bytes = 0;
  uint32_t interleave_ways = 0;
  uint32_t interleave_granularity = 0;
  std::string target_type;  // "expander", "accelerator" or "unknown"
  std::string region;       // region this decoder takes part in; empty if none
  std::string memdev;       // endpoint decoders only
};

// A CXL region: host physical address space decoded across one or more memdevs.
struct CxlRegion {
  std::string name;          // "region0"
  std::string bus;           // "root0"
  std::string root_decoder;  // "decoder0.0"
  std::string mode;          // "ram" or "pmem" (from its endpoint decoders); "none" if unknown
  uint64_t start = 0;        // host physical address; 0 when unknown
  uint64_t size_bytes = 0;
  uint32_t interleave_ways = 0;
  uint32_t interleave_granularity = 0;
  bool committed = false;
  bool enabled = false;
  std::vector<std::string> memdevs;  // in interleave position order
  // Derived by Classify(): physical switch ports between the memdevs and the root, and the
  // dax devices whose address range lies inside the region.
  std::vector<std::string> switch_ports;
  std::vector<std::string> dax_devices;
};

struct DaxRegion {
  int id = -1;
  std::string name;  // libdaxctl's device name, e.g. "region0"
  std::string path;  // sysfs path, as libdaxctl reports it
  uint64_t size_bytes = 0;
  uint64_t available_size_bytes = 0;
  uint64_t align_bytes = 0;
  std::vector<std::string> devices;  // "dax0.0", ...
};

struct DaxDevice {
  std::string name;      // "dax0.0"
  std::string dev_path;  // "/dev/dax0.0"
  int region_id = -1;
  uint64_t size_bytes = 0;
  uint64_t align_bytes = 0;
  uint64_t start = 0;    // host physical address of the first mapping; 0 when unknown
  std::string mode;      // "devdax" or "system-ram"
  int target_node = -1;  // NUMA node the memory belongs to (system-ram: where it onlines)
  bool enabled = false;
  std::string cxl_region;  // derived by Classify(); empty when no CXL region contains it
};

struct NumaNode {
  int id = 0;
  uint64_t size_bytes = 0;
  uint64_t free_bytes = 0;
  int cpu_count = 0;                     // 0 means CPU-less (kmem / system-ram memory, HBM, ...)
  bool mems_allowed = false;             // this process's cpuset lets it allocate here
  std::vector<std::string> dax_devices;  // derived: system-ram dax devices onlined here
};

enum class SourceClass { kExpanded, kSwitchPooled };

// "expanded" or "switch-pooled".
[[nodiscard]] absl::string_view SourceClassName(SourceClass c);

// One memory source cxlkv can carve arenas from.
struct Source {
  std::string spec;  // "devdax:/dev/dax0.0" or "kmem:node=2"
  uint64_t size_bytes = 0;
  uint64_t align_bytes = 0;
  SourceClass classification = SourceClass::kExpanded;
  std::string classification_reason;     // always set: why this class was chosen
  std::vector<std::string> cxl_regions;  // the CXL regions backing it, when known
};

struct Topology {
  bool cxl_present = false;
  std::string cxl_absent_reason;  // empty when cxl_present
  std::vector<CxlBus> cxl_buses;
  std::vector<CxlPort> cxl_ports;
  std::vector<CxlEndpoint> cxl_endpoints;
  std::vector<CxlMemdev> cxl_memdevs;
  std::vector<CxlDecoder> cxl_decoders;
  std::vector<CxlRegion> cxl_regions;
  std::vector<DaxRegion> dax_regions;
  std::vector<DaxDevice> dax_devices;
  bool numa_available = false;
  std::vector<NumaNode> numa_nodes;  // nodes with memory only
  std::vector<Source> sources;       // derived by Classify()
  // Emulated specs usable on any host, e.g. "memfd:?size=8G" (see EmulatedOptions()).
  std::vector<std::string> emulated_options;
  // Things an operator should know that did not stop discovery (library log lines, a
  // declared-shared spec that matched nothing, a node the cpuset forbids, ...).
  std::vector<std::string> warnings;
};

struct DiscoverOptions {
  // Specs (exact strings, e.g. "devdax:/dev/dax0.0") to classify switch-pooled whatever the
  // CXL hierarchy says: media shared by several hosts without a switch (multi-headed
  // devices) or known shared by configuration.
  std::vector<std::string> declared_shared;
};

// Discovers the CXL hierarchy, DAX devices and NUMA nodes of this host, then Classify()s and
// fills emulated_options. A host with no CXL, no DAX or a single NUMA node is a success with
// empty lists; library log lines and non-fatal oddities land in Topology::warnings.
// Errors: a library context that cannot be created although its sysfs bus exists
// (/sys/bus/cxl, /sys/bus/dax) gives the errno's status code with the library named, e.g.
// "libcxl: cxl_new: cannot create a context although /sys/bus/cxl exists; ...: Out of memory".
// Cost: walks sysfs through the libraries; milliseconds. Not for hot paths.
[[nodiscard]] absl::StatusOr<Topology> DiscoverTopology(const DiscoverOptions& opts = {});

// Derives, from the discovered facts in `topo`, everything marked "derived" above:
// CxlRegion::switch_ports and ::dax_devices, DaxDevice::cxl_region, NumaNode::dax_devices,
// and Topology::sources (recomputed from scratch). Sources are enabled devdax devices and
// CPU-less memory nodes this process may allocate on. A source is switch-pooled when a CXL
// region behind it decodes through a physical switch port, or when its spec is listed in
// `declared_shared`; otherwise expanded. Appends a warning for each declared spec that
// matches no source. Pure apart from reading the page size (the alignment of kmem sources);
// safe on synthetic input, and idempotent.
[[nodiscard]] Topology Classify(Topology topo, const std::vector<std::string>& declared_shared);

// Emulated specs for a host with `free_bytes` of free memory: "file:/dev/shm/cxlkv-pool0?
// size=NG" (only when /dev/shm has at least 1 GiB available, and capped by that) and
// "memfd:?size=NG".
// N is half the free memory (so the pool and the serving process both fit) rounded down to
// a power of two GiB, and at least 1. Pure.
[[nodiscard]] std::vector<std::string> EmulatedOptions(uint64_t free_bytes,
                                                       std::optional<uint64_t> shm_available_bytes);

// The topology as JSON text; `indent` < 0 gives one line. Keys are sorted and stable: the top
// level has "cxl_present", "cxl_absent_reason", "cxl" {"buses", "ports", "endpoints",
// "memdevs", "decoders", "regions"}, "dax" {"regions", "devices"}, "numa" {"available",
// "nodes"}, "sources", "emulated_options" and "warnings"; each element's keys are its struct's
// field names, plus "is_switch" (IsPhysicalSwitch) on ports and "cpu_less" on NUMA nodes.
// Sizes and addresses are integers (bytes). Never fails; invalid UTF-8 is replaced.
[[nodiscard]] std::string TopologyToJson(const Topology& topo, int indent = 2);

// The topology as human-readable tables, ending with the usable and emulated sources.
[[nodiscard]] std::string TopologyToText(const Topology& topo);

}  // namespace cxlkv::pool

#endif  // CXLKV_POOL_TOPOLOGY_H_

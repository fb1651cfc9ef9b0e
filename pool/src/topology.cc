// Topology discovery through libcxl, libdaxctl and libnuma, the pure classification of
// sources, and the JSON / text renderings. See cxlkv/pool/topology.h for the contracts.
#include "cxlkv/pool/topology.h"

#include <cxl/libcxl.h>
#include <daxctl/libdaxctl.h>
#include <numa.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdarg>
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace cxlkv::pool {
namespace {

constexpr uint64_t kGiB = uint64_t{1} << 30;
constexpr char kCxlSysfs[] = "/sys/bus/cxl";
constexpr char kDaxSysfs[] = "/sys/bus/dax";
constexpr char kShmDir[] = "/dev/shm";

std::string Str(const char* s) { return s != nullptr ? s : ""; }
std::string MemdevName(cxl_memdev* m) { return m != nullptr ? Str(cxl_memdev_get_devname(m)) : ""; }
std::string PortName(cxl_port* p) { return p != nullptr ? Str(cxl_port_get_devname(p)) : ""; }

// libcxl reports "unknown" as all-ones; the structs use 0.
uint64_t Known(unsigned long long v) { return v == ULLONG_MAX ? 0 : v; }
uint32_t Known32(unsigned int v) { return v == UINT_MAX ? 0 : v; }

// Library log lines go to Topology::warnings (set as the context's userdata), not to stderr.
template <typename Ctx, void* (*kGetUserdata)(Ctx*), const char* kLib>
void LogToWarnings(Ctx* ctx, int /*priority*/, const char* /*file*/, int /*line*/, const char* fn,
                   const char* format, va_list args) {
  char buf[512];
  std::vsnprintf(buf, sizeof(buf), format, args);
  std::string line = absl::StrCat(kLib, ": ", fn != nullptr ? fn : "", ": ", buf);
  while (!line.empty() && line.back() == '\n') line.pop_back();
  static_cast<std::vector<std::string>*>(kGetUserdata(ctx))->push_back(std::move(line));
}
constexpr char kLibCxl[] = "libcxl";
constexpr char kLibDaxctl[] = "libdaxctl";

std::string PortKind(cxl_port* port) {
  if (cxl_port_is_root(port)) return "root";
  if (cxl_port_is_endpoint(port)) return "endpoint";
  return cxl_port_get_depth(port) >= 2 ? "switch" : "host-bridge";
}

void AddDecoders(cxl_port* port, Topology* t) {
  const std::string kind = PortKind(port);
  cxl_decoder* d;
  cxl_decoder_foreach(port, d) {
    CxlDecoder out;
    out.name = Str(cxl_decoder_get_devname(d));
    out.port = PortName(port);
    out.kind = kind;
    out.mode = cxl_decoder_mode_name(cxl_decoder_get_mode(d));
    out.start = Known(cxl_decoder_get_resource(d));
    out.size_bytes = Known(cxl_decoder_get_size(d));
    out.interleave_ways = Known32(cxl_decoder_get_interleave_ways(d));
    out.interleave_granularity = Known32(cxl_decoder_get_interleave_granularity(d));
    const cxl_decoder_target_type type = cxl_decoder_get_target_type(d);
    out.target_type = type == CXL_DECODER_TTYPE_EXPANDER      ? "expander"
                      : type == CXL_DECODER_TTYPE_ACCELERATOR ? "accelerator"
                                                              : "unknown";
    if (cxl_region* r = cxl_decoder_get_region(d); r != nullptr) {
      out.region = Str(cxl_region_get_devname(r));
    }
    out.memdev = MemdevName(cxl_decoder_get_memdev(d));  // NULL unless an endpoint decoder
    t->cxl_decoders.push_back(std::move(out));
  }
}

void AddRegions(cxl_port* root, const std::string& bus, Topology* t) {
  cxl_decoder* d;
  cxl_decoder_foreach(root, d) {
    cxl_region* r;
    cxl_region_foreach(d, r) {
      CxlRegion out;
      out.name = Str(cxl_region_get_devname(r));
      out.bus = bus;
      out.root_decoder = Str(cxl_decoder_get_devname(d));
      out.mode = "none";
      out.start = Known(cxl_region_get_resource(r));
      out.size_bytes = Known(cxl_region_get_size(r));
      out.interleave_ways = Known32(cxl_region_get_interleave_ways(r));
      out.interleave_granularity = Known32(cxl_region_get_interleave_granularity(r));
      out.committed = cxl_region_decode_is_committed(r) > 0;
      out.enabled = cxl_region_is_enabled(r) > 0;
      // libcxl v76 has no cxl_region_get_mode(); the endpoint decoders carry the mode.
      std::map<unsigned int, std::string> by_position;
      cxl_memdev_mapping* m;
      cxl_mapping_foreach(r, m) {
        cxl_decoder* ep_decoder = cxl_mapping_get_decoder(m);
        if (ep_decoder == nullptr) continue;
        if (out.mode == "none") out.mode = cxl_decoder_mode_name(cxl_decoder_get_mode(ep_decoder));
        by_position[cxl_mapping_get_position(m)] = MemdevName(cxl_decoder_get_memdev(ep_decoder));
      }
      for (auto& [pos, name] : by_position) out.memdevs.push_back(std::move(name));
      t->cxl_regions.push_back(std::move(out));
    }
  }
}

void AddPortAndEndpoints(cxl_port* port, const std::string& bus, Topology* t) {
  t->cxl_ports.push_back({.name = PortName(port),
                          .bus = bus,
                          .parent = PortName(cxl_port_get_parent(port)),
                          .host = Str(cxl_port_get_host(port)),
                          .depth = cxl_port_get_depth(port),
                          .is_root = cxl_port_is_root(port),
                          .libcxl_is_switch = cxl_port_is_switch(port),
                          .enabled = cxl_port_is_enabled(port) > 0,
                          .dport_count = cxl_port_get_nr_dports(port)});
  AddDecoders(port, t);
  cxl_endpoint* ep;
  cxl_endpoint_foreach(port, ep) {
    t->cxl_endpoints.push_back({.name = Str(cxl_endpoint_get_devname(ep)),
                                .memdev = MemdevName(cxl_endpoint_get_memdev(ep)),
                                .parent_port = PortName(port),
                                .host = Str(cxl_endpoint_get_host(ep)),
                                .enabled = cxl_endpoint_is_enabled(ep) > 0});
    AddDecoders(cxl_endpoint_get_port(ep), t);
  }
}

absl::Status DiscoverCxl(Topology* t) {
  const bool sysfs_present = std::filesystem::exists(kCxlSysfs);
  cxl_ctx* raw = nullptr;
  const std::string absent_reason =
      sysfs_present ? absl::StrCat(kCxlSysfs,
                                   " exists but libcxl finds no CXL bus or memory device: no CXL "
                                   "hardware, or cxl_acpi/cxl_pci are not bound")
                    : absl::StrCat("no ", kCxlSysfs,
                                   ": the cxl_acpi/cxl_pci drivers are not loaded or there is no "
                                   "CXL hardware");
  if (int rc = cxl_new(&raw); rc < 0) {
    t->cxl_absent_reason = absent_reason;
    if (!sysfs_present) return absl::OkStatus();  // no CXL: a context is not needed
    return absl::ErrnoToStatus(
        -rc, absl::StrCat("libcxl: cxl_new: cannot create a context although ", kCxlSysfs,
                          " exists; check that libkmod works"));
  }
  std::unique_ptr<cxl_ctx, decltype(&cxl_unref)> ctx(raw, &cxl_unref);
  cxl_set_userdata(ctx.get(), &t->warnings);
  cxl_set_log_fn(ctx.get(), LogToWarnings<cxl_ctx, cxl_get_userdata, kLibCxl>);

  cxl_bus* bus;
  cxl_bus_foreach(ctx.get(), bus) {
    cxl_port* root = cxl_bus_get_port(bus);
    CxlBus b{Str(cxl_bus_get_devname(bus)), Str(cxl_bus_get_provider(bus)), PortName(root)};
    AddPortAndEndpoints(root, b.name, t);
    AddRegions(root, b.name, t);
    cxl_port* port;
    cxl_port_foreach_all(root, port) { AddPortAndEndpoints(port, b.name, t); }
    t->cxl_buses.push_back(std::move(b));
  }

  cxl_memdev* m;
  cxl_memdev_foreach(ctx.get(), m) {
    CxlMemdev out;
    out.name = Str(cxl_memdev_get_devname(m));
    out.serial = Known(cxl_memdev_get_serial(m));
    out.ram_size_bytes = Known(cxl_memdev_get_ram_size(m));
    out.pmem_size_bytes = Known(cxl_memdev_get_pmem_size(m));
    out.host = Str(cxl_memdev_get_host(m));
    out.numa_node = cxl_memdev_get_numa_node(m);
    if (cxl_bus* b = cxl_memdev_get_bus(m); b != nullptr) out.bus = Str(cxl_bus_get_devname(b));
    out.enabled = cxl_memdev_is_enabled(m) > 0;
    if (cxl_endpoint* ep = cxl_memdev_get_endpoint(m); ep != nullptr) {
      out.endpoint = Str(cxl_endpoint_get_devname(ep));
      for (cxl_port* p = cxl_endpoint_get_parent(ep); p != nullptr; p = cxl_port_get_parent(p)) {
        out.port_path.push_back(PortName(p));
      }
    }
    t->cxl_memdevs.push_back(std::move(out));
  }

  t->cxl_present = !t->cxl_buses.empty() || !t->cxl_memdevs.empty();
  if (!t->cxl_present) t->cxl_absent_reason = absent_reason;
  return absl::OkStatus();
}

absl::Status DiscoverDax(Topology* t) {
  daxctl_ctx* raw = nullptr;
  if (int rc = daxctl_new(&raw); rc < 0) {
    if (!std::filesystem::exists(kDaxSysfs)) return absl::OkStatus();
    return absl::ErrnoToStatus(-rc, absl::StrCat("libdaxctl: daxctl_new: cannot create a context "
                                                 "although ",
                                                 kDaxSysfs, " exists; check that libkmod works"));
  }
  std::unique_ptr<daxctl_ctx, decltype(&daxctl_unref)> ctx(raw, &daxctl_unref);
  daxctl_set_userdata(ctx.get(), &t->warnings);
  daxctl_set_log_fn(ctx.get(), LogToWarnings<daxctl_ctx, daxctl_get_userdata, kLibDaxctl>);

  daxctl_region* region;
  daxctl_region_foreach(ctx.get(), region) {
    DaxRegion r;
    r.id = daxctl_region_get_id(region);
    r.name = Str(daxctl_region_get_devname(region));
    r.path = Str(daxctl_region_get_path(region));
    r.size_bytes = Known(daxctl_region_get_size(region));
    r.available_size_bytes = Known(daxctl_region_get_available_size(region));
    r.align_bytes = daxctl_region_get_align(region);
    daxctl_dev* dev;
    daxctl_dev_foreach(region, dev) {
      DaxDevice d;
      d.name = Str(daxctl_dev_get_devname(dev));
      d.dev_path = absl::StrCat("/dev/", d.name);
      d.region_id = r.id;
      d.size_bytes = Known(daxctl_dev_get_size(dev));
      d.align_bytes = daxctl_dev_get_align(dev);
      if (d.align_bytes == 0) d.align_bytes = r.align_bytes;
      d.start = Known(daxctl_dev_get_resource(dev));
      // libdaxctl hands out a memory object only for a device bound to kmem.
      d.mode = daxctl_dev_get_memory(dev) != nullptr ? "system-ram" : "devdax";
      d.target_node = daxctl_dev_get_target_node(dev);
      d.enabled = daxctl_dev_is_enabled(dev) > 0;
      r.devices.push_back(d.name);
      t->dax_devices.push_back(std::move(d));
    }
    t->dax_regions.push_back(std::move(r));
  }
  return absl::OkStatus();
}

void DiscoverNuma(Topology* t) {
  t->numa_available = numa_available() >= 0;
  if (!t->numa_available) {
    t->warnings.push_back(
        "libnuma: numa_available() < 0: this kernel or sandbox offers no NUMA API; kmem sources "
        "cannot be discovered");
    return;
  }
  std::unique_ptr<bitmask, decltype(&numa_free_cpumask)> cpus(numa_allocate_cpumask(),
                                                              &numa_free_cpumask);
  for (int node = 0; node <= numa_max_node(); ++node) {
    if (numa_bitmask_isbitset(numa_nodes_ptr, static_cast<unsigned>(node)) == 0) continue;
    long long free_bytes = 0;
    const long long size_bytes = numa_node_size64(node, &free_bytes);
    if (size_bytes <= 0) continue;  // memoryless node
    NumaNode n;
    n.id = node;
    n.size_bytes = static_cast<uint64_t>(size_bytes);
    n.free_bytes = static_cast<uint64_t>(std::max(free_bytes, 0LL));
    numa_bitmask_clearall(cpus.get());
    if (numa_node_to_cpus(node, cpus.get()) == 0) {
      n.cpu_count = static_cast<int>(numa_bitmask_weight(cpus.get()));
    } else {
      t->warnings.emplace_back(
          absl::ErrnoToStatus(errno, absl::StrCat("libnuma: numa_node_to_cpus(", node, ")"))
              .message());
    }
    n.mems_allowed = numa_bitmask_isbitset(numa_all_nodes_ptr, static_cast<unsigned>(node)) != 0;
    t->numa_nodes.push_back(std::move(n));
  }
}

uint64_t FreeHostBytes(const Topology& t) {
  uint64_t free_bytes = 0;
  for (const NumaNode& n : t.numa_nodes) {
    if (n.cpu_count > 0) free_bytes += n.free_bytes;
  }
  // Without libnuma: the kernel's count of free pages.
  return free_bytes != 0 ? free_bytes
                         : static_cast<uint64_t>(std::max(sysconf(_SC_AVPHYS_PAGES), 0L)) *
                               static_cast<uint64_t>(std::max(sysconf(_SC_PAGESIZE), 0L));
}

uint64_t FloorPow2GiB(uint64_t bytes) {
  uint64_t gib = 1;
  while (gib * 2 * kGiB <= bytes) gib *= 2;
  return gib;
}

template <typename T>
const T* FindByName(const std::vector<T>& items, absl::string_view name) {
  for (const T& item : items) {
    if (item.name == name) return &item;
  }
  return nullptr;
}

// A source backed by `regions` (possibly none; `what` names the device or node for the
// reason), classified by whether any of those regions decodes through a physical switch.
Source MakeSource(const Topology& t, std::string spec, uint64_t size_bytes, uint64_t align_bytes,
                  std::vector<std::string> regions, const std::string& what) {
  std::vector<std::string> switches;
  for (const std::string& name : regions) {
    if (const CxlRegion* r = FindByName(t.cxl_regions, name); r != nullptr) {
      switches.insert(switches.end(), r->switch_ports.begin(), r->switch_ports.end());
    }
  }
  std::string reason =
      regions.empty() ? absl::StrCat("no CXL region found for ", what, "; treating as host-local")
      : switches.empty()
          ? absl::StrCat(absl::StrJoin(regions, ","), " decodes through host bridges only")
          : absl::StrCat(absl::StrJoin(regions, ","), " decodes through switch port ",
                         absl::StrJoin(switches, ","));
  return {.spec = std::move(spec),
          .size_bytes = size_bytes,
          .align_bytes = align_bytes,
          .classification = switches.empty() ? SourceClass::kExpanded : SourceClass::kSwitchPooled,
          .classification_reason = std::move(reason),
          .cxl_regions = std::move(regions)};
}

}  // namespace

bool IsPhysicalSwitch(const CxlPort& port) {
  return !port.is_root && port.libcxl_is_switch && port.depth >= 2;
}

absl::string_view SourceClassName(SourceClass c) {
  return c == SourceClass::kSwitchPooled ? "switch-pooled" : "expanded";
}

Topology Classify(Topology t, const std::vector<std::string>& declared_shared) {
  t.sources.clear();
  // Regions: which physical switches their memdevs sit behind.
  for (CxlRegion& r : t.cxl_regions) {
    std::set<std::string> switches;
    for (const std::string& memdev : r.memdevs) {
      const CxlMemdev* m = FindByName(t.cxl_memdevs, memdev);
      if (m == nullptr) continue;
      for (const std::string& port_name : m->port_path) {
        const CxlPort* p = FindByName(t.cxl_ports, port_name);
        if (p != nullptr && IsPhysicalSwitch(*p)) switches.insert(port_name);
      }
    }
    r.switch_ports.assign(switches.begin(), switches.end());
    r.dax_devices.clear();
  }
  // DAX devices: the CXL region whose address range contains them (libcxl v76 has no
  // cxl_region_get_daxctl_region()), and the node a system-ram device onlines into.
  for (NumaNode& n : t.numa_nodes) n.dax_devices.clear();
  for (DaxDevice& d : t.dax_devices) {
    d.cxl_region.clear();
    for (CxlRegion& r : t.cxl_regions) {
      if (d.start != 0 && r.start != 0 && d.start >= r.start &&
          d.start + d.size_bytes <= r.start + r.size_bytes) {
        d.cxl_region = r.name;
        r.dax_devices.push_back(d.name);
        break;
      }
    }
    for (NumaNode& n : t.numa_nodes) {
      if (d.mode == "system-ram" && n.id == d.target_node) n.dax_devices.push_back(d.name);
    }
  }

  for (const DaxDevice& d : t.dax_devices) {
    if (d.mode != "devdax" || !d.enabled || d.size_bytes == 0) continue;
    std::vector<std::string> regions;
    if (!d.cxl_region.empty()) regions.push_back(d.cxl_region);
    t.sources.push_back(MakeSource(t, absl::StrCat("devdax:", d.dev_path), d.size_bytes,
                                   d.align_bytes, std::move(regions), d.name));
  }
  const long page_size = sysconf(_SC_PAGESIZE);
  for (const NumaNode& n : t.numa_nodes) {
    if (n.cpu_count != 0) continue;
    const std::string spec = absl::StrCat("kmem:node=", n.id);
    if (!n.mems_allowed) {
      t.warnings.push_back(absl::StrCat("node ", n.id,
                                        " has CPU-less memory but this process's "
                                        "cpuset does not allow it (Mems_allowed); ",
                                        spec, " is not usable here"));
      continue;
    }
    std::vector<std::string> regions;
    for (const std::string& dax : n.dax_devices) {
      const DaxDevice* d = FindByName(t.dax_devices, dax);
      if (d != nullptr && !d->cxl_region.empty()) regions.push_back(d->cxl_region);
    }
    t.sources.push_back(MakeSource(t, spec, n.size_bytes,
                                   page_size > 0 ? static_cast<uint64_t>(page_size) : 4096,
                                   std::move(regions), absl::StrCat("node ", n.id)));
  }

  for (const std::string& spec : declared_shared) {
    auto it = std::find_if(t.sources.begin(), t.sources.end(),
                           [&](const Source& s) { return s.spec == spec; });
    if (it == t.sources.end()) {
      t.warnings.push_back(absl::StrCat("declared shared source ", spec,
                                        " matches no discovered source; check the spec spelling "
                                        "against `cxlkvctl topology`"));
      continue;
    }
    it->classification = SourceClass::kSwitchPooled;
    it->classification_reason = "declared shared by configuration";
  }
  return t;
}

std::vector<std::string> EmulatedOptions(uint64_t free_bytes,
                                         std::optional<uint64_t> shm_available_bytes) {
  const uint64_t gib = FloorPow2GiB(free_bytes / 2);
  std::vector<std::string> out;
  if (shm_available_bytes.has_value() && *shm_available_bytes >= kGiB) {
    const uint64_t shm_gib = std::min(gib, FloorPow2GiB(*shm_available_bytes));
    out.push_back(absl::StrCat("file:", kShmDir, "/cxlkv-pool0?size=", shm_gib, "G"));
  }
  out.push_back(absl::StrCat("memfd:?size=", gib, "G"));
  return out;
}

absl::StatusOr<Topology> DiscoverTopology(const DiscoverOptions& opts) {
  Topology t;
  if (absl::Status s = DiscoverCxl(&t); !s.ok()) return s;
  if (absl::Status s = DiscoverDax(&t); !s.ok()) return s;
  DiscoverNuma(&t);
  t = Classify(std::move(t), opts.declared_shared);
  std::optional<uint64_t> shm_available;
  if (struct statvfs vfs; statvfs(kShmDir, &vfs) == 0) {
    shm_available = static_cast<uint64_t>(vfs.f_bavail) * vfs.f_frsize;
  }
  t.emulated_options = EmulatedOptions(FreeHostBytes(t), shm_available);
  return t;
}

// ---- Rendering -------------------------------------------------------------------------

// JSON keys are the struct field names (snake_case), so the header documents the schema.
// These must sit in the types' namespace for nlohmann's ADL lookup.
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(CxlBus, name, provider, root_port)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(CxlPort, name, bus, parent, host, depth, is_root,
                                   libcxl_is_switch, enabled, dport_count)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(CxlEndpoint, name, memdev, parent_port, host, enabled)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(CxlMemdev, name, serial, ram_size_bytes, pmem_size_bytes, host,
                                   numa_node, bus, endpoint, port_path, enabled)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(CxlDecoder, name, port, kind, mode, start, size_bytes,
                                   interleave_ways, interleave_granularity, target_type, region,
                                   memdev)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(CxlRegion, name, bus, root_decoder, mode, start, size_bytes,
                                   interleave_ways, interleave_granularity, committed, enabled,
                                   memdevs, switch_ports, dax_devices)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(DaxRegion, id, name, path, size_bytes, available_size_bytes,
                                   align_bytes, devices)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(DaxDevice, name, dev_path, region_id, size_bytes, align_bytes,
                                   start, mode, target_node, enabled, cxl_region)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(NumaNode, id, size_bytes, free_bytes, cpu_count, mems_allowed,
                                   dax_devices)
NLOHMANN_JSON_SERIALIZE_ENUM(SourceClass, {{SourceClass::kExpanded, "expanded"},
                                           {SourceClass::kSwitchPooled, "switch-pooled"}})
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(Source, spec, size_bytes, align_bytes, classification,
                                   classification_reason, cxl_regions)

namespace {

nlohmann::json ToJson(const Topology& t) {
  nlohmann::json j = {{"cxl_present", t.cxl_present},
                      {"cxl_absent_reason", t.cxl_absent_reason},
                      {"cxl",
                       {{"buses", t.cxl_buses},
                        {"ports", t.cxl_ports},
                        {"endpoints", t.cxl_endpoints},
                        {"memdevs", t.cxl_memdevs},
                        {"decoders", t.cxl_decoders},
                        {"regions", t.cxl_regions}}},
                      {"dax", {{"regions", t.dax_regions}, {"devices", t.dax_devices}}},
                      {"numa", {{"available", t.numa_available}, {"nodes", t.numa_nodes}}},
                      {"sources", t.sources},
                      {"emulated_options", t.emulated_options},
                      {"warnings", t.warnings}};
  // Facts a reader should not have to recompute.
  for (size_t i = 0; i < t.cxl_ports.size(); ++i) {
    j["cxl"]["ports"][i]["is_switch"] = IsPhysicalSwitch(t.cxl_ports[i]);
  }
  for (size_t i = 0; i < t.numa_nodes.size(); ++i) {
    j["numa"]["nodes"][i]["cpu_less"] = t.numa_nodes[i].cpu_count == 0;
  }
  return j;
}

std::string HumanBytes(uint64_t bytes) {
  static constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  double value = static_cast<double>(bytes);
  size_t unit = 0;
  for (; value >= 1024 && unit + 1 < std::size(kUnits); ++unit) value /= 1024;
  char buf[32];
  std::snprintf(buf, sizeof(buf), unit == 0 ? "%.0f %s" : "%.1f %s", value, kUnits[unit]);
  return buf;
}

std::string Hex(uint64_t v) { return absl::StrCat("0x", absl::Hex(v)); }

std::string OrDash(const std::string& s) { return s.empty() ? "-" : s; }

using Rows = std::vector<std::vector<std::string>>;

// Appends "title:" and `rows` (the first is the header) as left-aligned columns indented by
// two spaces, or "title: none" when there is only the header.
void AppendSection(absl::string_view title, const Rows& rows, std::string* out) {
  absl::StrAppend(out, title);
  if (rows.size() <= 1) {
    out->append(": none\n\n");
    return;
  }
  out->append(":\n");
  std::vector<size_t> widths;
  for (const auto& row : rows) {
    widths.resize(std::max(widths.size(), row.size()), 0);
    for (size_t i = 0; i < row.size(); ++i) widths[i] = std::max(widths[i], row[i].size());
  }
  for (const auto& row : rows) {
    out->append("  ");
    for (size_t i = 0; i < row.size(); ++i) {
      out->append(row[i]);
      if (i + 1 < row.size()) out->append(widths[i] - row[i].size() + 2, ' ');
    }
    out->append("\n");
  }
  out->append("\n");
}

}  // namespace

std::string TopologyToJson(const Topology& topo, int indent) {
  return ToJson(topo).dump(indent, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::string TopologyToText(const Topology& t) {
  std::string out;
  if (!t.cxl_present) {
    out += "CXL: none found (see below)\n\n";
  } else {
    absl::StrAppend(&out, "CXL: ", t.cxl_buses.size(), " bus(es), ", t.cxl_memdevs.size(),
                    " memdev(s), ", t.cxl_regions.size(), " region(s), ", t.cxl_decoders.size(),
                    " decoder(s) (decoders: see --json)\n\n");
    Rows ports = {{"PORT", "BUS", "KIND", "PARENT", "HOST"}};
    for (const CxlPort& p : t.cxl_ports) {
      const char* kind = p.is_root ? "root" : IsPhysicalSwitch(p) ? "switch" : "host-bridge";
      ports.push_back({p.name, p.bus, kind, OrDash(p.parent), OrDash(p.host)});
    }
    AppendSection("CXL ports", ports, &out);
    Rows mems = {{"MEMDEV", "SERIAL", "RAM", "PMEM", "HOST", "ENDPOINT", "PORT PATH"}};
    for (const CxlMemdev& m : t.cxl_memdevs) {
      mems.push_back({m.name, Hex(m.serial), HumanBytes(m.ram_size_bytes),
                      HumanBytes(m.pmem_size_bytes), OrDash(m.host), OrDash(m.endpoint),
                      OrDash(absl::StrJoin(m.port_path, " > "))});
    }
    AppendSection("CXL memdevs", mems, &out);
    Rows regions = {
        {"REGION", "MODE", "START", "SIZE", "WAYS", "GRAN", "MEMDEVS", "SWITCHES", "DAX"}};
    for (const CxlRegion& r : t.cxl_regions) {
      regions.push_back(
          {r.name, r.mode, Hex(r.start), HumanBytes(r.size_bytes), absl::StrCat(r.interleave_ways),
           absl::StrCat(r.interleave_granularity), OrDash(absl::StrJoin(r.memdevs, ",")),
           OrDash(absl::StrJoin(r.switch_ports, ",")), OrDash(absl::StrJoin(r.dax_devices, ","))});
    }
    AppendSection("CXL regions", regions, &out);
  }
  Rows devs = {{"DEVICE", "PATH", "SIZE", "ALIGN", "MODE", "NODE", "ENABLED", "CXL REGION"}};
  for (const DaxDevice& d : t.dax_devices) {
    devs.push_back({d.name, d.dev_path, HumanBytes(d.size_bytes), HumanBytes(d.align_bytes), d.mode,
                    d.target_node < 0 ? "-" : absl::StrCat(d.target_node), d.enabled ? "yes" : "no",
                    OrDash(d.cxl_region)});
  }
  AppendSection("DAX devices", devs, &out);
  Rows nodes = {{"NODE", "CPUS", "SIZE", "FREE", "KIND"}};
  for (const NumaNode& n : t.numa_nodes) {
    nodes.push_back({absl::StrCat(n.id), absl::StrCat(n.cpu_count), HumanBytes(n.size_bytes),
                     HumanBytes(n.free_bytes), n.cpu_count == 0 ? "cpu-less" : "cpu"});
  }
  AppendSection(t.numa_available ? "NUMA nodes with memory" : "NUMA (not available)", nodes, &out);
  Rows srcs = {{"SPEC", "SIZE", "ALIGN", "CLASS", "REASON"}};
  for (const Source& s : t.sources) {
    srcs.push_back({s.spec, HumanBytes(s.size_bytes), HumanBytes(s.align_bytes),
                    std::string(SourceClassName(s.classification)), s.classification_reason});
  }
  AppendSection("Sources", srcs, &out);
  if (!t.cxl_present) {
    absl::StrAppend(&out, "No CXL devices found (", t.cxl_absent_reason,
                    "). Emulated sources you can use instead:\n");
  } else {
    out += "Emulated sources (no hardware needed):\n";
  }
  for (const std::string& spec : t.emulated_options) absl::StrAppend(&out, "  ", spec, "\n");
  if (!t.warnings.empty()) out += "\nWarnings:\n";
  for (const std::string& w : t.warnings) absl::StrAppend(&out, "  ", w, "\n");
  return out;
}

}  // namespace cxlkv::pool

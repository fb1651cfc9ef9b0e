// Tests for pool topology discovery: discovery on this host (no hardware needed), the JSON
// oracle's keys, and Classify() on synthetic CXL hierarchies.
#include "cxlkv/pool/topology.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace cxlkv::pool {
namespace {

constexpr uint64_t kGiB = uint64_t{1} << 30;

// ---- Discovery on the host running the test --------------------------------------------

TEST(DiscoverTopologyTest, SucceedsOnThisHost) {
  absl::StatusOr<Topology> topo = DiscoverTopology();
  ASSERT_TRUE(topo.ok()) << topo.status();
  EXPECT_FALSE(topo->emulated_options.empty());
  if (topo->cxl_present) {
    EXPECT_TRUE(topo->cxl_absent_reason.empty());
  } else {
    EXPECT_FALSE(topo->cxl_absent_reason.empty());
  }
}

TEST(DiscoverTopologyTest, JsonParsesAndHasStableKeys) {
  absl::StatusOr<Topology> topo = DiscoverTopology();
  ASSERT_TRUE(topo.ok()) << topo.status();
  const nlohmann::json j = nlohmann::json::parse(TopologyToJson(*topo, 2));
  for (const char* key : {"cxl_present", "cxl_absent_reason", "cxl", "dax", "numa", "sources",
                          "emulated_options", "warnings"}) {
    EXPECT_TRUE(j.contains(key)) << key;
  }
  EXPECT_TRUE(j["cxl_present"].is_boolean());
  EXPECT_TRUE(j["sources"].is_array());
  for (const char* key : {"buses", "ports", "endpoints", "memdevs", "decoders", "regions"}) {
    EXPECT_TRUE(j["cxl"][key].is_array()) << key;
  }
  EXPECT_TRUE(j["dax"]["regions"].is_array());
  EXPECT_TRUE(j["dax"]["devices"].is_array());
  EXPECT_TRUE(j["numa"]["available"].is_boolean());
  if (j["numa"]["available"].get<bool>()) {
    ASSERT_FALSE(j["numa"]["nodes"].empty()) << "NUMA is available but no node has memory";
    for (const auto& node : j["numa"]["nodes"]) {
      EXPECT_TRUE(node["size_bytes"].is_number_unsigned());
      EXPECT_TRUE(node["free_bytes"].is_number_unsigned());
      EXPECT_TRUE(node["cpu_less"].is_boolean());
    }
  }
  for (const auto& s : j["sources"]) {
    EXPECT_TRUE(s["size_bytes"].is_number_unsigned());
    const std::string cls = s["classification"];
    EXPECT_TRUE(cls == "expanded" || cls == "switch-pooled") << cls;
    EXPECT_FALSE(s["classification_reason"].get<std::string>().empty());
  }
  // One-line output parses to the same document.
  EXPECT_EQ(nlohmann::json::parse(TopologyToJson(*topo, -1)), j);
}

TEST(DiscoverTopologyTest, WithoutCxlOffersEmulatedSources) {
  absl::StatusOr<Topology> topo = DiscoverTopology();
  ASSERT_TRUE(topo.ok()) << topo.status();
  if (topo->cxl_present) GTEST_SKIP() << "this host has CXL devices";
  const nlohmann::json j = nlohmann::json::parse(TopologyToJson(*topo));
  EXPECT_FALSE(j["cxl_present"].get<bool>());
  ASSERT_FALSE(j["emulated_options"].empty());
  for (const auto& opt : j["emulated_options"]) {
    const std::string spec = opt;
    EXPECT_TRUE(spec.rfind("file:", 0) == 0 || spec.rfind("memfd:", 0) == 0) << spec;
  }
  const std::string text = TopologyToText(*topo);
  EXPECT_NE(text.find("No CXL devices found ("), std::string::npos) << text;
  EXPECT_NE(text.find("memfd:?size="), std::string::npos) << text;
}

TEST(DiscoverTopologyTest, EveryEnabledDevdaxDeviceIsASource) {
  absl::StatusOr<Topology> topo = DiscoverTopology();
  ASSERT_TRUE(topo.ok()) << topo.status();
  if (topo->dax_devices.empty()) GTEST_SKIP() << "no /dev/dax* devices on this host";
  for (const DaxDevice& d : topo->dax_devices) {
    if (d.mode != "devdax" || !d.enabled || d.size_bytes == 0) continue;
    bool found = false;
    for (const Source& s : topo->sources) found |= s.spec == "devdax:" + d.dev_path;
    EXPECT_TRUE(found) << d.name;
  }
}

TEST(DiscoverTopologyTest, RegionsOnRealHardwareNameTheirMemdevs) {
  absl::StatusOr<Topology> topo = DiscoverTopology();
  ASSERT_TRUE(topo.ok()) << topo.status();
  if (topo->cxl_regions.empty()) GTEST_SKIP() << "no CXL regions on this host (needs CXL)";
  for (const CxlRegion& r : topo->cxl_regions) {
    if (r.committed) {
      EXPECT_FALSE(r.memdevs.empty()) << r.name;
    }
  }
}

// ---- Classify() on synthetic topologies ------------------------------------------------

CxlPort Port(std::string name, std::string parent, int depth) {
  CxlPort p;
  p.name = std::move(name);
  p.parent = std::move(parent);
  p.depth = depth;
  p.is_root = depth == 0;
  p.libcxl_is_switch = depth > 0;  // as libcxl reports: host bridges are "switch" ports too
  p.enabled = true;
  return p;
}

CxlMemdev Memdev(std::string name, std::vector<std::string> path) {
  CxlMemdev m;
  m.name = std::move(name);
  m.port_path = std::move(path);
  return m;
}

CxlRegion Region(std::string name, uint64_t start, uint64_t size,
                 std::vector<std::string> memdevs) {
  CxlRegion r;
  r.name = std::move(name);
  r.mode = "ram";
  r.start = start;
  r.size_bytes = size;
  r.memdevs = std::move(memdevs);
  return r;
}

DaxDevice Dax(std::string name, uint64_t start, uint64_t size, std::string mode, int node) {
  DaxDevice d;
  d.name = std::move(name);
  d.dev_path = "/dev/" + d.name;
  d.start = start;
  d.size_bytes = size;
  d.align_bytes = 2 << 20;
  d.mode = std::move(mode);
  d.target_node = node;
  d.enabled = true;
  return d;
}

NumaNode Node(int id, int cpus) {
  NumaNode n;
  n.id = id;
  n.size_bytes = 16 * kGiB;
  n.free_bytes = 8 * kGiB;
  n.cpu_count = cpus;
  n.mems_allowed = true;
  return n;
}

// root0 > port1 (host bridge) > mem0 (direct attach)
// root0 > port1 (host bridge) > port2 (switch) > mem1
Topology TwoRegionHost() {
  Topology t;
  t.cxl_present = true;
  t.cxl_ports = {Port("root0", "", 0), Port("port1", "root0", 1), Port("port2", "port1", 2)};
  t.cxl_memdevs = {Memdev("mem0", {"port1", "root0"}), Memdev("mem1", {"port2", "port1", "root0"})};
  t.cxl_regions = {Region("region0", 0x1000000000, 16 * kGiB, {"mem0"}),
                   Region("region1", 0x2000000000, 16 * kGiB, {"mem1"})};
  return t;
}

const Source* FindSource(const Topology& t, const std::string& spec) {
  for (const Source& s : t.sources) {
    if (s.spec == spec) return &s;
  }
  return nullptr;
}

TEST(IsPhysicalSwitchTest, HostBridgeIsNotASwitch) {
  EXPECT_FALSE(IsPhysicalSwitch(Port("root0", "", 0)));
  EXPECT_FALSE(IsPhysicalSwitch(Port("port1", "root0", 1)));
  EXPECT_TRUE(IsPhysicalSwitch(Port("port2", "port1", 2)));
}

TEST(ClassifyTest, DirectAttachedDevdaxIsExpanded) {
  Topology t = TwoRegionHost();
  t.dax_devices = {Dax("dax0.0", 0x1000000000, 16 * kGiB, "devdax", 1)};
  t = Classify(std::move(t), {});
  const Source* s = FindSource(t, "devdax:/dev/dax0.0");
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(s->classification, SourceClass::kExpanded);
  EXPECT_EQ(s->size_bytes, 16 * kGiB);
  EXPECT_EQ(s->align_bytes, uint64_t{2} << 20);
  EXPECT_EQ(s->cxl_regions, std::vector<std::string>{"region0"});
  EXPECT_EQ(t.dax_devices[0].cxl_region, "region0");
  EXPECT_TRUE(t.cxl_regions[0].switch_ports.empty());
}

TEST(ClassifyTest, DevdaxBehindSwitchIsSwitchPooled) {
  Topology t = TwoRegionHost();
  t.dax_devices = {Dax("dax1.0", 0x2000000000 + (1 << 30), 8 * kGiB, "devdax", 2)};
  t = Classify(std::move(t), {});
  const Source* s = FindSource(t, "devdax:/dev/dax1.0");
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(s->classification, SourceClass::kSwitchPooled);
  EXPECT_NE(s->classification_reason.find("port2"), std::string::npos);
  EXPECT_EQ(t.cxl_regions[1].switch_ports, std::vector<std::string>{"port2"});
  EXPECT_EQ(t.cxl_regions[1].dax_devices, std::vector<std::string>{"dax1.0"});
}

TEST(ClassifyTest, InterleavedRegionWithOneSwitchedMemdevIsSwitchPooled) {
  Topology t = TwoRegionHost();
  t.cxl_regions = {Region("region0", 0x1000000000, 32 * kGiB, {"mem0", "mem1"})};
  t.dax_devices = {Dax("dax0.0", 0x1000000000, 32 * kGiB, "devdax", 1)};
  t = Classify(std::move(t), {});
  ASSERT_EQ(t.sources.size(), 1u);
  EXPECT_EQ(t.sources[0].classification, SourceClass::kSwitchPooled);
}

TEST(ClassifyTest, DaxWithoutCxlRegionIsExpandedWithReason) {
  Topology t;  // e.g. an EFI soft-reserved (hmem) range, no CXL at all
  t.dax_devices = {Dax("dax0.0", 0x880000000, 4 * kGiB, "devdax", 0)};
  t = Classify(std::move(t), {});
  ASSERT_EQ(t.sources.size(), 1u);
  EXPECT_EQ(t.sources[0].classification, SourceClass::kExpanded);
  EXPECT_EQ(t.sources[0].classification_reason,
            "no CXL region found for dax0.0; treating as host-local");
}

TEST(ClassifyTest, KmemNodeFollowsItsSystemRamDaxDevice) {
  Topology t = TwoRegionHost();
  t.dax_devices = {Dax("dax0.0", 0x1000000000, 16 * kGiB, "system-ram", 2),
                   Dax("dax1.0", 0x2000000000, 16 * kGiB, "system-ram", 3)};
  t.numa_nodes = {Node(0, 8), Node(2, 0), Node(3, 0), Node(4, 0)};
  t = Classify(std::move(t), {});
  // system-ram devices are not devdax sources; CPU nodes are not sources.
  EXPECT_EQ(FindSource(t, "devdax:/dev/dax0.0"), nullptr);
  EXPECT_EQ(FindSource(t, "kmem:node=0"), nullptr);
  const Source* n2 = FindSource(t, "kmem:node=2");
  const Source* n3 = FindSource(t, "kmem:node=3");
  const Source* n4 = FindSource(t, "kmem:node=4");
  ASSERT_NE(n2, nullptr);
  ASSERT_NE(n3, nullptr);
  ASSERT_NE(n4, nullptr);
  EXPECT_EQ(n2->classification, SourceClass::kExpanded);
  EXPECT_EQ(n3->classification, SourceClass::kSwitchPooled);
  EXPECT_EQ(n4->classification, SourceClass::kExpanded);
  EXPECT_EQ(n4->classification_reason, "no CXL region found for node 4; treating as host-local");
  EXPECT_EQ(n2->size_bytes, 16 * kGiB);
}

TEST(ClassifyTest, DeclaredSharedMarksSwitchPooled) {
  Topology t = TwoRegionHost();
  t.dax_devices = {Dax("dax0.0", 0x1000000000, 16 * kGiB, "devdax", 1)};
  t = Classify(std::move(t), {"devdax:/dev/dax0.0", "devdax:/dev/dax9.9"});
  const Source* s = FindSource(t, "devdax:/dev/dax0.0");
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(s->classification, SourceClass::kSwitchPooled);
  EXPECT_EQ(s->classification_reason, "declared shared by configuration");
  ASSERT_EQ(t.warnings.size(), 1u);
  EXPECT_NE(t.warnings[0].find("devdax:/dev/dax9.9"), std::string::npos);
}

TEST(ClassifyTest, DisabledDaxAndForbiddenNodeAreNotSources) {
  Topology t;
  t.dax_devices = {Dax("dax0.0", 0x880000000, 4 * kGiB, "devdax", 0)};
  t.dax_devices[0].enabled = false;
  t.numa_nodes = {Node(1, 0)};
  t.numa_nodes[0].mems_allowed = false;
  t = Classify(std::move(t), {});
  EXPECT_TRUE(t.sources.empty());
  ASSERT_EQ(t.warnings.size(), 1u);
  EXPECT_NE(t.warnings[0].find("kmem:node=1"), std::string::npos);
}

TEST(ClassifyTest, IsIdempotent) {
  Topology t = TwoRegionHost();
  t.dax_devices = {Dax("dax1.0", 0x2000000000, 16 * kGiB, "devdax", 2)};
  Topology once = Classify(t, {});
  Topology twice = Classify(once, {});
  EXPECT_EQ(TopologyToJson(once), TopologyToJson(twice));
}

TEST(ClassifyTest, JsonCarriesClassification) {
  Topology t = TwoRegionHost();
  t.dax_devices = {Dax("dax1.0", 0x2000000000, 16 * kGiB, "devdax", 2)};
  const nlohmann::json j = nlohmann::json::parse(TopologyToJson(Classify(std::move(t), {})));
  ASSERT_EQ(j["sources"].size(), 1u);
  EXPECT_EQ(j["sources"][0]["spec"], "devdax:/dev/dax1.0");
  EXPECT_EQ(j["sources"][0]["classification"], "switch-pooled");
  EXPECT_EQ(j["sources"][0]["size_bytes"], 16 * kGiB);
  EXPECT_EQ(j["cxl"]["ports"][2]["is_switch"], true);
  EXPECT_EQ(j["cxl"]["ports"][1]["is_switch"], false);
  EXPECT_EQ(j["cxl"]["ports"][1]["libcxl_is_switch"], true);
}

// ---- EmulatedOptions() ------------------------------------------------------------------

TEST(EmulatedOptionsTest, HalfOfFreeRoundedDownToPowerOfTwoGiB) {
  EXPECT_EQ(EmulatedOptions(40 * kGiB, 64 * kGiB),
            (std::vector<std::string>{"file:/dev/shm/cxlkv-pool0?size=16G", "memfd:?size=16G"}));
  EXPECT_EQ(EmulatedOptions(4 * kGiB, std::nullopt), (std::vector<std::string>{"memfd:?size=2G"}));
}

TEST(EmulatedOptionsTest, AtLeastOneGiBAndCappedByShm) {
  EXPECT_EQ(EmulatedOptions(0, 2 * kGiB),
            (std::vector<std::string>{"file:/dev/shm/cxlkv-pool0?size=1G", "memfd:?size=1G"}));
  EXPECT_EQ(EmulatedOptions(8 * kGiB, kGiB - 1), (std::vector<std::string>{"memfd:?size=4G"}));
  EXPECT_EQ(EmulatedOptions(64 * kGiB, 5 * kGiB),
            (std::vector<std::string>{"file:/dev/shm/cxlkv-pool0?size=4G", "memfd:?size=32G"}));
}

}  // namespace
}  // namespace cxlkv::pool

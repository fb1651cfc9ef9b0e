// cxlkv-guest-topocheck: checks `cxlkvctl topology --json` against what the ndctl tools
// report on the same guest.
//   cxlkv-guest-topocheck MEMDEVS.json REGIONS.json DAXCTL.json TOPOLOGY.json EXPECTED_CLASS
// MEMDEVS = `cxl list -M`, REGIONS = `cxl list -R`, DAXCTL = `daxctl list`,
// EXPECTED_CLASS = "expanded" or "switch-pooled" for every devdax source.
// Prints each comparison; exits 1 on the first mismatch.
#include <cstdio>
#include <fstream>
#include <map>
#include <set>
#include <string>

#include "nlohmann/json.hpp"

namespace {

using nlohmann::json;
int failures = 0;

json Load(const char* path) {
  std::ifstream in(path);
  json j = json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) {
    std::printf("FAIL: %s is not JSON\n", path);
    std::exit(1);
  }
  if (j.is_null()) return json::array();       // the tools print nothing for an empty list
  if (j.is_object()) return json::array({j});  // ... and a bare object for a list of one
  return j;
}

void Expect(bool ok, const std::string& what) {
  std::printf("%s: %s\n", ok ? "ok  " : "FAIL", what.c_str());
  if (!ok) ++failures;
}

std::uint64_t U(const json& j, const char* key) {
  return j.contains(key) ? j[key].get<std::uint64_t>() : 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 6) {
    std::fprintf(stderr, "usage: %s MEMDEVS REGIONS DAXCTL TOPOLOGY EXPECTED_CLASS\n", argv[0]);
    return 2;
  }
  const json memdevs = Load(argv[1]), regions = Load(argv[2]), dax = Load(argv[3]);
  std::ifstream tin(argv[4]);
  const json topo = json::parse(tin);
  const std::string expected = argv[5];

  Expect(topo["cxl_present"].get<bool>(), "cxlkvctl sees CXL");
  std::map<std::string, json> ours;
  for (const auto& m : topo["cxl"]["memdevs"]) ours[m["name"].get<std::string>()] = m;
  Expect(ours.size() == memdevs.size(), "memdev count: cxl list " + std::to_string(memdevs.size()) +
                                            ", cxlkvctl " + std::to_string(ours.size()));
  for (const auto& m : memdevs) {
    const std::string name = m["memdev"].get<std::string>();
    const bool found = ours.count(name) != 0;
    Expect(found, "memdev " + name + " discovered");
    if (!found) continue;
    Expect(ours[name]["pmem_size_bytes"].get<std::uint64_t>() == U(m, "pmem_size"),
           "memdev " + name + " pmem size " + std::to_string(U(m, "pmem_size")));
    Expect(ours[name]["serial"].get<std::uint64_t>() == U(m, "serial"),
           "memdev " + name + " serial");
  }

  std::map<std::string, json> our_regions;
  for (const auto& r : topo["cxl"]["regions"]) our_regions[r["name"].get<std::string>()] = r;
  Expect(our_regions.size() == regions.size(), "region count " + std::to_string(regions.size()));
  for (const auto& r : regions) {
    const std::string name = r["region"].get<std::string>();
    const bool found = our_regions.count(name) != 0;
    Expect(found, "region " + name + " discovered");
    if (!found) continue;
    const json& o = our_regions[name];
    Expect(o["size_bytes"].get<std::uint64_t>() == U(r, "size"), "region " + name + " size");
    Expect(o["interleave_ways"].get<std::uint64_t>() == U(r, "interleave_ways"),
           "region " + name + " interleave ways " + std::to_string(U(r, "interleave_ways")));
    Expect(o["start"].get<std::uint64_t>() == U(r, "resource"), "region " + name + " start");
  }

  std::map<std::string, json> our_dax;
  for (const auto& d : topo["dax"]["devices"]) our_dax[d["name"].get<std::string>()] = d;
  std::map<std::string, json> sources;
  for (const auto& s : topo["sources"]) sources[s["spec"].get<std::string>()] = s;
  std::size_t devdax = 0;
  for (const auto& d : dax) {
    const std::string name = d["chardev"].get<std::string>();
    const bool found = our_dax.count(name) != 0;
    Expect(found, "dax device " + name + " discovered");
    if (!found) continue;
    Expect(our_dax[name]["size_bytes"].get<std::uint64_t>() == U(d, "size"),
           "dax " + name + " size");
    if (d.contains("align")) {
      Expect(our_dax[name]["align_bytes"].get<std::uint64_t>() == U(d, "align"),
             "dax " + name + " align");
    }
    const std::string mode = d.value("mode", "devdax");
    Expect(our_dax[name]["mode"].get<std::string>() == mode, "dax " + name + " mode " + mode);
    if (mode != "devdax") continue;
    ++devdax;
    const std::string spec = "devdax:/dev/" + name;
    const bool has_source = sources.count(spec) != 0;
    Expect(has_source, "source " + spec + " listed");
    if (has_source) {
      Expect(sources[spec]["classification"].get<std::string>() == expected,
             "source " + spec + " classified " +
                 sources[spec]["classification"].get<std::string>() + " (expected " + expected +
                 "): " + sources[spec]["classification_reason"].get<std::string>());
    }
  }
  Expect(devdax > 0, "at least one devdax device to check");
  std::printf("topocheck: %s (%d mismatches)\n", failures == 0 ? "OK" : "FAILED", failures);
  return failures == 0 ? 0 : 1;
}

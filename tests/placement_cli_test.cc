// `cxlkvctl explain` and `cxlkvctl calibrate` as processes: the JSON output is the oracle; bad
// flags exit 2 naming the flag; PREFIX reads a stats file a ReuseTracker saved.
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>

#include "cxlkv/tier/reuse_tracker.h"
#include "gtest/gtest.h"
#include "temp_dir.h"

namespace {

struct CtlRun {
  int code = -1;
  std::string out;  // stdout and stderr together
};

CtlRun Ctl(const std::string& args) {
  const std::string cmd = std::string(CXLKV_CTL_BIN) + " " + args + " 2>&1";
  CtlRun r;
  FILE* f = ::popen(cmd.c_str(), "r");
  if (f == nullptr) return r;
  std::array<char, 4096> buf;
  std::size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), f)) > 0) r.out.append(buf.data(), n);
  const int st = ::pclose(f);
  r.code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return r;
}

const std::string kConfig = std::string(CXLKV_SOURCE_DIR) + "/orchestrator/domain.example.toml";

TEST(ExplainCli, FlagsToJson) {
  const CtlRun r = Ctl("explain --config " + kConfig +
                       " --size 1310720000 --reuse-ms 50 --tokens 4000 --occupancy 0.5 "
                       "--namespace acme/llama3-70b/fp16-l80-h8-d128-t16 --json");
  ASSERT_EQ(r.code, 0) << r.out;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["decision"]["tier"], "cxl-pooled");
  EXPECT_EQ(j["decision"]["clause"], "pinned") << "acme is pinned at level 2";
  EXPECT_EQ(j["inputs"]["size_bytes"], 1310720000u);
  EXPECT_DOUBLE_EQ(j["inputs"]["reuse_interval_s"].get<double>(), 0.05);
  EXPECT_EQ(j["inputs"]["pin_level"], 2);
  EXPECT_EQ(j["namespace"], "acme/llama3-70b/fp16-l80-h8-d128-t16");

  // A tier that evicts by itself: occupancy 0.97 adds no price, the 5 s block stays in CXL.
  const CtlRun evicting = Ctl("explain --config " + kConfig +
                              " --size 1310720000 --reuse-ms 5000 --occupancy 0.97"
                              " --retention-s inf,40 --json");
  ASSERT_EQ(evicting.code, 0) << evicting.out;
  const nlohmann::json je = nlohmann::json::parse(evicting.out);
  EXPECT_EQ(je["decision"]["clause"], "below-break-even") << evicting.out;
  EXPECT_DOUBLE_EQ(je["inputs"]["retention_s"]["cxl-pooled"].get<double>(), 40);
  EXPECT_EQ(je["tiers"][1]["pressure_from"], "eviction");
  const CtlRun filling = Ctl("explain --config " + kConfig +
                             " --size 1310720000 --reuse-ms 5000 --occupancy 0.97 --json");
  ASSERT_EQ(filling.code, 0) << filling.out;
  EXPECT_EQ(nlohmann::json::parse(filling.out)["decision"]["clause"], "above-break-even")
      << filling.out;

  const CtlRun text =
      Ctl("explain --config " + kConfig + " --size 1310720000 --reuse-ms inf --tokens 4000");
  ASSERT_EQ(text.code, 0) << text.out;
  EXPECT_NE(text.out.find("placement: nvme (above-break-even)"), std::string::npos) << text.out;
  EXPECT_NE(text.out.find("1310720000 B"), std::string::npos) << text.out;
}

TEST(ExplainCli, BadInputNamesTheFlag) {
  struct Case {
    std::string args, want;
    int code;
  } cases[] = {
      {"--size 1G --reuse-ms soon", "--reuse-ms: 'soon' is not a number of milliseconds", 2},
      {"--size big --reuse-ms 5", "--size: 'big' is not a block size", 2},
      {"--size 1G --reuse-ms 5 --occupancy 1.5", "--occupancy: '1.5' is not a fraction in [0, 1]",
       2},
      {"--size 1G --reuse-ms 5 --tokens -3", "--tokens: '-3' is not a whole number", 2},
      {"--size 1G --reuse-ms 5 --retention-s soon", "--retention-s: 'soon' is not a number of seconds",
       2},
      {"--size 1G --reuse-ms 5 --retention-s 1,2,3", "--retention-s: '1,2,3' takes one time", 2},
      {"--size 1G --reuse-ms 5 --namespace a/b/c",
       "--namespace: namespace 'a/b/c' is not in the configuration (known: acme/", 2},
      {"--reuse-ms 5", "--size BYTES is required", 2},
      {"abc --reuse-ms 5", "PREFIX needs --stats FILE", 2},
      {"--size 1G --reuse-ms 5 --calibration /nonexistent.json",
       "--calibration: cannot read calibration '/nonexistent.json'", 1},
  };
  for (const Case& c : cases) {
    const CtlRun r = Ctl("explain --config " + kConfig + " " + c.args);
    EXPECT_EQ(r.code, c.code) << c.args << "\n" << r.out;
    EXPECT_NE(r.out.find(c.want), std::string::npos)
        << c.args << "\ngot: " << r.out << "want: " << c.want;
  }
  const CtlRun r = Ctl("explain --config /nonexistent.toml --size 1G --reuse-ms 5");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.out.find("--config: cannot read config '/nonexistent.toml'"), std::string::npos)
      << r.out;
}

TEST(ExplainCli, PrefixFromStatsFile) {
  auto t = cxlkv::tier::ReuseTracker::Create({1024, 0.25});
  ASSERT_TRUE(t.ok());
  const cxlkv::coherence::PrefixKey key{0x1111222233334444ull, 0xaaaabbbbccccddddull};
  for (int i = 0; i < 10; ++i)
    t->Record(key, 1'000'000'000ull + i * 20'000'000ull, 1310720000, 4000);
  const cxlkv::testing::TempDir scratch("cli-stats");  // removed however the test ends
  ASSERT_FALSE(scratch.path().empty());
  const std::string stats = scratch.sub("stats");
  ASSERT_TRUE(t->Save(stats, 1'000'000'000ull + 9 * 20'000'000ull + 10'000'000ull).ok());

  const CtlRun r = Ctl("explain " + cxlkv::coherence::FormatKey(key) + " --stats " + stats +
                       " --config " + kConfig + " --json");
  ASSERT_EQ(r.code, 0) << r.out;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["prefix"]["key"], "aaaabbbbccccdddd1111222233334444");
  EXPECT_EQ(j["prefix"]["uses"], 10);
  EXPECT_NEAR(j["prefix"]["ewma_interval_s"].get<double>(), 0.02, 1e-6);
  EXPECT_EQ(j["inputs"]["size_bytes"], 1310720000u);
  EXPECT_EQ(j["inputs"]["tokens"], 4000);
  EXPECT_NEAR(j["inputs"]["reuse_interval_s"].get<double>(), 0.02, 1e-6);
  EXPECT_EQ(j["decision"]["clause"], "below-break-even");

  const CtlRun short_key = Ctl("explain 1234 --stats " + stats + " --config " + kConfig);
  EXPECT_EQ(short_key.code, 2);
  EXPECT_NE(short_key.out.find("has 4 hex digits"), std::string::npos) << short_key.out;
  const CtlRun missing =
      Ctl("explain 00000000000000000000000000001234 --stats " + stats + " --config " + kConfig);
  EXPECT_EQ(missing.code, 1);
  EXPECT_NE(missing.out.find("prefix 00000000000000000000000000001234 is not in"),
            std::string::npos)
      << missing.out;
  const CtlRun both = Ctl("explain 00000000000000000000000000001234 --stats " + stats +
                          " --reuse-ms 5 --config " + kConfig);
  EXPECT_EQ(both.code, 2);
  EXPECT_NE(both.out.find("--reuse-ms: '5' cannot be given with PREFIX"), std::string::npos)
      << both.out;
}

TEST(CalibrateCli, JsonAndSavedFileFeedExplain) {
  const cxlkv::testing::TempDir scratch("calcli", "/tmp");  // removed however the test ends
  ASSERT_FALSE(scratch.path().empty());
  const std::string dir = scratch.path(), out = dir + "/cal.json";
  const CtlRun r =
      Ctl(std::string("calibrate --dir ") + dir + " --budget-ms 300 --json --out " + out);
  ASSERT_EQ(r.code, 0) << r.out;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["format"], "cxlkv-calibration");
  EXPECT_GT(j["nvme"]["read_bytes_per_s"].get<double>(), 0);
  EXPECT_GT(j["memory"]["latency_s"].get<double>(), 0);
  const CtlRun e = Ctl("explain --config " + kConfig + " --calibration " + out +
                       " --size 1310720000 --reuse-ms 50 --json");
  ASSERT_EQ(e.code, 0) << e.out;
  const nlohmann::json ej = nlohmann::json::parse(e.out);
  EXPECT_EQ(ej["calibrated"].size(), 3u)
      << "NVMe latency, bandwidth, IOPS (DRAM applies to no tier)";
  EXPECT_DOUBLE_EQ(ej["tiers"][2]["read_bytes_per_s"].get<double>(),
                   j["nvme"]["read_bytes_per_s"].get<double>());

  const CtlRun bad = Ctl("calibrate --dir /dev/shm --budget-ms 200");
  EXPECT_EQ(bad.code, 1);
  EXPECT_NE(bad.out.find("tmpfs"), std::string::npos) << bad.out;
}

}  // namespace

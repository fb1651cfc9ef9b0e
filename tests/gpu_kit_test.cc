// The GPU kit's plan and report (gpu/kit.h) without a GPU: sizes follow the device's free
// memory, the host's memory and NUMA nodes and the time budget; every case not run says why;
// the summary lines compare against the goals with the measured numbers.
#include <set>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_join.h"
#include "cxlkv/gpu/kit.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace cxlkv::gpu {
namespace {

constexpr std::uint64_t kGiB = 1ull << 30;

KitMachine Machine(const std::string& spec) {
  auto m = ParseKitMachine(spec);
  EXPECT_TRUE(m.ok()) << m.status();
  return m.ok() ? *m : KitMachine{};
}

std::string Plan(const KitPlan& p) { return absl::StrJoin(FormatKitPlan(p), "\n"); }

const KitCase& Case(const KitPlan& p, const std::string& name) {
  const KitCase* c = p.Find(name);
  EXPECT_NE(c, nullptr) << name << " not planned:\n" << Plan(p);
  static const KitCase kNone;
  return c == nullptr ? kNone : *c;
}

// The lent device box (docs/gpu.md): an H200 with 139 GiB, 128 GiB of RAM, two NUMA nodes.
TEST(GpuKit, DeviceBoxRunsEveryQuestionAtFullSize) {
  const KitPlan p = PlanKit(
      Machine("device_free_gib=139,host_gib=120,cpus=16,gpu_node=0,nodes=0:58/1:60,name=H200"),
      {.budget_s = 200});
  EXPECT_EQ(p.copy_batch_bytes, kGiB) << Plan(p);
  EXPECT_EQ(p.remote_node, 1);
  for (const char* run :
       {"Copy/h2d/hostalloc/2MiB", "Copy/h2d/arena/2MiB", "Copy/h2d/remote/2MiB",
        "Copy/h2d/arena/1GiB", "Copy/d2h/arena/1GiB", "Copy/h2d/pageable/64KiB", "Streams/arena/1",
        "Streams/arena/8", "WriteBack/16x8MiB", "RegisterUnderTraffic/8GiB",
        "Register/chunked/8GiB", "Register/one-call/8GiB", "Register/prefault+one-call/8GiB",
        "Register/chunked/64GiB", "Register/one-call/64GiB", "Gather/kernel/contiguous/4KiB",
        "GatherBlocks64K/memcpy/separate/1024"}) {
    EXPECT_EQ(Case(p, run).skipped, "") << run;
  }
  // 256 GiB does not fit in 120 GiB: skipped, with the figures.
  for (const char* mode : {"chunked", "prefault+one-call", "one-call"}) {
    const KitCase& c = Case(p, std::string("Register/") + mode + "/256GiB");
    EXPECT_TRUE(absl::StrContains(c.skipped, "host memory")) << c.skipped;
    EXPECT_TRUE(absl::StrContains(c.skipped, "120.0 GiB available")) << c.skipped;
  }
  EXPECT_LE(p.planned_s(), 200);
  EXPECT_GT(p.planned_s(), 60) << "the plan runs too little to answer the questions";
}

TEST(GpuKit, SmallMachineScalesTheBatchDownAndSaysWhatItSkips) {
  const KitPlan p = PlanKit(Machine("device_free_gib=1.5,host_gib=5,cpus=2"), {.budget_s = 200});
  // 4 sources of the batch beside 2 GiB in 5 GiB: 512 MiB; the device holds it twice.
  EXPECT_EQ(p.copy_batch_bytes, 512ull << 20) << Plan(p);
  EXPECT_EQ(Case(p, "Copy/h2d/arena/512MiB").skipped, "");
  EXPECT_TRUE(
      absl::StrContains(Case(p, "Copy/h2d/arena/1GiB").skipped, "chunk above the 512MiB batch"));
  EXPECT_TRUE(absl::StrContains(Case(p, "Copy/h2d/remote/2MiB").skipped, "one NUMA node"));
  EXPECT_TRUE(absl::StrContains(Case(p, "Register/chunked/8GiB").skipped, "5.0 GiB available"));
  // The traffic case shrinks its region to 1 GiB and still does not fit beside the headroom.
  EXPECT_TRUE(absl::StrContains(Case(p, "RegisterUnderTraffic/1GiB").skipped, "host memory"));
  EXPECT_EQ(Case(p, "WriteBack/16x8MiB").skipped, "");
}

TEST(GpuKit, TooLittleMemoryForAnyCopyNamesBothFigures) {
  const KitPlan p = PlanKit(Machine("device_free_gib=0.3,host_gib=64"));
  EXPECT_EQ(p.copy_batch_bytes, 0u);
  const std::string& why = Case(p, "Copy/h2d/arena/2MiB").skipped;
  EXPECT_TRUE(absl::StrContains(why, "0.3 GiB free")) << why;
  EXPECT_TRUE(absl::StrContains(why, "64.0 GiB available")) << why;
}

TEST(GpuKit, NoDeviceSkipsEverythingWithTheReason) {
  KitMachine m = ReadHostMachine();
  m.device_free_bytes = 0;
  const KitPlan p = PlanKit(m);
  ASSERT_FALSE(p.cases.empty());
  for (const KitCase& c : p.cases) EXPECT_FALSE(c.skipped.empty()) << c.name;
  EXPECT_TRUE(absl::StrContains(Case(p, "Copy/h2d/arena/2MiB").skipped, "no CUDA device"));
  EXPECT_EQ(p.planned_s(), 0);
}

TEST(GpuKit, RemoteNeedsAKnownGpuNodeAndRoomOnAnother) {
  EXPECT_TRUE(
      absl::StrContains(Case(PlanKit(Machine("device_free_gib=80,host_gib=100,nodes=0:50/1:50")),
                             "Copy/h2d/remote/2MiB")
                            .skipped,
                        "not known"));
  EXPECT_TRUE(absl::StrContains(
      Case(PlanKit(Machine("device_free_gib=80,host_gib=100,gpu_node=1,nodes=0:1/1:99")),
           "Copy/h2d/remote/2MiB")
          .skipped,
      "node 0 has 1.0 GiB free"));
  const KitPlan p =
      PlanKit(Machine("device_free_gib=80,host_gib=100,gpu_node=1,nodes=0:40/1:50/2:45"));
  EXPECT_EQ(p.remote_node, 2);  // the other node with the most free memory
}

// The budget is spent in run order: what comes first runs, what would end past it is skipped
// with the budget named.
TEST(GpuKit, TimeBudgetSkipsTheLaterCases) {
  const KitMachine m = Machine("device_free_gib=139,host_gib=120,cpus=16");
  const KitPlan p = PlanKit(m, {.budget_s = 15});
  EXPECT_LE(p.planned_s(), 15);
  EXPECT_EQ(Case(p, "Copy/h2d/hostalloc/64KiB").skipped, "");
  EXPECT_TRUE(absl::StrContains(Case(p, "Register/one-call/64GiB").skipped, "time budget"))
      << Plan(p);
  bool skipping = false;
  for (const KitCase& c : p.cases) {
    if (absl::StrContains(c.skipped, "time budget")) skipping = true;
  }
  EXPECT_TRUE(skipping);
}

TEST(GpuKit, MachineSpecErrorsNameTheKeyAndTheForm) {
  for (const auto& [spec, want] : std::initializer_list<std::pair<const char*, const char*>>{
           {"host_gib=4", "device_free_gib and host_gib are required"},
           {"device_free_gib=4,host_gib=4,ram=3", "unknown key 'ram'"},
           {"device_free_gib=x,host_gib=4", "device_free_gib 'x'"},
           {"device_free_gib=4,host_gib=4,nodes=0-3", "nodes entry '0-3'"},
           {"device_free_gib=4,host_gib=4,cpus=0", "cpus '0'"}}) {
    auto m = ParseKitMachine(spec);
    ASSERT_FALSE(m.ok()) << spec;
    EXPECT_TRUE(absl::StrContains(m.status().message(), want)) << m.status();
    EXPECT_TRUE(absl::StrContains(m.status().message(), "the form is device_free_gib=N"))
        << m.status();
  }
}

TEST(GpuKit, HostMachineIsReadFromProcAndSys) {
  const KitMachine m = ReadHostMachine();
  EXPECT_GT(m.host_available_bytes, 64ull << 20);
  EXPECT_GE(m.host_cpus, 1u);
  ASSERT_FALSE(m.numa_nodes.empty()) << "no /sys/devices/system/node/node*/meminfo";
  EXPECT_EQ(m.device_free_bytes, 0u);
  EXPECT_EQ(NumaNodeOfPciDevice("0000:ff:1f.7-not-a-device"), -1);
}

// The summary computes each comparison from the records and judges it against the goal.
TEST(GpuKit, SummaryJudgesEachQuestionAgainstItsGoal) {
  const KitPlan p =
      PlanKit(Machine("device_free_gib=139,host_gib=120,cpus=16,gpu_node=0,nodes=0:58/1:60"),
              {.budget_s = 200});
  KitRecords r;
  r["Copy/h2d/hostalloc/2MiB"].values["bytes_per_second"] = 50e9;
  r["Copy/h2d/arena/2MiB"].values["bytes_per_second"] = 48e9;  // 96 %: met
  r["Copy/h2d/remote/2MiB"].values["bytes_per_second"] = 40e9;
  r["Copy/d2h/hostalloc/2MiB"].values["bytes_per_second"] = 50e9;
  r["Copy/d2h/arena/2MiB"].values["bytes_per_second"] = 45e9;  // 90 %: not met
  r["Streams/arena/1"].values["bytes_per_second"] = 20e9;
  r["Streams/arena/8"].values["bytes_per_second"] = 50e9;
  r["WriteBack/16x8MiB"].values = {{"blocks", 16}, {"matched", 15}};
  r["Register/chunked/8GiB"].values = {{"s_per_GiB", 0.05}, {"first_chunk_ms", 40}};
  r["Register/one-call/8GiB"].values["s_per_GiB"] = 0.5;
  r["RegisterUnderTraffic/8GiB"].values = {{"p50_idle_us", 10}, {"p50_during_us", 10.4}};
  r["Register/chunked/64GiB"].error = "cudaHostRegister: out of memory";
  const std::string s = absl::StrJoin(KitSummary(p, r), "\n");
  EXPECT_TRUE(absl::StrContains(s,
                                "kit: copy h2d 2MiB: arena 48.0 GB/s = 96.0 % of cudaHostAlloc "
                                "(50.0 GB/s; goal >= 95 %: met); remote node 1 40.0 GB/s (80.0 %)"))
      << s;
  EXPECT_TRUE(absl::StrContains(s,
                                "kit: copy d2h 2MiB: arena 45.0 GB/s = 90.0 % of cudaHostAlloc "
                                "(50.0 GB/s; goal >= 95 %: NOT met)"))
      << s;
  EXPECT_TRUE(absl::StrContains(s, "8 loads together = 2.50 x one load")) << s;
  EXPECT_TRUE(absl::StrContains(s, "15 of 16 hold the device's bytes (NOT SAFE)")) << s;
  EXPECT_TRUE(absl::StrContains(
      s,
      "kit: register 8GiB: as shipped (prefault + chunks) 0.050 s/GiB, first chunk usable after 40 "
      "ms; one call 0.500 s/GiB (goal <= 0.03 s/GiB: NOT met)"))
      << s;
  EXPECT_TRUE(absl::StrContains(s, "p50 10.0 us idle, 10.4 us during (+4.0 %; goal <= 5 %: met)"))
      << s;
  EXPECT_TRUE(
      absl::StrContains(s, "kit: FAILED Register/chunked/64GiB: cudaHostRegister: out of memory"))
      << s;
  EXPECT_TRUE(absl::StrContains(s, "kit: no result for Copy/h2d/pageable/2MiB")) << s;
  EXPECT_TRUE(absl::StrContains(s, "kit: skipped Register/chunked/256GiB: needs")) << s;

  const nlohmann::json j = nlohmann::json::parse(KitJson(p, r));
  std::set<std::string> statuses;
  for (const auto& c : j["cases"]) {
    statuses.insert(c["status"].get<std::string>());
    if (c["name"] == "Copy/h2d/arena/2MiB") {
      EXPECT_EQ(c["status"], "measured");
      EXPECT_EQ(c["values"]["bytes_per_second"], 48e9);
    }
    if (c["name"] == "Register/chunked/64GiB") {
      EXPECT_EQ(c["status"], "failed");
    }
  }
  EXPECT_EQ(statuses, (std::set<std::string>{"measured", "failed", "skipped", "planned"}));
  EXPECT_EQ(j["machine"]["numa_nodes"].size(), 2u);
  EXPECT_EQ(j["summary"].size(), KitSummary(p, r).size());
}

}  // namespace
}  // namespace cxlkv::gpu

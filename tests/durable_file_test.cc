// Durable files (base/file.h) and the files kept through it: a crash or power loss leaves the
// old contents or the new, never a torn or empty file, and a save that returned OK is on
// stable media. A power loss cannot be pulled on a test machine, so the seam is
// base::SetFileStepHookForTesting: the steps a save takes are recorded (what is durable before
// the call returns follows from their order), a step is made to fail with an errno, or the
// process is ended between two steps (kill -9 at that point).
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "cxlkv/base/file.h"
#include "cxlkv/coherence/key.h"
#include "cxlkv/tier/calibrate.h"
#include "cxlkv/tier/reuse_tracker.h"
#include "gtest/gtest.h"
#include "temp_dir.h"

namespace cxlkv::testing {
namespace {

const std::vector<std::string> kDurableSteps = {"write", "sync", "rename", "sync-dir"};

// The hook's state: a plain global (the hook is a function pointer), reset by each test.
std::vector<std::string> g_steps;
std::string g_fail_step;
int g_fail_errno = 0;
std::string g_exit_step;

int RecordStep(absl::string_view step, const std::string& /*path*/) {
  g_steps.emplace_back(step);
  if (step == g_exit_step) ::_exit(9);  // the process ends here: a crash between two steps
  return step == g_fail_step ? g_fail_errno : 0;
}

class DurableFile : public ::testing::Test {
 protected:
  void SetUp() override {
    g_steps.clear();
    g_fail_step.clear();
    g_fail_errno = 0;
    g_exit_step.clear();
    base::SetFileStepHookForTesting(&RecordStep);
    ASSERT_FALSE(dir_.path().empty());
  }
  void TearDown() override { base::SetFileStepHookForTesting(nullptr); }

  std::string Path(const std::string& name) const { return dir_.path() + "/" + name; }

  // Runs `save` in a child that ends (as kill -9 would) just before `step`; true when the
  // child died there, i.e. the step was reached.
  template <typename Save>
  bool CrashAt(const std::string& step, Save save) {
    const pid_t pid = ::fork();
    if (pid == 0) {
      g_exit_step = step;
      (void)save();
      ::_exit(0);  // the save finished without reaching `step`
    }
    int status = 0;
    ::waitpid(pid, &status, 0);
    return WIFEXITED(status) && WEXITSTATUS(status) == 9;
  }

 private:
  TempDir dir_{"durable"};
};

std::string Contents(const std::string& path) {
  auto got = base::ReadFile(path);
  return got.ok() ? *got : "<" + std::string(got.status().message()) + ">";
}

TEST_F(DurableFile, ReplaceWritesSyncsRenamesThenSyncsTheDirectory) {
  const std::string p = Path("state");
  ASSERT_TRUE(base::ReplaceFile(p, {"one ", "two"}, 0600).ok());
  EXPECT_EQ(g_steps, kDurableSteps);
  EXPECT_EQ(Contents(p), "one two");
  struct stat st {};
  ASSERT_EQ(::stat(p.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  EXPECT_FALSE(std::filesystem::exists(p + ".tmp"));
}

TEST_F(DurableFile, AFailedStepNamesTheFileAndTheStepAndLeavesTheOldContents) {
  const std::string p = Path("state");
  ASSERT_TRUE(base::ReplaceFile(p, "old").ok());
  for (const auto& [step, err] : std::vector<std::pair<std::string, int>>{
           {"write", ENOSPC}, {"sync", EIO}, {"rename", EXDEV}}) {
    SCOPED_TRACE(step);
    g_fail_step = step;
    g_fail_errno = err;
    const absl::Status st = base::ReplaceFile(p, "new");
    ASSERT_FALSE(st.ok());
    EXPECT_NE(st.message().find(p), std::string::npos) << st;
    EXPECT_NE(st.message().find(step == "sync" ? "fdatasync" : step), std::string::npos) << st;
    EXPECT_EQ(Contents(p), "old");
    EXPECT_FALSE(std::filesystem::exists(p + ".tmp")) << "the temporary file was left";
  }
}

TEST_F(DurableFile, AFailedDirectorySyncFailsTheCall) {
  const std::string p = Path("state");
  g_fail_step = "sync-dir";
  g_fail_errno = EIO;
  const absl::Status st = base::ReplaceFile(p, "new");
  ASSERT_FALSE(st.ok()) << "a rename not known to be durable was reported as saved";
  EXPECT_NE(st.message().find("fsync"), std::string::npos) << st;
}

TEST_F(DurableFile, ACrashBeforeAnyStepLeavesTheOldOrTheNewFileWhole) {
  const std::string p = Path("state");
  const std::string old_text(100000, 'o');
  const std::string new_text(200000, 'n');
  ASSERT_TRUE(base::ReplaceFile(p, old_text).ok());
  for (const std::string& step : kDurableSteps) {
    SCOPED_TRACE(step);
    ASSERT_TRUE(CrashAt(step, [&] { return base::ReplaceFile(p, new_text); }));
    const std::string got = Contents(p);
    // Before the rename the old file stands; from the rename on, the new one.
    const bool renamed = step == "sync-dir";
    EXPECT_EQ(got.size(), renamed ? new_text.size() : old_text.size());
    EXPECT_TRUE(got == (renamed ? new_text : old_text));
    ASSERT_TRUE(base::ReplaceFile(p, old_text).ok());  // the next save cleans the temporary
  }
}

// ---- the files kept through it -----------------------------------------------------------

tier::Calibration SomeCalibration(double read_bytes_per_s) {
  tier::Calibration c;
  c.memory = tier::MemoryCalibration{"anonymous", "dram",       read_bytes_per_s, 1.5e10,
                                     2.5e-7,      256ull << 20, 2ull << 20};
  c.measured_at = "2026-12-05T10:00:00Z";
  c.duration_s = 1.5;
  return c;
}

// The placement rule reads the calibration at every start: it used to be written with an
// ofstream and renamed, never synced (a power loss could leave it empty or torn).
TEST_F(DurableFile, TheCalibrationIsDurableWhenSaveReturns) {
  const std::string p = Path("calibration.json");
  ASSERT_TRUE(tier::SaveCalibration(SomeCalibration(1.7e10), p).ok());
  EXPECT_EQ(g_steps, kDurableSteps) << "SaveCalibration does not sync before it returns";
  for (const std::string& step : kDurableSteps) {
    SCOPED_TRACE(step);
    ASSERT_TRUE(CrashAt(step, [&] { return tier::SaveCalibration(SomeCalibration(9e9), p); }));
    auto back = tier::LoadCalibration(p);
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(back->memory->read_bytes_per_s, step == "sync-dir" ? 9e9 : 1.7e10);
    ASSERT_TRUE(tier::SaveCalibration(SomeCalibration(1.7e10), p).ok());
  }
}

TEST_F(DurableFile, TheReuseStatsAreDurableAndAnUnsyncedDirectoryFailsTheSave) {
  auto tracker = tier::ReuseTracker::Create({.entries = 64, .alpha = 0.25});
  ASSERT_TRUE(tracker.ok()) << tracker.status();
  const coherence::PrefixKey key{0x1234, 0x5678};
  tracker->Record(key, 1000);
  tracker->Record(key, 5000);
  const std::string p = Path("reuse.stats");
  ASSERT_TRUE(tracker->Save(p, 6000).ok());
  EXPECT_EQ(g_steps, kDurableSteps);
  auto loaded = tier::ReuseTracker::Load(p);
  ASSERT_TRUE(loaded.ok()) << loaded.status();

  // The tracker used to ignore a failed fsync of the directory and report the save done.
  g_fail_step = "sync-dir";
  g_fail_errno = EIO;
  const absl::Status st = tracker->Save(p, 7000);
  EXPECT_FALSE(st.ok()) << "a save whose rename is not durable was reported as done";
  g_fail_step.clear();

  tracker->Record(key, 9000);
  ASSERT_TRUE(CrashAt("rename", [&] { return tracker->Save(p, 9500); }));
  auto after = tier::ReuseTracker::Load(p);
  ASSERT_TRUE(after.ok()) << "a crash in the save left a stats file that does not load: "
                          << after.status();
}

}  // namespace
}  // namespace cxlkv::testing

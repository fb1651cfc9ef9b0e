// A test's scratch directory that goes away with the test however the test ends: a failed
// ASSERT_* or a GTEST_SKIP() returns from the test body early, and the destructor still runs
// (README "Tests": nothing left behind). Header only, gtest and the standard library.
#ifndef CXLKV_TESTS_TEMP_DIR_H_
#define CXLKV_TESTS_TEMP_DIR_H_

#include <stdlib.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <string>
#include <system_error>

#include "gtest/gtest.h"

namespace cxlkv::testing {

// A fresh directory `<parent>/cxlkv-<tag>-XXXXXX`, removed with everything in it when the object
// dies. `parent` defaults to the system temporary directory ($TMPDIR, else /tmp; a disk file
// system here); tests that put a Unix socket inside pass "/tmp", which keeps the socket's path
// short. path() is "" when the directory cannot be made: the test has failed then, naming it.
class TempDir {
 public:
  explicit TempDir(const std::string& tag, const std::string& parent = "") {
    const std::filesystem::path base =
        parent.empty() ? std::filesystem::temp_directory_path() : std::filesystem::path(parent);
    std::string templ = (base / ("cxlkv-" + tag + "-XXXXXX")).string();
    if (::mkdtemp(templ.data()) != nullptr) {
      path_ = templ;
    } else {
      ADD_FAILURE() << "TempDir: cannot make " << templ << ": " << std::strerror(errno) << " (is "
                    << base << " a writable directory?)";
    }
  }
  ~TempDir() {
    if (path_.empty()) return;
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::string& path() const { return path_; }
  std::string sub(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

}  // namespace cxlkv::testing

#endif  // CXLKV_TESTS_TEMP_DIR_H_

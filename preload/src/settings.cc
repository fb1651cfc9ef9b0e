#include "cxlkv/preload/settings.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "cxlkv/base/bytes.h"
#include "cxlkv/base/errno.h"
#include "cxlkv/pool/spec.h"
#include "log.h"

namespace cxlkv::preload {
namespace {

struct Key {
  const char* env;
  const char* file;
};
constexpr Key kKeys[] = {
    {"CXLKV_POOL", "pool"},
    {"CXLKV_HOST_ID", "host_id"},
    {"CXLKV_LIBRARY", "library"},
    {"CXLKV_MIN_BYTES", "min_bytes"},
    {"CXLKV_LOG", "log"},
    {"CXLKV_STATS", "stats"},
    {"CXLKV_SHM", "shm"},
    {"CXLKV_REGISTER_CHUNK", "register_chunk"},
    {"CXLKV_CONFIG", nullptr},
};

bool ParseLevel(absl::string_view s, LogLevel* out) {
  static constexpr LogLevel kAll[] = {LogLevel::kOff, LogLevel::kError, LogLevel::kWarn,
                                      LogLevel::kInfo, LogLevel::kDebug};
  for (LogLevel l : kAll) {
    if (s == LogLevelName(l)) {
      *out = l;
      return true;
    }
  }
  return false;
}

// Reads a whole (small) file; errors name it.
absl::Status ReadFile(const std::string& path, std::string* out) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    return absl::NotFoundError(absl::StrCat("CXLKV_CONFIG=", path,
                                            ": cannot open: ", base::ErrnoText(errno),
                                            "; point CXLKV_CONFIG at a readable file"));
  }
  char buf[4096];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    out->append(buf, static_cast<std::size_t>(n));
    if (out->size() > (1u << 20)) {
      ::close(fd);
      return absl::InvalidArgumentError(
          absl::StrCat("CXLKV_CONFIG=", path, ": larger than 1 MiB; is it the right file?"));
    }
  }
  ::close(fd);
  return absl::OkStatus();
}

}  // namespace

const char* LogLevelName(LogLevel level) noexcept {
  switch (level) {
    case LogLevel::kOff:
      return "off";
    case LogLevel::kError:
      return "error";
    case LogLevel::kWarn:
      return "warn";
    case LogLevel::kInfo:
      return "info";
    case LogLevel::kDebug:
      return "debug";
  }
  return "?";
}

absl::Status ApplySetting(absl::string_view key, absl::string_view value, Settings* s) {
  value = absl::StripAsciiWhitespace(value);
  if (key == "pool") {
    if (value.empty()) {
      s->pool.clear();
      return absl::OkStatus();
    }
    if (absl::StartsWith(value, kOrchestratorPrefix)) {
      if (value.size() == kOrchestratorPrefix.size()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "pool '", value, "': name the orchestrator's socket, e.g. "
            "orchestrator:/run/cxlkv/domain0.sock"));
      }
      s->pool = std::string(value);
      return absl::OkStatus();
    }
    auto spec = pool::ParseSourceSpec(value);
    if (!spec.ok()) return spec.status();
    s->pool = std::string(value);
    return absl::OkStatus();
  }
  if (key == "host_id") {
    std::uint32_t id = 0;
    if (!absl::SimpleAtoi(value, &id)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "host_id '", value, "': give this process's host id in the CXL domain, a number "
          "the orchestrator's config admits (one per process that joins)"));
    }
    s->host_id = id;
    s->host_id_set = true;
    return absl::OkStatus();
  }
  if (key == "library") {
    s->library = std::string(value);
    return absl::OkStatus();
  }
  if (key == "min_bytes") {
    auto n = base::ParseSize(value);
    if (!n.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "min_bytes '", value, "': ", n.status().message(),
          "; give a byte count with an optional K/M/G suffix, e.g. 64K (0 sends everything)"));
    }
    s->min_bytes = *n;
    return absl::OkStatus();
  }
  if (key == "log") {
    std::pair<absl::string_view, absl::string_view> parts =
        absl::StrSplit(value, absl::MaxSplits(',', 1));
    LogLevel level;
    if (!ParseLevel(absl::StripAsciiWhitespace(parts.first), &level)) {
      return absl::InvalidArgumentError(
          absl::StrCat("log '", value,
                       "': level must be off, error, warn, info or debug, optionally followed by "
                       "',stderr' or ',/path/to/file' (e.g. info,/tmp/cxlkv.log)"));
    }
    s->log_level = level;
    const absl::string_view dest = absl::StripAsciiWhitespace(parts.second);
    s->log_path = dest == "stderr" ? "" : std::string(dest);
    return absl::OkStatus();
  }
  if (key == "stats") {
    s->stats_path = std::string(value);
    return absl::OkStatus();
  }
  if (key == "shm") {
    if (!value.empty() && value.front() != '/') {
      return absl::InvalidArgumentError(
          absl::StrCat("shm '", value,
                       "': give a glob of absolute paths of the shared-memory files to back "
                       "with the pool, e.g. /dev/shm/vllm_offload_*"));
    }
    s->shm_glob = std::string(value);
    return absl::OkStatus();
  }
  if (key == "register_chunk") {
    auto n = base::ParseSize(value);
    if (!n.ok() || *n == 0 || *n % 4096 != 0 || *n >= kDriverRegisterLimitBytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          "register_chunk '", value, "': ", n.ok() ? "" : absl::StrCat(n.status().message(), "; "),
          "give the most one cudaHostRegister call may pin, a multiple of 4K below 512G (NVIDIA's "
          "r580+ drivers refuse a single call of 512 GiB or more), e.g. 64G"));
    }
    s->register_chunk_bytes = *n;
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown key '", key,
                   "'; the known keys are pool, host_id, library, min_bytes, log, stats, shm "
                   "and register_chunk"));
}

std::vector<std::string> ParseConfigText(absl::string_view text, absl::string_view source,
                                         Settings* s) {
  std::vector<std::string> errors;
  int line_no = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_no;
    if (auto hash = line.find('#'); hash != absl::string_view::npos) line = line.substr(0, hash);
    line = absl::StripAsciiWhitespace(line);
    if (line.empty()) continue;
    const auto eq = line.find('=');
    if (eq == absl::string_view::npos) {
      errors.push_back(absl::StrCat(source, ":", line_no, ": '", line,
                                    "' is not 'key = value' (keys: pool, host_id, library, "
                                    "min_bytes, log, stats, shm, register_chunk)"));
      continue;
    }
    const absl::string_view key = absl::StripAsciiWhitespace(line.substr(0, eq));
    if (auto st = ApplySetting(key, line.substr(eq + 1), s); !st.ok()) {
      errors.push_back(absl::StrCat(source, ":", line_no, ": ", st.message()));
    }
  }
  return errors;
}

namespace {

// Edit distance of two short names (allocation-free: runs before malloc is ready).
std::size_t Distance(absl::string_view a, absl::string_view b) {
  constexpr std::size_t kMax = 48;
  if (a.size() >= kMax || b.size() >= kMax) return kMax;
  std::size_t prev[kMax] = {}, cur[kMax] = {};
  for (std::size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const std::size_t sub = prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1);
      cur[j] = std::min({sub, prev[j] + 1, cur[j - 1] + 1});
    }
    for (std::size_t j = 0; j <= b.size(); ++j) prev[j] = cur[j];
  }
  return prev[b.size()];
}

// A misspelling of one of the shim's own variables (CXLKV_MINBYTES, CXLKV_POLL, ...).
bool LooksLikeOurs(absl::string_view name) {
  for (const Key& k : kKeys) {
    if (Distance(name, k.env) <= 2) return true;
  }
  return absl::StartsWith(name, "CXLKV_PRELOAD_");
}

}  // namespace

Settings LoadSettings(const char* const* envp, std::vector<std::string>* errors) {
  Settings s;
  std::vector<std::pair<std::string, std::string>> env;  // known CXLKV_* keys, in order
  for (const char* const* e = envp; e != nullptr && *e != nullptr; ++e) {
    const absl::string_view kv(*e);
    if (!absl::StartsWith(kv, "CXLKV_")) continue;
    const auto eq = kv.find('=');
    const absl::string_view name = kv.substr(0, eq);
    const absl::string_view value = eq == absl::string_view::npos ? "" : kv.substr(eq + 1);
    bool known = false;
    for (const Key& k : kKeys) known = known || name == k.env;
    // Other cxlkv tools read CXLKV_* variables of their own (CXLKV_SEED, CXLKV_ORCHESTRATOR_SOCKET,
    // the QEMU guests' CXLKV_BIN ...): only a near miss of one of the shim's keys is an error.
    if (!known && !LooksLikeOurs(name)) continue;
    if (!known) {
      errors->push_back(absl::StrCat(
          "unknown setting ", name,
          "; the preload shim reads CXLKV_POOL, CXLKV_HOST_ID, CXLKV_LIBRARY, CXLKV_MIN_BYTES, "
          "CXLKV_LOG, CXLKV_STATS, CXLKV_SHM, CXLKV_REGISTER_CHUNK and CXLKV_CONFIG"));
      continue;
    }
    env.emplace_back(std::string(name), std::string(value));
  }
  for (const auto& [name, value] : env) {  // the file first, the environment overrides it
    if (name != "CXLKV_CONFIG") continue;
    s.config_path = value;
    std::string text;
    if (auto st = ReadFile(value, &text); !st.ok()) {
      errors->push_back(std::string(st.message()));
      continue;
    }
    for (auto& e : ParseConfigText(text, value, &s)) errors->push_back(std::move(e));
  }
  for (const auto& [name, value] : env) {
    for (const Key& k : kKeys) {
      if (name != k.env || k.file == nullptr) continue;
      if (auto st = ApplySetting(k.file, value, &s); !st.ok()) {
        errors->push_back(absl::StrCat(name, ": ", st.message()));
      }
    }
  }
  if (absl::StartsWith(s.pool, kOrchestratorPrefix) && !s.host_id_set) {
    errors->push_back(absl::StrCat(
        "CXLKV_POOL=", s.pool, " joins a pooled CXL domain and needs CXLKV_HOST_ID (this "
        "process's host id there, one the orchestrator admits, different for each process)"));
  }
  if (!s.shm_glob.empty()) {
    // Every process that maps a matching file must land on the same memory: a kmem node binds
    // the file's own pages, a devdax or file pool holds one extent per file that every
    // process finds. A memfd pool is private to one process tree, and an orchestrator's
    // extents are lent to one process: neither can back a file other processes map.
    auto spec = pool::ParseSourceSpec(s.pool);
    if (s.pool.empty() || !spec.ok() || spec->kind == pool::SourceKind::kMemfd) {
      errors->push_back(absl::StrCat("CXLKV_SHM=", s.shm_glob,
                                     " needs a pool every process can map: set CXLKV_POOL to "
                                     "kmem:node=N, devdax:/dev/daxX.Y or file:PATH (it is ",
                                     s.pool.empty() ? std::string("unset") : s.pool, ")"));
    }
  }
  if (!errors->empty()) s.pool.clear();
  return s;
}

std::string ExpandPid(absl::string_view path, int pid) {
  std::string out;
  for (std::size_t i = 0; i < path.size(); ++i) {
    if (path[i] == '%' && i + 1 < path.size() && path[i + 1] == 'p') {
      absl::StrAppend(&out, pid);
      ++i;
    } else {
      out.push_back(path[i]);
    }
  }
  return out;
}

}  // namespace cxlkv::preload

#include "peers/loopback_server.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"

namespace cxlkv::bench {
namespace {

std::string Errno(int err) {
  char buf[256];
  return strerror_r(err, buf, sizeof(buf));  // GNU strerror_r: returns the message
}

// Closes the descriptor on scope exit.
class Fd {
 public:
  explicit Fd(int fd = -1) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }

 private:
  int fd_;
};

// `n` distinct free TCP ports on 127.0.0.1: each is bound to port 0 and the kernel's choice
// read back; all stay bound until every one is chosen, so they differ. Another process may
// take one before the server binds it; Start() retries when the server then exits.
absl::StatusOr<std::vector<int>> FreeLoopbackPorts(int n) {
  std::vector<std::unique_ptr<Fd>> held;
  std::vector<int> ports;
  for (int i = 0; i < n; ++i) {
    auto fd = std::make_unique<Fd>(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
    if (fd->get() < 0) return absl::InternalError(absl::StrCat("socket: ", Errno(errno)));
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = 0;
    socklen_t len = sizeof(addr);
    if (::bind(fd->get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
        ::getsockname(fd->get(), reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
      return absl::InternalError(absl::StrCat("bind 127.0.0.1:0: ", Errno(errno)));
    }
    ports.push_back(ntohs(addr.sin_port));
    held.push_back(std::move(fd));
  }
  return ports;
}

void SleepMs(long ms) {
  timespec ts{ms / 1000, (ms % 1000) * 1000000};
  while (::nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

// Everything a forked child needs, built before fork(): after fork() in a multi-threaded
// process only async-signal-safe calls are allowed, so no allocation happens there.
struct ExecArgs {
  std::vector<std::string> strings;
  std::vector<char*> ptrs;
  explicit ExecArgs(std::vector<std::string> s) : strings(std::move(s)) {
    for (std::string& x : strings) ptrs.push_back(x.data());
    ptrs.push_back(nullptr);
  }
  char* const* get() { return ptrs.data(); }
};

// Whether `pid` has exited (gone, or a zombie nobody reaped yet: once this process is dead
// the server is re-parented, and the new parent may take its time). Async-signal-safe.
bool Exited(pid_t pid) {
  if (::kill(pid, 0) != 0) return true;
  char path[32] = "/proc/";
  char digits[16];
  int n = 0;
  for (auto v = static_cast<unsigned>(pid); v != 0 && n < 16; v /= 10)
    digits[n++] = static_cast<char>('0' + v % 10);
  char* p = path + 6;
  while (n > 0) *p++ = digits[--n];
  const char kStat[] = "/stat";
  for (char c : kStat) *p++ = c;  // copies the terminating NUL too
  const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return true;
  char buf[512];
  const ssize_t len = ::read(fd, buf, sizeof(buf));
  ::close(fd);
  // "pid (comm) S ...": the state follows the last ')'.
  for (ssize_t i = len - 1; i >= 0; --i) {
    if (buf[i] == ')') return i + 2 < len && (buf[i + 2] == 'Z' || buf[i + 2] == 'X');
  }
  return false;
}

// The guard process (see the header). Reads the server's pid, then waits: one more byte
// means "stopped normally, only remove the directory"; end of file means this process died
// and the server's process group must be killed first.
[[noreturn]] void RunGuard(int read_fd, ExecArgs& rm) {
  ::setpgid(0, 0);  // out of the benchmark's group: a terminal's ^C must not kill the guard
  ::signal(SIGINT, SIG_IGN);
  ::signal(SIGHUP, SIG_IGN);
  ::signal(SIGTERM, SIG_IGN);
  ::close_range(0, static_cast<unsigned>(read_fd) - 1, 0);
  ::close_range(static_cast<unsigned>(read_fd) + 1, ~0u, 0);
  auto read_some = [read_fd](void* dst, std::size_t len) {
    ssize_t n;
    do {
      n = ::read(read_fd, dst, len);
    } while (n < 0 && errno == EINTR);
    return n;
  };
  pid_t server = -1;
  if (read_some(&server, sizeof(server)) != static_cast<ssize_t>(sizeof(server))) server = -1;
  char done = 0;
  if (server > 0 && read_some(&done, 1) != 1) {
    ::kill(-server, SIGKILL);
    for (int i = 0; i < 500 && !Exited(server); ++i) SleepMs(10);
  }
  char* const empty_env[] = {nullptr};
  ::execve("/bin/rm", rm.get(), empty_env);
  ::_exit(127);
}

}  // namespace

absl::StatusOr<std::string> FindInPath(const std::string& binary) {
  const char* path = std::getenv("PATH");  // NOLINT(concurrency-mt-unsafe): read-only use
  const std::string dirs = path != nullptr ? path : "/usr/local/bin:/usr/bin:/bin";
  for (absl::string_view dir : absl::StrSplit(dirs, ':', absl::SkipEmpty())) {
    std::string candidate = absl::StrCat(dir, "/", binary);
    if (::access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return absl::NotFoundError(absl::StrCat(binary, ": not found in PATH (", dirs, ")"));
}

absl::StatusOr<std::unique_ptr<LoopbackServer>> LoopbackServer::Start(const ServerSpec& spec) {
  auto binary = FindInPath(spec.binary);
  if (!binary.ok()) {
    return absl::NotFoundError(absl::StrCat(
        binary.status().message(), "; install it with: apt-get install ", spec.debian_package));
  }
  absl::Status last;
  for (int attempt = 1; attempt <= 3; ++attempt) {
    std::unique_ptr<LoopbackServer> server(new LoopbackServer);
    server->name_ = spec.name;
    server->binary_path_ = *binary;
    last = server->Launch(spec);
    if (last.ok()) return server;
    if (!absl::IsUnavailable(last)) break;  // only an early exit (a port race) is retried
  }
  return last;
}

absl::Status LoopbackServer::Launch(const ServerSpec& spec) {
  const std::filesystem::path tmp = std::filesystem::temp_directory_path();
  std::string templ = (tmp / absl::StrCat("cxlkv-bench-", spec.name, "-XXXXXX")).string();
  if (::mkdtemp(templ.data()) == nullptr) {
    return absl::InternalError(absl::StrCat("mkdtemp ", templ, ": ", Errno(errno)));
  }
  dir_ = templ;
  auto ports = FreeLoopbackPorts(spec.ports);
  if (!ports.ok()) return ports.status();
  ports_ = *ports;

  std::vector<std::string> argv = {binary_path_};
  for (std::string& a : spec.args(dir_, ports_)) argv.push_back(std::move(a));
  ExecArgs exec_argv(std::move(argv));
  // A minimal environment: no ETCD_* or REDIS_* variable of the caller's reaches the server.
  ExecArgs exec_env({"PATH=/usr/sbin:/usr/bin:/sbin:/bin", absl::StrCat("HOME=", dir_), "LANG=C"});
  ExecArgs rm_argv({"/bin/rm", "-rf", "--", dir_});
  const std::string log_path = dir_ + "/server.log";
  Fd log(::open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  Fd devnull(::open("/dev/null", O_RDONLY | O_CLOEXEC));
  if (log.get() < 0 || devnull.get() < 0) {
    return absl::InternalError(absl::StrCat("open ", log_path, ": ", Errno(errno)));
  }

  // The guard first, so there is no moment when the server runs unguarded.
  int pipe_fds[2];
  if (::pipe2(pipe_fds, O_CLOEXEC) != 0) {
    return absl::InternalError(absl::StrCat("pipe2: ", Errno(errno)));
  }
  guard_pid_ = ::fork();
  if (guard_pid_ == 0) RunGuard(pipe_fds[0], rm_argv);
  ::close(pipe_fds[0]);
  if (guard_pid_ < 0) {
    ::close(pipe_fds[1]);
    return absl::InternalError(absl::StrCat("fork: ", Errno(errno)));
  }
  guard_fd_ = pipe_fds[1];

  pid_ = ::fork();
  if (pid_ == 0) {
    ::setpgid(0, 0);
    ::dup2(devnull.get(), 0);
    ::dup2(log.get(), 1);
    ::dup2(log.get(), 2);
    ::close_range(3, ~0u, 0);
    if (::chdir(dir_.c_str()) != 0) ::_exit(126);
    ::execve(exec_argv.ptrs[0], exec_argv.get(), exec_env.get());
    ::_exit(127);
  }
  if (pid_ < 0) return absl::InternalError(absl::StrCat("fork: ", Errno(errno)));
  ::setpgid(pid_, pid_);  // also here: kill(-pid_) must work even before the child runs
  if (::write(guard_fd_, &pid_, sizeof(pid_)) != static_cast<ssize_t>(sizeof(pid_))) {
    return absl::InternalError(absl::StrCat("write to the guard: ", Errno(errno)));
  }

  const absl::Time deadline = absl::Now() + spec.start_timeout;
  absl::Status probe;
  while (absl::Now() < deadline) {
    int wstatus = 0;
    if (::waitpid(pid_, &wstatus, WNOHANG) == pid_) {
      pid_ = -1;
      return absl::UnavailableError(
          absl::StrCat(spec.name, " (", binary_path_, ") exited during start-up with ",
                       WIFEXITED(wstatus) ? absl::StrCat("status ", WEXITSTATUS(wstatus))
                                          : absl::StrCat("signal ", WTERMSIG(wstatus)),
                       "; its log ends:\n", LogTail()));
    }
    probe = spec.ready(ports_[0]);
    if (probe.ok()) return absl::OkStatus();
    if (absl::IsFailedPrecondition(probe)) return probe;  // can never answer: see ServerSpec
    SleepMs(20);
  }
  return absl::DeadlineExceededError(
      absl::StrCat(spec.name, " did not answer on 127.0.0.1:", ports_[0], " within ",
                   absl::FormatDuration(spec.start_timeout), " (last probe: ", probe.ToString(),
                   "); its log ends:\n", LogTail()));
}

std::string LoopbackServer::LogTail() const {
  std::ifstream in(dir_ + "/server.log");
  std::stringstream ss;
  ss << in.rdbuf();
  std::string text = ss.str();
  constexpr std::size_t kTail = 2000;
  return text.size() > kTail ? text.substr(text.size() - kTail) : text;
}

void LoopbackServer::Stop() {
  if (pid_ > 0) {
    ::kill(-pid_, SIGTERM);
    int wstatus = 0;
    pid_t r = 0;
    for (int i = 0; i < 1000 && (r = ::waitpid(pid_, &wstatus, WNOHANG)) == 0; ++i) SleepMs(10);
    if (r == 0) {
      ::kill(-pid_, SIGKILL);
      ::waitpid(pid_, &wstatus, 0);
    }
    pid_ = -1;
  }
  if (guard_fd_ >= 0) {
    const char done = 1;  // the server is gone: the guard only removes the directory
    if (::write(guard_fd_, &done, 1) != 1) {
      // The guard then sees end of file and kills a process group that no longer exists.
    }
    ::close(guard_fd_);
    guard_fd_ = -1;
  }
  if (guard_pid_ > 0) {
    int wstatus = 0;
    ::waitpid(guard_pid_, &wstatus, 0);
    guard_pid_ = -1;
  }
  if (!dir_.empty()) {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);  // normally already gone (the guard's rm -rf)
    dir_.clear();
  }
}

LoopbackServer::~LoopbackServer() { Stop(); }

}  // namespace cxlkv::bench

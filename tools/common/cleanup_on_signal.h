// What the quickstart's drivers (cxlkv-workload, cxlkv-prefix-share) leave when they are
// interrupted: nothing. CleanupOnSignal::Install() makes SIGINT, SIGTERM and SIGHUP remove the
// one file the tool registered with RemoveOnSignal() (the pool file cxlkv-workload created)
// and then end the tool by that signal, so a shell sees the interruption. The children it
// forked through Fork() die with it (PR_SET_PDEATHSIG, SIGKILL), however it dies: no pid
// table to signal, so no pid reused since is ever killed. After a kill -9 the file stays,
// which is why a tool names it when it creates it.
//
// The handler reads only the path, written with the three signals blocked, through
// async-signal-safe calls (unlink, signal, raise). Process-wide; call from the main thread
// (the one that forks: a child's death signal follows its forking thread), before any other.
#ifndef CXLKV_TOOLS_COMMON_CLEANUP_ON_SIGNAL_H_
#define CXLKV_TOOLS_COMMON_CLEANUP_ON_SIGNAL_H_

#include <pthread.h>
#include <sys/prctl.h>
#include <sys/types.h>
#include <unistd.h>

#include <csignal>
#include <cstddef>
#include <cstring>
#include <string>

namespace cxlkv::tools {

class CleanupOnSignal {
 public:
  // Installs the handlers for SIGINT, SIGTERM and SIGHUP. Idempotent.
  static void Install() {
    struct sigaction sa {};
    sa.sa_handler = &Handle;
    sigemptyset(&sa.sa_mask);
    for (int sig : kSignals) sigaddset(&sa.sa_mask, sig);  // one cleanup at a time
    for (int sig : kSignals) ::sigaction(sig, &sa, nullptr);
  }

  // Registers `path` (a file this process created) to be unlinked on one of the signals;
  // "" forgets it. A path longer than PATH_MAX - 1 bytes is not registered: false.
  static bool RemoveOnSignal(const std::string& path) {
    if (path.size() >= sizeof(path_)) return false;
    const Blocked blocked;
    std::memcpy(path_, path.c_str(), path.size() + 1);
    path_set_ = path.empty() ? 0 : 1;
    return true;
  }

  // fork(2), with the signals blocked across it, so the child never runs the handler (it
  // would remove the parent's file): it starts with their default actions, and is killed when
  // its parent dies. -1 with errno as fork's.
  static pid_t Fork() {
    const pid_t parent = ::getpid();
    const Blocked blocked;
    const pid_t pid = ::fork();
    if (pid == 0) {
      for (int sig : kSignals) ::signal(sig, SIG_DFL);
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != parent) ::_exit(1);  // the parent died before the prctl
    }
    return pid;  // the child unblocks the signals as the parent does, with `blocked`
  }

 private:
  static constexpr int kSignals[] = {SIGINT, SIGTERM, SIGHUP};

  // The three signals blocked for this object's life.
  class Blocked {
   public:
    Blocked() {
      sigset_t set;
      sigemptyset(&set);
      for (int sig : kSignals) sigaddset(&set, sig);
      ::pthread_sigmask(SIG_BLOCK, &set, &old_);
    }
    ~Blocked() { ::pthread_sigmask(SIG_SETMASK, &old_, nullptr); }
    Blocked(const Blocked&) = delete;
    Blocked& operator=(const Blocked&) = delete;

   private:
    sigset_t old_;
  };

  static void Handle(int sig) {
    if (path_set_ != 0) ::unlink(path_);
    // Ends the process by `sig` once the handler returns (the signal is blocked until then).
    ::signal(sig, SIG_DFL);
    ::raise(sig);
  }

  inline static char path_[4096] = {};
  inline static volatile std::sig_atomic_t path_set_ = 0;
};

}  // namespace cxlkv::tools

#endif  // CXLKV_TOOLS_COMMON_CLEANUP_ON_SIGNAL_H_

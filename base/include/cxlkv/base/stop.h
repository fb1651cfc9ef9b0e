// cxlkv/base/stop.h — stopping threads that wait: a stop flag whose waits end when it is
// raised (StopSignal), and a helper that ends an HTTP server's wait for connections while it
// stops (ListenerWake; Linux: it reads /proc/self/fd).
//
// A thread that works every N ms waits with `while (!stop.SleepFor(period)) Work();` instead
// of sleep_for: Stop() then ends the wait at once, so a stopping process joins its threads in
// microseconds rather than a period (issue #42 item 5: cxlkv-orchestrator exits within 200 ms
// of SIGTERM). The flag is an atomic besides, for loops that only test it.
//
// Thread-safety: every member of both classes may be called from any thread.
#ifndef CXLKV_BASE_STOP_H_
#define CXLKV_BASE_STOP_H_

#include <atomic>
#include <chrono>
#include <string>
#include <thread>

#include "cxlkv/base/mutex.h"

namespace cxlkv::base {

class StopSignal {
 public:
  StopSignal() = default;
  StopSignal(const StopSignal&) = delete;
  StopSignal& operator=(const StopSignal&) = delete;

  // Raises the flag and ends every wait in SleepFor. True for the call that raised it, false
  // when it was raised already (so a Stop() that must run once can test it).
  bool Stop() {
    {
      MutexLock l(mu_);
      if (stopped_.exchange(true, std::memory_order_acq_rel)) return false;
    }
    cv_.NotifyAll();
    return true;
  }
  bool stopped() const { return stopped_.load(std::memory_order_acquire); }
  // The flag, for code that tests an atomic it was given.
  const std::atomic<bool>& flag() const { return stopped_; }

  // Waits `d`, or until Stop(): true when stopped (at once when it was already).
  bool SleepFor(std::chrono::steady_clock::duration d) {
    const auto deadline = std::chrono::steady_clock::now() + d;
    MutexLock l(mu_);
    while (!stopped_.load(std::memory_order_acquire)) {
      if (!cv_.WaitUntil(mu_, deadline)) break;
    }
    return stopped_.load(std::memory_order_acquire);
  }

 private:
  // Stop takes mu_ to raise the flag, so a waiter that tested it under mu_ is waiting before
  // the notify comes: no wake-up is lost.
  Mutex mu_;
  CondVar cv_;
  std::atomic<bool> stopped_{false};
};

// While it lives, wakes the threads of an HTTP server on HOST:PORT in this process that wait
// for a connection or a request, every `every`, from a thread of its own. For civetweb (the
// coordinator's HTTP API; prometheus-cpp's metrics endpoint), whose mg_stop sets a flag and
// joins threads that test it only between polls:
//  - its listening thread polls the listening sockets SOCKET_TIMEOUT_QUANTUM (2 s in Debian's
//    1.15) at a time: a connection to the port (made and closed at once) ends that poll. One
//    that arrives before the flag was seen is handed to a worker, which reads its end and
//    closes it;
//  - a worker idle in a kept-alive connection polls it for keep_alive_timeout_ms (500 ms):
//    the reading side of every TCP connection of this process on that local port is shut
//    (shutdown SHUT_RD: the poll ends, the worker reads the end and closes the connection).
//    A reply being written is not affected, and Linux still delivers what the client sent
//    (civetweb reads no new request once its flag is up anyway).
// So: { base::ListenerWake wake(host, port); mg_stop(ctx); }  Only while the server stops:
// a server that keeps running loses its kept-alive connections.
// `host` as the server was told to listen (a name, an address, [v6], or a wildcard: "",
// 0.0.0.0, ::, [::] mean the loopback of that family). No connection is made when it does not
// resolve; every connect is non-blocking and waits at most `every` to complete.
class ListenerWake {
 public:
  ListenerWake(std::string host, int port,
               std::chrono::milliseconds every = std::chrono::milliseconds(5));
  ~ListenerWake();
  ListenerWake(const ListenerWake&) = delete;
  ListenerWake& operator=(const ListenerWake&) = delete;
  // Connections made so far (for tests).
  int connects() const { return connects_.load(); }

 private:
  StopSignal done_;
  std::atomic<int> connects_{0};
  std::thread thread_;
};

}  // namespace cxlkv::base

#endif  // CXLKV_BASE_STOP_H_

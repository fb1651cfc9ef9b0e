// An ordinary program (no cxlkv code) that the preload shim runs with its heap in extents of
// a pooled domain (tests/preload_pooled_test.cc drives it). Commands on stdin, one per line;
// one reply line each on stdout:
//   alloc N     allocate N buffers of 4 MiB (malloc), fill each with its own pattern -> "ok"
//   check       verify every buffer's pattern                     -> "ok" | "bad BUF OFFSET"
//   mark TEXT   write TEXT at offset 4096 of buffer 0             -> "ok"
//   fork        a child checks every buffer, allocates and fills one more, exits -> "ok" | "bad"
//   exit        free everything and exit 0
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

constexpr std::size_t kBytes = 4u << 20;

struct Buf {
  unsigned char* p;
  std::uint32_t seed;
};
std::vector<Buf> bufs;

unsigned char Byte(std::uint32_t seed, std::size_t i) {
  return static_cast<unsigned char>((seed * 2654435761u + i * 40503u) >> 7);
}

void Fill(Buf& b) {
  for (std::size_t i = 0; i < kBytes; ++i) b.p[i] = Byte(b.seed, i);
}

// Offset of the first wrong byte, or -1. The first 8 KiB of buffer 0 may hold marks.
long Check(const Buf& b, bool first) {
  for (std::size_t i = first ? 8192 : 0; i < kBytes; ++i) {
    if (b.p[i] != Byte(b.seed, i)) return static_cast<long>(i);
  }
  return -1;
}

std::string CheckAll() {
  for (std::size_t k = 0; k < bufs.size(); ++k) {
    const long off = Check(bufs[k], k == 0);
    if (off >= 0) return "bad " + std::to_string(k) + " " + std::to_string(off);
  }
  return "ok";
}

bool AllocOne() {
  auto* p = static_cast<unsigned char*>(std::malloc(kBytes));
  if (p == nullptr) return false;
  bufs.push_back(Buf{p, static_cast<std::uint32_t>(bufs.size() + 1)});
  Fill(bufs.back());
  return true;
}

}  // namespace

int main() {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  char line[512];
  while (std::fgets(line, sizeof(line), stdin) != nullptr) {
    line[std::strcspn(line, "\n")] = '\0';
    if (std::strncmp(line, "alloc ", 6) == 0) {
      const int n = std::atoi(line + 6);
      bool ok = true;
      for (int i = 0; i < n && ok; ++i) ok = AllocOne();
      std::puts(ok ? "ok" : "bad malloc");
    } else if (std::strcmp(line, "check") == 0) {
      std::puts(CheckAll().c_str());
    } else if (std::strncmp(line, "mark ", 5) == 0 && !bufs.empty()) {
      std::memcpy(bufs[0].p + 4096, line + 5, std::strlen(line + 5));
      std::puts("ok");
    } else if (std::strcmp(line, "fork") == 0) {
      const pid_t c = fork();
      if (c == 0) {
        const bool ok = CheckAll() == "ok" && AllocOne() && CheckAll() == "ok";
        _exit(ok ? 0 : 1);
      }
      int st = 0;
      waitpid(c, &st, 0);
      std::puts(WIFEXITED(st) && WEXITSTATUS(st) == 0 ? "ok" : "bad");
    } else if (std::strcmp(line, "exit") == 0) {
      for (Buf& b : bufs) std::free(b.p);
      return 0;
    } else {
      std::printf("bad command '%s'\n", line);
    }
  }
  return 0;
}

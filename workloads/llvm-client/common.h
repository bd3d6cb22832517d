// What the two CPU clients of LLVM's RPC protocol, driver.cpp (`llvm-client`) and dispatch.cpp
// (`llvm-dispatch`), share: failing, a deterministic number source, the mailbox options of the
// command line and mapping the mailbox. Each includes it once, after defining `PROGRAM`, the
// name its messages start with; it needs nothing of LLVM's headers.

#pragma once

#include <cerrno>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fcntl.h>
#include <string>
#include <sys/mman.h>
#include <unistd.h>

namespace {

[[noreturn]] void die(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
[[noreturn]] void die(const char *fmt, ...) {
  char msg[4096];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  // Several threads may fail at once: one write per message, then out without running the
  // destructors under the other threads' feet.
  std::string line = std::string(PROGRAM) + ": FAILED: " + msg + "\n";
  ssize_t ignored = write(2, line.data(), line.size());
  (void)ignored;
  _exit(1);
}

// SplitMix64: the values of every call, the same for the same seed.
struct SplitMix {
  uint64_t state;
  uint64_t next() {
    uint64_t z = (state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  std::string bytes(size_t n) {
    std::string out(n, '\0');
    for (size_t i = 0; i < n; ++i)
      out[i] = static_cast<char>(next());
    return out;
  }
};

// The mailbox rpc-serve announced (`ready MAILBOX B`): its file, its bytes, its ports; and the
// client threads of the parallel part (0: the serial part only).
struct Mailbox {
  const char *path = nullptr;
  uint64_t bytes = 0;
  uint32_t ports = 0;
  int threads = 4;
};

// Parses `MAILBOX --bytes B --ports N [--threads T]` and the program's own options:
// `option(arg, value)` takes `arg` if it is one (calling `value()` for its value) and says
// whether it did. Anything else, or an option without its value, goes to `usage`.
template <typename F>
Mailbox parse_args(int argc, char **argv, void (*usage)(const char *), F &&option) {
  Mailbox mailbox;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    auto value = [&]() -> const char * {
      if (i + 1 >= argc)
        usage(("missing value of " + arg).c_str());
      return argv[++i];
    };
    if (arg == "--bytes")
      mailbox.bytes = strtoull(value(), nullptr, 10);
    else if (arg == "--ports")
      mailbox.ports = static_cast<uint32_t>(strtoul(value(), nullptr, 10));
    else if (arg == "--threads")
      mailbox.threads = atoi(value());
    else if (option(arg, value))
      continue;
    else if (!mailbox.path && arg[0] != '-')
      mailbox.path = argv[i];
    else
      usage(("unexpected argument " + arg).c_str());
  }
  return mailbox;
}

// The mailbox's bytes, mapped shared with rpc-serve.
void *map_mailbox(const Mailbox &mailbox) {
  int fd = open(mailbox.path, O_RDWR);
  if (fd < 0)
    die("opening %s: %s", mailbox.path, strerror(errno));
  void *base = mmap(nullptr, mailbox.bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (base == MAP_FAILED)
    die("mapping %s: %s", mailbox.path, strerror(errno));
  close(fd);
  return base;
}

} // namespace

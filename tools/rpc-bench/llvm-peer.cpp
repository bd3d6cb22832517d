// llvm-peer: LLVM's own host RPC server over a shared-memory mailbox, with rpc-serve's command
// line, so that `cargo xtask bench --peer llvm` can run every cross-process row against both.
//
// Ours (the glue); LLVM's code is only included: `rpc::Server` from libc/shared/rpc.h and
// `handle_libc_opcodes` from libc/shared/rpc_server.h, fetched from Debian's llvm-toolchain
// source packages at bench time and never committed. The serving loop is the one of LLVM's
// offload plugins (offload/plugins-nextgen/common/src/RPC.cpp, `ServerThread::run` and
// `runServer`), restated for one mailbox whose kernel runs for our whole life: open one port per
// iteration (`try_open` scans from port 0), handle it, close it. When an iteration opened
// nothing, LLVM 22 sleeps 250 us once no port was open for 25 us; LLVM 23 sleeps 250 us at once
// (its default `SleepFunction`, include/RPC.h; a plugin with a doorbell waits on it instead, and
// a cross-process client has none).
//
//   llvm-peer --gen v1|v2 --ports N --lanes L [--memfd | --file PATH] [--stdout FILE]
//             [other rpc-serve flags]
//
// The mailbox is a fresh memfd, or with `--file PATH` the existing file PATH of exactly the
// mailbox's size, served as it is (unlike rpc-serve's `--file`, which creates or truncates
// PATH): the bench has rpc-serve create it and this server serve the same memory, so both
// are measured on the same cache lines. Prints `ready PATH BYTES` (`/proc/PID/fd/N` for the
// memfd) once it serves; SIGTERM or SIGINT end it with
// `stopped: served=K`. The generation must be the one the headers speak (LLVM 22: v1,
// LLVM 23: v2). Flags of rpc-serve it has no use for (--files, --stderr, --client-timeout,
// --allow-system, --dispatch-tests) are accepted and ignored; LLVM 23's peer always serves the
// typed `add` and `sum` (0x64000000, 0x64000004) with `rpc::invoke`.

#include "shared/rpc.h"
#include "shared/rpc_opcodes.h"
#include "shared/rpc_server.h"

#if LLVM_PEER_GENERATION == 1
// LLVM 22: the handlers live in libc's namespace, and the caller closes the port.
static auto handle(rpc::Server::Port &port, uint32_t lanes) {
  auto status = LIBC_NAMESPACE::shared::handle_libc_opcodes(port, lanes);
  port.close();
  return status;
}
#else
// LLVM 23: the handlers are in namespace rpc, and the port closes when it goes out of scope.
// Typed calls (`rpc_dispatch.h`): `add` and `sum` of rpc-serve's --dispatch-tests (PROTOCOL
// section 12), served by LLVM's own `rpc::invoke`, for the bench's typed rows.
#include "shared/rpc_dispatch.h"
static uint64_t typed_add(uint64_t a, uint32_t b) { return a + b; }
static uint64_t typed_sum(const uint32_t *xs, uint64_t n) {
  uint64_t total = 0;
  for (uint64_t i = 0; i < n; ++i)
    total += xs[i];
  return total;
}
template <uint32_t LANES> static bool invoke_typed(rpc::Server::Port &port) {
  switch (port.get_opcode()) {
  case 0x64000000:
    rpc::invoke<LANES>(port, typed_add);
    return true;
  case 0x64000004:
    rpc::invoke<LANES>(port, typed_sum);
    return true;
  default:
    return false;
  }
}
static auto handle(rpc::Server::Port &port, uint32_t lanes) {
  bool typed = lanes == 1    ? invoke_typed<1>(port)
               : lanes == 32 ? invoke_typed<32>(port)
                             : invoke_typed<64>(port);
  return typed ? rpc::RPC_SUCCESS : rpc::handle_libc_opcodes(port, lanes);
}
#endif

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#ifndef LLVM_PEER_GENERATION
#error "build with -DLLVM_PEER_GENERATION=1 (LLVM 22) or 2 (LLVM 23)"
#endif

static std::atomic<bool> stop_requested{false};

static void on_signal(int) { stop_requested.store(true, std::memory_order_relaxed); }

[[noreturn]] static void usage(const char *why) {
  std::fprintf(stderr,
               "llvm-peer: %s\nusage: llvm-peer --gen v1|v2 --ports N --lanes L "
               "[--memfd | --file PATH] [--stdout FILE]\n",
               why);
  std::exit(2);
}

int main(int argc, char **argv) {
  std::string generation, stdout_path, file_path;
  unsigned long ports = 0, lanes = 0;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc)
        usage((arg + " needs a value").c_str());
      return argv[++i];
    };
    if (arg == "--gen")
      generation = value();
    else if (arg == "--ports")
      ports = std::strtoul(value().c_str(), nullptr, 10);
    else if (arg == "--lanes")
      lanes = std::strtoul(value().c_str(), nullptr, 10);
    else if (arg == "--stdout")
      stdout_path = value();
    else if (arg == "--file")
      file_path = value();
    else if (arg == "--memfd" || arg == "--allow-system" || arg == "--dispatch-tests")
      continue;
    else if (arg == "--files" || arg == "--stderr" || arg == "--client-timeout")
      value();
    else
      usage(("unknown argument " + arg).c_str());
  }
  if (generation != (LLVM_PEER_GENERATION == 1 ? "v1" : "v2"))
    usage("this build speaks only the generation of its LLVM headers");
  if (ports == 0 || ports > rpc::MAX_PORT_COUNT)
    usage("--ports must be 1..MAX_PORT_COUNT of these headers");
  if (lanes != 1 && lanes != 32 && lanes != 64)
    usage("--lanes must be 1, 32 or 64");

  // The mailbox: a memfd sized as LLVM's loader sizes it, zeroed (a fresh memfd is), or the
  // given file, which must be that size already.
  const uint64_t bytes = rpc::Server::allocation_size(lanes, ports);
  int fd;
  std::string path;
  if (file_path.empty()) {
    fd = memfd_create("llvm-peer-mailbox", MFD_CLOEXEC);
    if (fd < 0 || ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
      std::perror("llvm-peer: memfd");
      return 1;
    }
    path = "/proc/" + std::to_string(getpid()) + "/fd/" + std::to_string(fd);
  } else {
    fd = open(file_path.c_str(), O_RDWR | O_CLOEXEC);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0) {
      std::perror(("llvm-peer: " + file_path).c_str());
      return 1;
    }
    if (static_cast<uint64_t>(st.st_size) != bytes) {
      std::fprintf(stderr, "llvm-peer: %s is %lld bytes, the mailbox %llu\n", file_path.c_str(),
                   static_cast<long long>(st.st_size), static_cast<unsigned long long>(bytes));
      return 1;
    }
    path = file_path;
  }
  void *buffer = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (buffer == MAP_FAILED) {
    std::perror("llvm-peer: mmap");
    return 1;
  }

  // The device's stdout goes to --stdout; the ready and stopped lines to our real stdout.
  FILE *announce = fdopen(dup(STDOUT_FILENO), "w");
  if (!announce || (!stdout_path.empty() && !std::freopen(stdout_path.c_str(), "w", stdout))) {
    std::perror("llvm-peer: stdout");
    return 1;
  }
  std::signal(SIGTERM, on_signal);
  std::signal(SIGINT, on_signal);

  rpc::Server server(static_cast<uint32_t>(ports), buffer);
  std::fprintf(announce, "ready %s %llu\n", path.c_str(), static_cast<unsigned long long>(bytes));
  std::fflush(announce);

  // RPC.cpp's ServerThread::run with one user for our whole life.
  static constexpr auto IdleSleep = std::chrono::microseconds(250);
#if LLVM_PEER_GENERATION == 1
  static constexpr auto IdleTime = std::chrono::microseconds(25);
  auto last_use = std::chrono::steady_clock::now();
#endif
  bool client_in_use = false;
  unsigned long long served = 0, failed = 0;
  while (!stop_requested.load(std::memory_order_relaxed)) {
#if LLVM_PEER_GENERATION == 1
    auto now = std::chrono::steady_clock::now();
    if (!client_in_use && now - last_use >= IdleTime)
      std::this_thread::sleep_for(IdleSleep);
    else if (client_in_use)
      last_use = now;
#else
    if (!client_in_use)
      std::this_thread::sleep_for(IdleSleep);
#endif
    client_in_use = false;

    // RPC.cpp's runServer, without the plugin's own opcodes (MALLOC, FREE, HOST_CALL).
    auto port = server.try_open(static_cast<uint32_t>(lanes));
    if (!port)
      continue;
    client_in_use = true;
    if (handle(*port, static_cast<uint32_t>(lanes)) != rpc::RPC_SUCCESS)
      ++failed;
    ++served;
  }
  std::fflush(stdout);
  std::fprintf(announce, "stopped: served=%llu failed=%llu\n", served, failed);
  std::fflush(announce);
  return 0;
}

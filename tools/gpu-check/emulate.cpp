// emulate.cpp: runs rpc_client.cu's kernels on the CPU against a real server, to test the
// client's protocol logic where there is no GPU. Each CUDA thread is a std::thread; the warp
// collectives (__shfl_sync, __syncwarp, __any_sync) are rendezvous of the lanes of their mask;
// __activemask() is the warp's existing lanes (every kernel here keeps its warps converged,
// except the lanes of a partial last warp, which do not exist); fences are C++ fences. The
// mailbox is a shared-memory file served by `rpc-serve` (plugin-host), v1, L = 32.
//
//   g++ -std=c++17 -O1 -pthread -o emulate emulate.cpp
//   rpc-serve --file MAILBOX --gen v1 --ports N --lanes 32 --stdout OUT &
//   ./emulate MAILBOX N EXPECTED   # then compare OUT with EXPECTED (sorted); emulate.sh does all
//
// What it cannot show: real GPU memory ordering over PCIe, real warp divergence, nvcc's code.

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fcntl.h>
#include <functional>
#include <mutex>
#include <string>
#include <sys/mman.h>
#include <thread>
#include <unistd.h>
#include <vector>

// --- The CUDA names rpc_client.cu uses ------------------------------------------------------

#define __device__
#define __global__

struct Dim3 {
  unsigned x, y, z;
};
static thread_local Dim3 threadIdx, blockIdx, blockDim;

struct EmuWarp {
  std::mutex m;
  std::condition_variable cv;
  unsigned lanes = 0;  // the lanes that exist
  unsigned arrived = 0;
  unsigned long long round = 0;
  unsigned values[32] = {};
  unsigned snapshot[32] = {};
};
static thread_local EmuWarp *emu_warp;

// Every lane of `mask` deposits `value`; all get every lane's value once all have arrived.
static void emu_exchange(unsigned mask, unsigned value, unsigned *all) {
  EmuWarp &w = *emu_warp;
  const unsigned lane = threadIdx.x % 32;
  std::unique_lock<std::mutex> guard(w.m);
  if ((mask >> lane & 1u) == 0 || (mask & ~w.lanes) != 0) {
    std::fprintf(stderr, "emulate: lane %u in a collective of mask %#x (lanes %#x)\n", lane,
                 mask, w.lanes);
    std::abort();
  }
  w.values[lane] = value;
  w.arrived |= 1u << lane;
  if (w.arrived == mask) {
    std::memcpy(w.snapshot, w.values, sizeof w.values);
    w.arrived = 0;
    ++w.round;
    w.cv.notify_all();
  } else {
    const unsigned long long round = w.round;
    w.cv.wait(guard, [&] { return w.round != round; });
  }
  std::memcpy(all, w.snapshot, sizeof w.snapshot);
}

static unsigned __activemask() { return emu_warp->lanes; }
static unsigned __shfl_sync(unsigned mask, unsigned value, int src) {
  unsigned all[32];
  emu_exchange(mask, value, all);
  return all[src];
}
static int __any_sync(unsigned mask, int predicate) {
  unsigned all[32];
  emu_exchange(mask, predicate != 0, all);
  for (unsigned lane = 0; lane < 32; ++lane)
    if ((mask >> lane & 1u) && all[lane]) return 1;
  return 0;
}
static void __syncwarp(unsigned mask) {
  unsigned all[32];
  emu_exchange(mask, 0, all);
}
static void __threadfence_system() { std::atomic_thread_fence(std::memory_order_seq_cst); }
static void __threadfence() { std::atomic_thread_fence(std::memory_order_seq_cst); }
static unsigned atomicOr(unsigned *address, unsigned value) {
  return __atomic_fetch_or(address, value, __ATOMIC_SEQ_CST);
}
static unsigned atomicAnd(unsigned *address, unsigned value) {
  return __atomic_fetch_and(address, value, __ATOMIC_SEQ_CST);
}
static void __nanosleep(unsigned) { std::this_thread::yield(); }
static void __trap() { std::abort(); }

#include "rpc_client.cu"

// --- The driver ------------------------------------------------------------------------------

// Runs `kernel` over blocks x threads (one-dimensional), one std::thread per CUDA thread.
static void launch(unsigned blocks, unsigned threads, const std::function<void()> &kernel) {
  const unsigned warps = (threads + 31) / 32;
  std::vector<EmuWarp> all(blocks * warps);
  for (unsigned b = 0; b < blocks; ++b)
    for (unsigned w = 0; w < warps; ++w) {
      unsigned n = threads - w * 32 < 32 ? threads - w * 32 : 32;
      all[b * warps + w].lanes = n == 32 ? 0xffffffffu : (1u << n) - 1;
    }
  std::vector<std::thread> running;
  for (unsigned b = 0; b < blocks; ++b)
    for (unsigned t = 0; t < threads; ++t)
      running.emplace_back([&, b, t] {
        threadIdx = {t, 0, 0};
        blockIdx = {b, 0, 0};
        blockDim = {threads, 1, 1};
        emu_warp = &all[b * warps + t / 32];
        kernel();
      });
  for (auto &thread : running) thread.join();
}

static int failures = 0;

static void verdicts(const char *name, const std::vector<u32> &codes) {
  int bad = 0;
  for (size_t i = 0; i < codes.size(); ++i)
    if (codes[i] != 1) {
      if (bad++ < 8) std::printf("  %s: thread %zu code %#x\n", name, i, codes[i]);
    }
  std::printf("%s %s: %zu threads\n", bad ? "FAIL" : "PASS", name, codes.size());
  failures += bad != 0;
}

int main(int argc, char **argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: emulate MAILBOX PORTS EXPECTED_STDOUT\n");
    return 2;
  }
  const u64 ports = std::strtoull(argv[2], nullptr, 10);
  // PROTOCOL section 2: align_up(D + 24N, alignof(Buffer) = 8), as LLVM places it.
  const u64 packet = (24 * ports + 7) / 8 * 8;
  const u64 size = packet + 64 * 32 * ports;
  int fd = open(argv[1], O_RDWR);
  if (fd < 0) {
    std::perror("open");
    return 1;
  }
  u8 *base = (u8 *)mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (base == MAP_FAILED) {
    std::perror("mmap");
    return 1;
  }
  // What the host's runtime writes into the client object (PROTOCOL section 2, v1, L = 32).
  __llvm_rpc_client.port_count = (u32)ports;
  __llvm_rpc_client.inbox = (u32 *)(base + 0);
  __llvm_rpc_client.outbox = (u32 *)(base + 4 * ports);
  __llvm_rpc_client.header = (Header *)(base + 8 * ports);
  __llvm_rpc_client.packet = (Buffer *)(base + packet);
  FILE *expected = std::fopen(argv[3], "w");

  {  // TEST_INCREMENT, a partial last warp (40 threads: 32 + 8).
    std::vector<u32> result(2 * 40);
    launch(2, 40, [&] { rpc_test_increment(result.data(), 3, 0); });
    verdicts("increment", result);
  }
  {  // TEST_STREAM
    const u64 per_thread = 4096;
    std::vector<u32> result(64);
    std::vector<u8> scratch(64 * 2 * per_thread);
    launch(1, 64, [&] { rpc_test_stream(result.data(), scratch.data(), per_thread); });
    verdicts("stream", result);
  }
  {  // WRITE_TO_STDOUT
    std::vector<u32> result(2 * 64);
    launch(2, 64, [&] { rpc_write_stdout(result.data()); });
    verdicts("write-to-stdout", result);
    for (unsigned b = 0; b < 2; ++b)
      for (unsigned t = 0; t < 64; ++t)
        std::fprintf(expected, "hello from block %u warp %u lane %u\n", b, t / 32, t % 32);
  }
  {  // PRINTF_TO_STDOUT
    std::vector<u32> result(2 * 64);
    std::vector<u64> written(2 * 64);
    launch(2, 64, [&] { rpc_printf_stdout(result.data(), written.data()); });
    for (unsigned b = 0; b < 2; ++b)
      for (unsigned t = 0; t < 64; ++t) {
        const unsigned lane = t % 32;
        char line[256];
        int n = std::snprintf(line, sizeof line, kPrintfFormat, b, t / 32, lane,
                              lane == 31 ? "(null)" : kWords[lane % 4], lane * 1.25 + b);
        std::fputs(line, expected);
        if (written[b * 64 + t] != (u64)n) {
          std::printf("  printf: thread %u returned %llu, expected %d\n", b * 64 + t,
                      written[b * 64 + t], n);
          result[b * 64 + t] = 4;
        }
      }
    verdicts("printf", result);
  }
  {  // EXIT (rpc-serve records it and goes on)
    std::vector<u32> result(32);
    launch(1, 32, [&] { rpc_exit(result.data(), 7); });
    verdicts("exit", result);
  }
  std::fclose(expected);
  // Every port is back with the client and unlocked (the server closes EXIT's port after the
  // kernel's last send: give it a moment).
  int stuck = 0;
  for (int attempt = 0; attempt < 100; ++attempt) {
    stuck = 0;
    for (u64 i = 0; i < ports; ++i)
      stuck += (load_word(&__llvm_rpc_client.inbox[i]) != load_word(&__llvm_rpc_client.outbox[i])) ||
               (__llvm_rpc_client.lock[i / 32] >> (i % 32) & 1u);
    if (stuck == 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  std::printf("%s ports: %d of %llu ports not back with the client\n", stuck ? "FAIL" : "PASS",
              stuck, (unsigned long long)ports);
  failures += stuck != 0;
  return failures ? 1 : 0;
}

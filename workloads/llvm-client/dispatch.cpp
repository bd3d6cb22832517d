// A CPU client of LLVM 23's typed calls, `rpc::dispatch<OPCODE, fn>(client, args...)` from
// LLVM's own `libc/shared/rpc_dispatch.h` (with `rpc.h`, fetched at test time, never
// committed), run against `rpc-serve --dispatch-tests` in another process. `cargo xtask
// llvm-client` builds and runs it (docs/llvm-compat.md).
//
//   llvm-dispatch MAILBOX --bytes B --ports N [--threads T] [--rounds R]
//
// It maps the mailbox rpc-serve announced, checks that LLVM's layout of N ports and lane size 1
// needs exactly B bytes, constructs `rpc::Client` over it as LLVM's loader does, and calls each
// of the eight test functions of PROTOCOL section 12 (class 'd', 0x64000000 + n) R times on one
// thread, then R times on each of T threads at once (default 4 and 200), with values that vary
// per call. The functions are defined here too, so every answer (results and the pointees
// copied back) is checked against what the same C++ function computes locally; any mismatch
// prints both and exits 1. The last line is "llvm-dispatch: C answers checked".

#include "rpc.h"
#include "rpc_dispatch.h"

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <new>
#include <string>
#include <thread>
#include <vector>

namespace {
constexpr const char *PROGRAM = "llvm-dispatch";
} // namespace
#include "common.h"

namespace {

// ---- the test functions, as the host would define them --------------------------------------

struct Pair {
  uint32_t a;
  uint64_t b;
};
static_assert(sizeof(Pair) == 16, "Pair is 16 bytes, 4 of them padding");

uint64_t add(uint64_t a, uint32_t b) { return a + b; }
double fma3(double x, float y, int8_t z) {
  // Two roundings, as the server's `x * y + z` (no contraction into one fma).
  volatile double product = x * static_cast<double>(y);
  return product + static_cast<double>(z);
}
uint64_t length(const char *s) { return s ? strlen(s) : UINT64_MAX; }
void negate(int64_t *x) { *x = static_cast<int64_t>(0 - static_cast<uint64_t>(*x)); }
uint64_t sum(const uint32_t *xs, uint64_t n) {
  uint64_t total = 0;
  for (uint64_t i = 0; i < n; ++i)
    total += xs[i];
  return total;
}
uint64_t pair_sum(Pair p) { return p.a + p.b; }
void ping() {}
uint32_t fill(uint32_t *out, uint32_t n, uint32_t v) {
  for (uint32_t i = 0; i < n; ++i)
    out[i] = v + i;
  return n;
}

constexpr uint32_t op(uint32_t n) { return 0x64000000u + n; }

// ---- the calls -------------------------------------------------------------------------------

alignas(rpc::Client) unsigned char client_storage[sizeof(rpc::Client)];
rpc::Client *client;

std::atomic<uint64_t> checked{0};

void expect(bool ok, int who, int round, const char *what, const std::string &detail) {
  if (!ok)
    die("thread %d round %d: %s: %s", who, round, what, detail.c_str());
  checked.fetch_add(1, std::memory_order_relaxed);
}

std::string both(uint64_t got, uint64_t want) {
  return "got " + std::to_string(got) + ", expected " + std::to_string(want);
}

void round_of_calls(int who, int round, SplitMix &rng) {
  rpc::Client &c = *client;

  uint64_t a = rng.next();
  uint32_t b = static_cast<uint32_t>(rng.next());
  uint64_t r = rpc::dispatch<op(0), add>(c, a, b);
  expect(r == add(a, b), who, round, "add", both(r, add(a, b)));

  double x = static_cast<double>(static_cast<int64_t>(rng.next() % 2000001) - 1000000) / 64.0;
  float y = static_cast<float>(static_cast<int32_t>(rng.next() % 4001) - 2000) / 8.0f;
  int8_t z = static_cast<int8_t>(rng.next());
  double d = rpc::dispatch<op(1), fma3>(c, x, y, z);
  double dw = fma3(x, y, z);
  expect(memcmp(&d, &dw, sizeof d) == 0, who, round, "fma3",
         "got " + std::to_string(d) + ", expected " + std::to_string(dw));

  // A string of 0..300 bytes (past one packet and several), NULL every seventh round.
  std::string text(rng.next() % 301, 'a' + round % 26);
  const char *s = round % 7 == 3 ? nullptr : text.c_str();
  r = rpc::dispatch<op(2), length>(c, s);
  expect(r == length(s), who, round, "length", both(r, length(s)));
  expect(s == nullptr || text == std::string(text.size(), 'a' + round % 26), who, round,
         "length's string copied back", text);

  int64_t v = static_cast<int64_t>(rng.next());
  int64_t w = v;
  rpc::dispatch<op(3), negate>(c, &v);
  negate(&w);
  expect(v == w, who, round, "negate", both(static_cast<uint64_t>(v), static_cast<uint64_t>(w)));

  // A span of 0..1100 elements (up to 4.3 KiB), n at most its length.
  std::vector<uint32_t> xs(rng.next() % 1101);
  for (auto &e : xs)
    e = static_cast<uint32_t>(rng.next());
  const std::vector<uint32_t> before = xs;
  uint64_t n = xs.empty() ? 0 : rng.next() % (xs.size() + 1);
  r = rpc::dispatch<op(4), sum>(c, rpc::span<const uint32_t>{xs.data(), xs.size()}, n);
  expect(r == sum(xs.data(), n), who, round, "sum", both(r, sum(xs.data(), n)));
  expect(xs == before, who, round, "sum's span copied back unchanged", "");

  Pair p{static_cast<uint32_t>(rng.next()), rng.next()};
  r = rpc::dispatch<op(5), pair_sum>(c, p);
  expect(r == pair_sum(p), who, round, "pair_sum", both(r, pair_sum(p)));

  rpc::dispatch<op(6), ping>(c);
  expect(true, who, round, "ping", "");

  uint32_t count = static_cast<uint32_t>(rng.next() % 700);
  uint32_t start = static_cast<uint32_t>(rng.next());
  std::vector<uint32_t> out(count, 0xdeadbeef), want(count, 0xdeadbeef);
  uint32_t got = rpc::dispatch<op(7), fill>(c, rpc::span<uint32_t>{out.data(), out.size()}, count,
                                            start);
  fill(want.data(), count, start);
  expect(got == count, who, round, "fill's result", both(got, count));
  expect(out == want, who, round, "fill's span copied back", std::to_string(count) + " elements");
}

[[noreturn]] void usage(const char *why) {
  die("%s\nusage: llvm-dispatch MAILBOX --bytes B --ports N [--threads T] [--rounds R]", why);
}

} // namespace

int main(int argc, char **argv) {
  int rounds = 200;
  const Mailbox mailbox =
      parse_args(argc, argv, usage, [&](const std::string &arg, auto value) {
        if (arg != "--rounds")
          return false;
        rounds = atoi(value());
        return true;
      });
  const uint32_t ports = mailbox.ports;
  const int threads = mailbox.threads;
  if (!mailbox.path || !mailbox.bytes || !ports || threads < 0 || rounds < 1)
    usage("missing arguments");
  if (rpc::Server::allocation_size(1, ports) != mailbox.bytes)
    die("LLVM's allocation_size(1, %u) is %llu bytes, rpc-serve's mailbox %llu", ports,
        (unsigned long long)rpc::Server::allocation_size(1, ports),
        (unsigned long long)mailbox.bytes);
  client = new (client_storage) rpc::Client(ports, map_mailbox(mailbox));

  SplitMix serial{0xd15a7c};
  for (int round = 0; round < rounds; ++round)
    round_of_calls(-1, round, serial);
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t)
    pool.emplace_back([t, rounds] {
      SplitMix rng{0x5eed00ull + static_cast<uint64_t>(t)};
      for (int round = 0; round < rounds; ++round)
        round_of_calls(t, round, rng);
    });
  for (auto &thread : pool)
    thread.join();
  printf("llvm-dispatch: %llu answers checked (%d rounds serial, then %d threads)\n",
         (unsigned long long)checked.load(), rounds, threads);
  return 0;
}

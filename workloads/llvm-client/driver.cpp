// A CPU client of LLVM libc's GPU RPC protocol, built from LLVM's own header-only client
// (`libc/shared/rpc.h`, `rpc_opcodes.h`, fetched at test time, never committed) and run
// against `rpc-serve` in another process. `cargo xtask llvm-client` builds and runs it; see
// docs/llvm-compat.md.
//
//   llvm-client MAILBOX --bytes B --ports N --gen v0|v1|v2 --expect DIR --stdin FILE [--threads T]
//
// (T defaults to 4; 0 runs the serial part only.)
//
// It maps the mailbox rpc-serve announced (`ready MAILBOX B`), checks that LLVM's layout of N
// ports and lane size 1 needs exactly B bytes, constructs `rpc::Client` over it as LLVM's loader
// does (`rpc::Client client(NumPorts, RPCBuffer)`, whose bytes the loader copies into
// `__llvm_rpc_client`), writes those bytes and the base address into DIR for the caller to
// compare with rpc-core's client object, then runs every exchange below once on one thread and
// then on T threads at once (all on the one client object, as a GPU's warps share theirs):
// TEST_INCREMENT, TEST_INTERFACE, TEST_STREAM of 0..100000 bytes, WRITE_TO_STDOUT/STDERR,
// puts (WRITE_TO_STDOUT_NEWLINE), printf of many formats (PRINTF_TO_STDOUT/STDERR/STREAM and
// the _PACKED forms), OPEN_FILE/WRITE_TO_STREAM/READ_FGETS/READ_FROM_STREAM/FEOF/FERROR/
// CLEARERR/FSEEK/FTELL/FFLUSH/UNGETC/CLOSE_FILE/RENAME/REMOVE in rpc-serve's sandbox, reads of
// rpc-serve's stdin, and MALLOC/FREE. Every reply is checked here; what rpc-serve must have
// printed (its --stdout and --stderr files) and left on disk is written into DIR, for the
// caller to compare byte for byte once rpc-serve has stopped:
//   DIR/stdout.serial, DIR/stderr.serial   the single-threaded part, in order;
//   DIR/stdout.tK, DIR/stderr.tK           thread K's lines (each starts "tK "), in its order;
//   DIR/files/NAME                         the files left in the sandbox;
//   DIR/client-object.bin, .base           the client object's bytes and the base (decimal);
//   DIR/allocation-sizes.txt               LLVM's allocation_size for some N and every L.
// Built with -DLLVM_RPC_18 against LLVM 18's libc/src/__support/RPC/rpc.h instead (see below),
// it runs everything LLVM 18's opcodes have: not printf, RENAME or REMOVE.
// Any mismatch prints what was expected and what came, and exits 1. printf's expected text is
// the host C library's (`snprintf` with the same values): rpc-serve formats like glibc.
//
// The exchanges follow LLVM's own GPU libc (libc/src/stdio/gpu, libc/src/__support/GPU) opcode
// for opcode, written here with LLVM's Port API; printf builds the argument buffer by hand the
// way clang lays out NVPTX varargs (each argument aligned to its size) or AMDGPU's packed ones,
// since an x86-64 va_list is no buffer.

#ifdef LLVM_RPC_18
// LLVM 18 has no header-only client: its client is `libc/src/__support/RPC/rpc.h` in libc's
// own namespace (built with -DLIBC_NAMESPACE=..., -isystem LIBC), its opcodes are
// `include/llvm-libc-types/rpc_opcodes_t.h`'s RPC_* (numbered 0, 1, 2... in 16 bits, no
// printf, REMOVE or RENAME). Named here as the later headers name them.
#include "include/llvm-libc-types/rpc_opcodes_t.h"
#include "include/llvm-libc-types/test_rpc_opcodes_t.h"
#include "src/__support/RPC/rpc.h"
namespace rpc = LIBC_NAMESPACE::rpc;
enum : uint32_t {
  LIBC_WRITE_TO_STDOUT = RPC_WRITE_TO_STDOUT,
  LIBC_WRITE_TO_STDERR = RPC_WRITE_TO_STDERR,
  LIBC_WRITE_TO_STREAM = RPC_WRITE_TO_STREAM,
  LIBC_WRITE_TO_STDOUT_NEWLINE = RPC_WRITE_TO_STDOUT_NEWLINE,
  LIBC_READ_FROM_STREAM = RPC_READ_FROM_STREAM,
  LIBC_READ_FGETS = RPC_READ_FGETS,
  LIBC_OPEN_FILE = RPC_OPEN_FILE,
  LIBC_CLOSE_FILE = RPC_CLOSE_FILE,
  LIBC_MALLOC = RPC_MALLOC,
  LIBC_FREE = RPC_FREE,
  LIBC_FEOF = RPC_FEOF,
  LIBC_FERROR = RPC_FERROR,
  LIBC_CLEARERR = RPC_CLEARERR,
  LIBC_FSEEK = RPC_FSEEK,
  LIBC_FTELL = RPC_FTELL,
  LIBC_FFLUSH = RPC_FFLUSH,
  LIBC_UNGETC = RPC_UNGETC,
  LIBC_TEST_INCREMENT = RPC_TEST_INCREMENT,
  LIBC_TEST_INTERFACE = RPC_TEST_INTERFACE,
  LIBC_TEST_STREAM = RPC_TEST_STREAM,
};
// The mailbox's process of the client side (its flags' offsets).
using ClientProcess = rpc::Process<false, rpc::Packet<1>>;
uint64_t llvm_allocation_size(uint32_t lanes, uint32_t ports) {
  switch (lanes) {
  case 1:
    return rpc::Server<1>::allocation_size(ports);
  case 32:
    return rpc::Server<32>::allocation_size(ports);
  default:
    return rpc::Server<64>::allocation_size(ports);
  }
}
#else
#include "rpc.h"
#include "rpc_opcodes.h"
using ClientProcess = rpc::Process<false>;
uint64_t llvm_allocation_size(uint32_t lanes, uint32_t ports) {
  return rpc::Server::allocation_size(lanes, ports);
}
#endif

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

namespace {
constexpr const char *PROGRAM = "llvm-client";
} // namespace
#include "common.h"

namespace {

// ---- failing -------------------------------------------------------------------------------

[[maybe_unused]] std::string show(const std::string &bytes) {
  std::string out;
  for (unsigned char c : bytes) {
    if (c == '\\')
      out += "\\\\";
    else if (c >= 0x20 && c < 0x7f)
      out += static_cast<char>(c);
    else {
      char esc[8];
      snprintf(esc, sizeof esc, "\\x%02x", c);
      out += esc;
    }
    if (out.size() > 600) {
      out += "...";
      break;
    }
  }
  return out;
}

void expect_u64(const char *what, uint64_t got, uint64_t want) {
  if (got != want)
    die("%s: got %llu (0x%llx), expected %llu (0x%llx)", what, (unsigned long long)got,
        (unsigned long long)got, (unsigned long long)want, (unsigned long long)want);
}

void expect_bytes(const char *what, const void *got, uint64_t got_len, const void *want,
                  uint64_t want_len) {
  if (got_len != want_len)
    die("%s: got %llu bytes, expected %llu", what, (unsigned long long)got_len,
        (unsigned long long)want_len);
  if (want_len && memcmp(got, want, want_len) != 0) {
    uint64_t at = 0;
    while (static_cast<const uint8_t *>(got)[at] == static_cast<const uint8_t *>(want)[at])
      ++at;
    die("%s: bytes differ first at offset %llu (got 0x%02x, expected 0x%02x)", what,
        (unsigned long long)at, static_cast<const uint8_t *>(got)[at],
        static_cast<const uint8_t *>(want)[at]);
  }
}

// ---- the client object, as LLVM's loader makes it ------------------------------------------

// v0 (LLVM 18): 96 bytes, v1 (LLVM 20-22): 552 bytes, both with `Port::close()` public; v2
// (LLVM 23+): 2096 bytes, close() private and run by ~Port.
constexpr int GENERATION = sizeof(rpc::Client) == 96     ? 0
                           : sizeof(rpc::Client) == 552  ? 1
                           : sizeof(rpc::Client) == 2096 ? 2
                                                         : -1;
static_assert(GENERATION != -1,
              "rpc.h is neither the v0 (96-byte), v1 (552-byte) nor v2 (2096-byte) client");

template <typename P, typename = void> struct has_public_close : std::false_type {};
template <typename P>
struct has_public_close<P, std::void_t<decltype(std::declval<P &>().close())>> : std::true_type {};
static_assert(has_public_close<rpc::Client::Port>::value == (GENERATION != 2),
              "Port::close() is public exactly in v0 and v1");

template <typename P> void close_port(P &port) {
  if constexpr (has_public_close<P>::value)
    port.close();
}

// The device's global `__llvm_rpc_client`: one object all threads (warps) share.
alignas(rpc::Client) unsigned char client_storage[sizeof(rpc::Client)];
rpc::Client *client;
// What the client object was built from.
void *client_base;
uint32_t client_ports;

// Runs `body(port)` on a port opened for OP, then closes it as the generation does.
template <uint32_t OP, typename F> void with_port(F &&body) {
  rpc::Client::Port port = client->open<OP>();
  body(port);
  close_port(port);
}

// One word sent in a packet, the word that comes back in it: the requests whose only argument
// and only result are one `uint64_t` (TEST_INCREMENT, MALLOC, and on a (tagged) stream
// CLOSE_FILE, FEOF, FERROR, FFLUSH, FTELL, CLEARERR).
template <uint32_t OP> uint64_t word_call(uint64_t word) {
  uint64_t reply = 0;
  with_port<OP>([&](rpc::Client::Port &port) {
    port.send_and_recv([=](rpc::Buffer *buffer, uint32_t) { buffer->data[0] = word; },
                       [&](rpc::Buffer *buffer, uint32_t) { reply = buffer->data[0]; });
  });
  return reply;
}

// ---- what one run (the serial one, or one thread) expects ----------------------------------

struct Run {
  // Thread index, or -1 for the serial run.
  int thread;
  std::string out;
  std::string err;
  // Files left in the sandbox: name and content.
  std::vector<std::pair<std::string, std::string>> files;
  uint64_t checks = 0;
  SplitMix rng;

  bool serial() const { return thread < 0; }
  std::string tag() const { return serial() ? "" : "t" + std::to_string(thread) + " "; }
  std::string name(const char *base) const {
    return std::string("llvm-client-") + (serial() ? "serial" : "t" + std::to_string(thread)) +
           "-" + base;
  }
};

// ---- TEST_INCREMENT, TEST_INTERFACE, TEST_STREAM -------------------------------------------

uint64_t increment(uint64_t x) { return word_call<LIBC_TEST_INCREMENT>(x); }

void test_increment(Run &run) {
  const uint64_t fixed[] = {0, 1, 41, 0xffffffffull, 0x7fffffffffffffffull, ~0ull - 1, ~0ull};
  for (uint64_t x : fixed) {
    expect_u64("TEST_INCREMENT", increment(x), x + 1);
    ++run.checks;
  }
  for (int i = 0; i < (run.serial() ? 2000 : 500); ++i) {
    uint64_t x = run.rng.next();
    expect_u64("TEST_INCREMENT", increment(x), x + 1);
    ++run.checks;
  }
}

// LLVM's own script (libc/test/integration/startup/gpu/rpc_interface_test.cpp): every adjacency
// of send and recv, the count incremented on each side; 9 at the end either way.
void test_interface(Run &run, bool end_with_send) {
  uint64_t cnt = 0;
  with_port<LIBC_TEST_INTERFACE>([&](rpc::Client::Port &port) {
    auto bump = [&](rpc::Buffer *buffer, uint32_t) { buffer->data[0] = cnt = cnt + 1; };
    auto take = [&](rpc::Buffer *buffer, uint32_t) { cnt = buffer->data[0]; };
    port.send([&](rpc::Buffer *buffer, uint32_t) { buffer->data[0] = end_with_send; });
    port.send(bump);
    port.recv(take);
    port.send(bump);
    port.recv(take);
    port.send(bump);
    port.send(bump);
    port.recv(take);
    port.recv(take);
    if (end_with_send)
      port.send(bump);
    else
      port.recv(take);
  });
  expect_u64(end_with_send ? "TEST_INTERFACE ending with send" : "TEST_INTERFACE ending with recv",
             cnt, 9);
  ++run.checks;
}

void stream_once(Run &run, uint64_t size) {
  std::string data = run.rng.bytes(size);
  std::string back;
  uint64_t back_size = ~0ull;
  void *dst = nullptr;
  with_port<LIBC_TEST_STREAM>([&](rpc::Client::Port &port) {
    port.send_n(data.data(), size);
    port.recv_n(&dst, &back_size, [&](uint64_t n) -> void * {
      back.assign(n, '\0');
      return back.data();
    });
  });
  char what[64];
  snprintf(what, sizeof what, "TEST_STREAM of %llu bytes", (unsigned long long)size);
  expect_bytes(what, back.data(), back_size, data.data(), size);
  ++run.checks;
}

void test_stream(Run &run) {
  std::vector<uint64_t> sizes;
  if (run.serial()) {
    // Every size up to 1000 (all the packet boundaries 56 + 64k there), then either side of
    // each boundary every 16 packets up to 100000, then 100000.
    for (uint64_t n = 0; n <= 1000; ++n)
      sizes.push_back(n);
    for (uint64_t edge = 56 + 64 * 16; edge < 100000; edge += 64 * 16 * 7)
      for (uint64_t n : {edge - 1, edge, edge + 1})
        sizes.push_back(n);
    sizes.push_back(100000);
  } else {
    // Fewer big ones at once: T spinning clients share the cores with the server.
    for (uint64_t n = 0; n <= 130; ++n)
      sizes.push_back(n);
    for (uint64_t n : {1000ull, 4096ull, 100000ull})
      sizes.push_back(n);
    for (int i = 0; i < 4; ++i)
      sizes.push_back(run.rng.next() % 100001);
  }
  for (uint64_t n : sizes)
    stream_once(run, n);
}

// ---- stdout and stderr ---------------------------------------------------------------------

// LLVM's file::write_impl: [WRITE_TO_STREAM: send the raw handle], send_n(data), recv(count).
template <uint32_t OP> uint64_t write_to(uint64_t handle, const void *data, uint64_t size) {
  uint64_t written = 0;
  with_port<OP>([&](rpc::Client::Port &port) {
    if constexpr (OP == LIBC_WRITE_TO_STREAM)
      port.send([=](rpc::Buffer *buffer, uint32_t) { buffer->data[0] = handle; });
    port.send_n(data, size);
    port.recv([&](rpc::Buffer *buffer, uint32_t) { written = buffer->data[0]; });
  });
  return written;
}

void test_stdio(Run &run) {
  std::vector<std::string> texts;
  if (run.serial()) {
    texts = {"", "x", "hello from LLVM's client", std::string(56, 'a'), std::string(57, 'b'),
             std::string(5000, 'c'), run.rng.bytes(300), std::string("nul\0inside", 10)};
  } else {
    for (int i = 0; i < 20; ++i)
      texts.push_back("line " + std::to_string(i) + " " + std::string(i * 13 % 200, 'a' + i));
  }
  for (std::string text : texts) {
    if (!run.serial())
      text = run.tag() + text + "\n";
    expect_u64("WRITE_TO_STDOUT: bytes written",
               write_to<LIBC_WRITE_TO_STDOUT>(0, text.data(), text.size()), text.size());
    run.out += text;
    expect_u64("WRITE_TO_STDERR: bytes written",
               write_to<LIBC_WRITE_TO_STDERR>(0, text.data(), text.size()), text.size());
    run.err += text;
    run.checks += 2;
  }
  // puts: LLVM sends the string without its NUL and wants strlen + 1 back (the newline).
  for (std::string text : {std::string("puts line"), std::string(""), std::string(200, 'p')}) {
    text = run.tag() + text;
    expect_u64("puts (WRITE_TO_STDOUT_NEWLINE): bytes written",
               write_to<LIBC_WRITE_TO_STDOUT_NEWLINE>(0, text.data(), text.size()),
               text.size() + 1);
    run.out += text + "\n";
    ++run.checks;
  }
}

// ---- printf --------------------------------------------------------------------------------
#ifndef LLVM_RPC_18 // LLVM 18 has no printf opcodes.

// `%Lf` and friends: the device passes a double (NVPTX and AMDGPU have no wider long double),
// the host C library is given the same value as a long double.
struct LongDouble {
  double value;
};

// The argument buffer the device sends: each value at its size's alignment (NVPTX varargs), or
// back to back (AMDGPU, the _PACKED opcodes).
struct ArgBuffer {
  bool packed;
  std::string bytes;
  // Non-null `%s` arguments, in format order: the strings the server may ask for.
  std::vector<const char *> strings;
  template <typename T> void put(T value) {
    if (!packed)
      while (bytes.size() % sizeof(T))
        bytes.push_back('\0');
    bytes.append(reinterpret_cast<const char *>(&value), sizeof(T));
  }
  // C's default promotions, then the device's sizes: 4-byte int, 8-byte long, double, pointer.
  void add(int v) { put<int32_t>(v); }
  void add(unsigned v) { put<uint32_t>(v); }
  void add(long v) { put<int64_t>(v); }
  void add(unsigned long v) { put<uint64_t>(v); }
  void add(long long v) { put<int64_t>(v); }
  void add(unsigned long long v) { put<uint64_t>(v); }
  void add(double v) { put<double>(v); }
  void add(LongDouble v) { put<double>(v.value); }
  void add(const void *v) { put<uint64_t>(reinterpret_cast<uintptr_t>(v)); }
  // `%s` (a `%p` or `%n` argument is passed as a `const void *`).
  void add(const char *v) {
    if (v)
      strings.push_back(v);
    put<uint64_t>(reinterpret_cast<uintptr_t>(v));
  }
};

template <typename T> T for_libc(T v) { return v; }
long double for_libc(LongDouble v) { return v.value; }

// LLVM's vfprintf_impl: [STREAM: send the raw handle], send_n(format), recv(argument bytes
// wanted), send_n(arguments), then answer each string request (buf[1] = a pointer of ours) with
// send_n(the string incl. NUL) until a reply whose buf[1] is 0 carries the result in buf[0].
template <uint32_t OP>
int printf_exchange(uint64_t handle, const std::string &format, const ArgBuffer &args,
                    uint64_t *wanted, std::vector<const char *> *asked) {
  uint32_t result = 0;
  with_port<OP>([&](rpc::Client::Port &port) {
    if constexpr (OP == LIBC_PRINTF_TO_STREAM || OP == LIBC_PRINTF_TO_STREAM_PACKED)
      port.send([=](rpc::Buffer *buffer, uint32_t) { buffer->data[0] = handle; });
    port.send_n(format.c_str(), format.size() + 1);
    port.recv([&](rpc::Buffer *buffer, uint32_t) { *wanted = buffer->data[0]; });
    // Send what the server asked for, as LLVM does; the caller checks the size.
    std::string sent = args.bytes;
    sent.resize(*wanted, '\0');
    port.send_n(sent.data(), *wanted);
    for (;;) {
      const char *str = nullptr;
      port.recv([&](rpc::Buffer *buffer, uint32_t) {
        result = static_cast<uint32_t>(buffer->data[0]);
        str = reinterpret_cast<const char *>(buffer->data[1]);
      });
      if (!str)
        break;
      asked->push_back(str);
      // Only a pointer we sent as a `%s` argument is read; the caller fails on any other.
      bool ours = std::find(args.strings.begin(), args.strings.end(), str) != args.strings.end();
      port.send_n(ours ? str : "", ours ? strlen(str) + 1 : 1);
    }
  });
  return static_cast<int>(result);
}

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wformat-nonliteral"
#pragma GCC diagnostic ignored "-Wformat-security"

template <typename... A> std::string libc_format(const char *format, A... args) {
  int n = snprintf(nullptr, 0, format, for_libc(args)...);
  if (n < 0)
    die("the host's snprintf rejects %s", format);
  std::string out(static_cast<size_t>(n) + 1, '\0');
  snprintf(out.data(), out.size(), format, for_libc(args)...);
  out.resize(static_cast<size_t>(n));
  return out;
}

#pragma GCC diagnostic pop

// One printf through OP (stdout, stderr or the stream `handle`); the text must be what the host
// C library makes of the same format and values. Returns that text (the caller records it).
template <uint32_t OP, typename... A>
std::string check_printf(Run &run, uint64_t handle, const std::string &format, A... args) {
  constexpr bool packed = OP == LIBC_PRINTF_TO_STDOUT_PACKED ||
                          OP == LIBC_PRINTF_TO_STDERR_PACKED ||
                          OP == LIBC_PRINTF_TO_STREAM_PACKED;
  std::string text = libc_format(format.c_str(), args...);
  ArgBuffer buffer{packed, {}, {}};
  (buffer.add(args), ...);
  uint64_t wanted = 0;
  std::vector<const char *> asked;
  int result = printf_exchange<OP>(handle, format, buffer, &wanted, &asked);
  std::string what = "printf(\"" + show(format) + "\")";
  expect_u64((what + ": argument bytes asked for").c_str(), wanted, buffer.bytes.size());
  expect_u64((what + ": result").c_str(), static_cast<uint64_t>(result),
             static_cast<uint64_t>(text.size()));
  // Every string asked for is one of the `%s` arguments and each one is asked for; LLVM's server
  // asks once per `%s`, ours once per distinct pointer (the compiler merges equal literals).
  for (const char *p : asked)
    if (std::find(buffer.strings.begin(), buffer.strings.end(), p) == buffer.strings.end())
      die("%s: the server asked for %p, no %%s argument", what.c_str(),
          static_cast<const void *>(p));
  for (const char *p : buffer.strings)
    if (std::find(asked.begin(), asked.end(), p) == asked.end())
      die("%s: the server never asked for the %%s string at %p", what.c_str(),
          static_cast<const void *>(p));
  expect_u64((what + ": more string requests than %s arguments").c_str(),
             asked.size() > buffer.strings.size(), 0);
  run.checks += 3;
  return text;
}

// The printf cases: each runs on stdout (and the serial run on stdout_PACKED and stderr too).
struct Printer {
  Run &run;

  template <typename... A> void operator()(const char *format, A... args) {
    std::string tagged = format;
    if (!run.serial()) {
      // A thread's lines are told apart by their tag (which holds no '%'): one line per case,
      // and cases whose text would break the line are left to the serial run.
      if (!tagged.empty() && tagged.back() == '\n')
        tagged.pop_back();
      std::string text = libc_format(tagged.c_str(), args...);
      if (text.find('\n') != std::string::npos || text.find('\0') != std::string::npos)
        return;
      tagged = run.tag() + tagged + "\n";
    }
    run.out += check_printf<LIBC_PRINTF_TO_STDOUT>(run, 0, tagged, args...);
    if (run.serial()) {
      run.out += check_printf<LIBC_PRINTF_TO_STDOUT_PACKED>(run, 0, tagged, args...);
      run.err += check_printf<LIBC_PRINTF_TO_STDERR>(run, 0, tagged, args...);
    }
  }
};

void test_printf(Run &run) {
  Printer p{run};
  static const char long_string[] =
      "a string longer than one packet, so that the client's answer to the server's request "
      "for it is a stream of several packets: 0123456789abcdefghijklmnopqrstuvwxyz";
  std::string big(3000, 's');
  int sink = 0;

  p("plain text, no conversions\n");
  p("");
  p("%%\n");
  p("%d %i %u\n", 42, -42, 42u);
  p("%d %d\n", 2147483647, -2147483647 - 1);
  p("%u %x %X %o\n", 4294967295u, 0xdeadbeefu, 0xdeadbeefu, 0777u);
  p("%#x %#X %#o %#x %#o\n", 255u, 255u, 8u, 0u, 0u);
  p("[%5d] [%-5d] [%05d] [%+d] [% d] [%+05d]\n", 42, 42, 42, 42, 42, -42);
  p("[%.3d] [%.0d] [%5.3d] [%-8.4x]\n", 7, 0, 7, 0xabu);
  p("%hd %hhd %hu %hhu %hhx\n", 70000, 300, 70000u, 300u, 511u);
  p("%ld %li %lu %lx\n", -1234567890123L, 1234567890123L, 18446744073709551615UL,
    0x123456789abcdefUL);
  p("%lld %llu %llx %llX %llo\n", -9223372036854775807LL - 1, 18446744073709551615ULL,
    0xfedcba9876543210ULL, 0xfedcba9876543210ULL, 01234567012345670ULL);
  p("%jd %zu %zd %td %ju\n", (long)-5, (unsigned long)5000000000UL, (long)-7, (long)-9,
    (unsigned long)9);
  p("%c%c%c [%3c] [%-3c]\n", 'L', 'L', 'V', 'x', 'y');
  p("%c|\n", 0);
  p("%s\n", "a string");
  p("[%10s] [%-10s] [%.3s] [%10.3s] [%-10.3s]\n", "right", "left", "precision", "both",
    "both");
  p("%s\n", long_string);
  p("%s|%s|%s|%s\n", "one", "two", "three", "four");
  p("%s %d %s %d %s\n", "mixed", 1, "with", 2, "ints");
  p("[%s]\n", "");
  p("%s\n", big.c_str());
  p("[%s] [%10s] [%-8s] [%.3s] [%.8s]\n", (const char *)nullptr, (const char *)nullptr,
    (const char *)nullptr, (const char *)nullptr, (const char *)nullptr);
  p("[%s] [%s] [%s] [%.2s]\n", (const char *)nullptr, "set", (const char *)nullptr, "set");
  p("%p\n", (const void *)&sink);
  p("%p\n", (const void *)0x1234);
  p("[%p] [%12p]\n", (const void *)nullptr, (const void *)nullptr);
  p("[%20p] [%-20p]\n", (const void *)0xabcdef, (const void *)0xabcdef);
  p("%f %F %e %E %g %G\n", 3.14159, 3.14159, 3.14159, 3.14159, 3.14159, 3.14159);
  p("%.0f %.1f %.10f %.15e %.17g\n", 2.5, 0.05, 1.0 / 3, 1.0 / 3, 0.1);
  p("[%10.2f] [%-10.2f] [%+.3e] [%010.4f] [% .2f] [%#.0f] [%#g]\n", 3.14159, 3.14159, 12345.678,
    -3.5, 2.0, 3.0, 1.0);
  p("%g %g %g %g %g\n", 100000.0, 1000000.0, 1e-4, 1e-5, 0.0);
  p("%a %A %.3a %a\n", 1.0, -0.5, 3.14159, 0.0);
  p("%f %f %f %e %g\n", INFINITY, -INFINITY, NAN, INFINITY, -NAN);
  p("[%8f] [%-8f] [%08f] [%+f] [%F] [%E]\n", INFINITY, -INFINITY, NAN, INFINITY, NAN, -INFINITY);
  p("%e %g %.3e\n", 5e-324, 2.2250738585072014e-308, 1.7976931348623157e308);
  p("%f\n", 1.7976931348623157e308);
  p("%.40f\n", 1e-30);
  p("%f %e\n", -0.0, -0.0);
  p("%Lf %Le %Lg\n", LongDouble{2.5}, LongDouble{-1e100}, LongDouble{0.125});
  p("[%*d] [%-*d] [%.*d] [%*.*d]\n", 6, 42, 6, 42, 4, 42, 8, 3, 7);
  p("[%*d] [%.*f]\n", -6, 42, -1, 2.5);
  p("[%*s] [%.*s] [%*.*s]\n", 8, "star", 2, "star", 6, 1, "star");
  p("%d%n|\n", 12345, (const void *)&sink);
  p("%b %B %#b %#B %lb\n", 10u, 10u, 5u, 5u, 1UL << 40);
  p("[%5%|%-05%|%.3%|%l%]\n");
  p("[%*%|%-*.*%|%d]\n", 5, 6, 7, 8);
  p("%d %s %f %c %x %s %lld %p %g %u\n", -1, "all", 1.5, 'z', 48879u, "kinds", 1LL << 62,
    (const void *)0x10, 1e300, 7u);
  p("%d %d %d %d %d %d %d %d %d %d %d %d %d %d %d %d\n", 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12,
    13, 14, 15, 16);
  p("%s%s%s%s%s%s%s%s%s%s\n", "a", "b", "c", "d", "e", "f", "g", "h", "i", "j");
  p("unicode: %s \xc3\xa9\xe2\x82\xac\n", "\xf0\x9f\x98\x80");
  (void)sink;
}

#endif // LLVM_RPC_18

// ---- files in rpc-serve's sandbox ----------------------------------------------------------

uint64_t open_file(const std::string &path, const char *mode) {
  uint64_t handle = 0;
  with_port<LIBC_OPEN_FILE>([&](rpc::Client::Port &port) {
    port.send_n(path.c_str(), path.size() + 1);
    port.send_and_recv(
        [=](rpc::Buffer *buffer, uint32_t) { memcpy(buffer->data, mode, strlen(mode) + 1); },
        [&](rpc::Buffer *buffer, uint32_t) { handle = buffer->data[0]; });
  });
  return handle;
}

uint64_t close_file(uint64_t handle) { return word_call<LIBC_CLOSE_FILE>(handle); }

int64_t seek(uint64_t tagged, int64_t offset, int whence) {
  uint64_t reply = 0;
  with_port<LIBC_FSEEK>([&](rpc::Client::Port &port) {
    port.send_and_recv(
        [=](rpc::Buffer *buffer, uint32_t) {
          buffer->data[0] = tagged;
          buffer->data[1] = static_cast<uint64_t>(offset);
          buffer->data[2] = static_cast<uint64_t>(whence);
        },
        [&](rpc::Buffer *buffer, uint32_t) { reply = buffer->data[0]; });
  });
  return static_cast<int>(reply);
}

uint64_t ungetc_on(uint64_t tagged, int c) {
  uint64_t reply = 0;
  with_port<LIBC_UNGETC>([&](rpc::Client::Port &port) {
    port.send_and_recv(
        [=](rpc::Buffer *buffer, uint32_t) {
          buffer->data[0] = static_cast<uint64_t>(c);
          buffer->data[1] = tagged;
        },
        [&](rpc::Buffer *buffer, uint32_t) { reply = buffer->data[0]; });
  });
  return reply;
}

// LLVM's file::read_from_stream: send {max, tagged}, recv_n(data), recv(count).
std::string read_stream(uint64_t tagged, uint64_t max, uint64_t *count) {
  std::string data(max, '\0');
  void *dst = data.data();
  uint64_t got = ~0ull;
  with_port<LIBC_READ_FROM_STREAM>([&](rpc::Client::Port &port) {
    port.send([=](rpc::Buffer *buffer, uint32_t) {
      buffer->data[0] = max;
      buffer->data[1] = tagged;
    });
    port.recv_n(&dst, &got, [&](uint64_t n) -> void * {
      if (n > max)
        die("READ_FROM_STREAM: the server sends %llu bytes for a read of at most %llu",
            (unsigned long long)n, (unsigned long long)max);
      return data.data();
    });
    port.recv([&](rpc::Buffer *buffer, uint32_t) { *count = buffer->data[0]; });
  });
  expect_u64("READ_FROM_STREAM: the count sent after the data", *count, got);
  data.resize(got);
  return data;
}

// LLVM's fgets: send {count, tagged}, recv_n(the line incl. NUL, or nothing at the end).
// Returns false for nothing.
bool gets_stream(uint64_t tagged, int count, std::string *line) {
  std::string data(static_cast<size_t>(count), '\0');
  void *dst = data.data();
  uint64_t got = 0;
  with_port<LIBC_READ_FGETS>([&](rpc::Client::Port &port) {
    port.send([=](rpc::Buffer *buffer, uint32_t) {
      buffer->data[0] = static_cast<uint64_t>(count);
      buffer->data[1] = tagged;
    });
    port.recv_n(&dst, &got, [&](uint64_t n) -> void * {
      if (n > static_cast<uint64_t>(count))
        die("READ_FGETS: the server sends %llu bytes for fgets of %d", (unsigned long long)n,
            count);
      return data.data();
    });
  });
  if (got == 0)
    return false;
  if (data[got - 1] != '\0')
    die("READ_FGETS: the line sent is not NUL-terminated");
  *line = std::string(data.data(), got - 1);
  return true;
}

template <uint32_t OP> uint64_t path_call(const std::string &a, const std::string *b) {
  uint64_t reply = 0;
  with_port<OP>([&](rpc::Client::Port &port) {
    port.send_n(a.c_str(), a.size() + 1);
    if (b)
      port.send_n(b->c_str(), b->size() + 1);
    port.recv([&](rpc::Buffer *buffer, uint32_t) { reply = buffer->data[0]; });
  });
  return reply;
}

// A handle OPEN_FILE returned, as LLVM's file.h passes it: raw to WRITE_TO_STREAM, CLOSE_FILE
// and the _STREAM printfs; with its two low bits as the tag (0, a file) everywhere else.
void test_files(Run &run) {
  const std::string name = run.name("data.txt");
  const std::string lines = "first line\nsecond, longer line of the file\n" + run.tag() + "\n";
  const std::string payload = run.rng.bytes(run.serial() ? 20000 : 3000);

  uint64_t f = open_file(name, "w");
  if (f == 0)
    die("OPEN_FILE(%s, \"w\") in rpc-serve's sandbox: no handle", name.c_str());
  if (f & 3)
    die("OPEN_FILE: handle 0x%llx has a stream tag in its low bits", (unsigned long long)f);
  std::string content = lines;
  expect_u64("WRITE_TO_STREAM: bytes written",
             write_to<LIBC_WRITE_TO_STREAM>(f, lines.data(), lines.size()), lines.size());
  expect_u64("WRITE_TO_STREAM: bytes written",
             write_to<LIBC_WRITE_TO_STREAM>(f, payload.data(), payload.size()), payload.size());
  content += payload;
#ifndef LLVM_RPC_18
  content += check_printf<LIBC_PRINTF_TO_STREAM>(run, f, "|%s %d %.2f|", "to a file", 7, 0.25);
  content += check_printf<LIBC_PRINTF_TO_STREAM_PACKED>(run, f, "|%c%lld|", 'p', -1LL);
#endif
  expect_u64("FFLUSH of a file", word_call<LIBC_FFLUSH>(f), 0);
  expect_u64("FTELL after writing", word_call<LIBC_FTELL>(f), content.size());
  expect_u64("CLOSE_FILE", close_file(f), 0);
  run.checks += 6;

  f = open_file(name, "r");
  if (f == 0)
    die("OPEN_FILE(%s, \"r\"): no handle", name.c_str());
  std::string line;
  if (!gets_stream(f, 64, &line))
    die("READ_FGETS: nothing read");
  expect_bytes("READ_FGETS, first line", line.data(), line.size(), "first line\n", 11);
  // A count shorter than the line: count - 1 bytes and the NUL.
  if (!gets_stream(f, 8, &line))
    die("READ_FGETS: nothing read");
  expect_bytes("READ_FGETS of 8", line.data(), line.size(), "second,", 7);
  if (!gets_stream(f, 200, &line))
    die("READ_FGETS: nothing read");
  expect_bytes("READ_FGETS, the rest of the line", line.data(), line.size(),
               " longer line of the file\n", 25);
  run.checks += 3;

  const uint64_t at = lines.find('\n', lines.find('\n') + 1) + 1;
  // The rest of the file, in reads of uneven sizes.
  std::string rest;
  for (uint64_t n : {1ull, 55ull, 56ull, 57ull, 4000ull, 1ull << 20}) {
    uint64_t count = 0;
    rest += read_stream(f, n, &count);
  }
  expect_bytes("READ_FROM_STREAM: the file read back", rest.data(), rest.size(),
               content.data() + at, content.size() - at);
  uint64_t count = 1;
  std::string nothing = read_stream(f, 100, &count);
  expect_u64("READ_FROM_STREAM at the end: bytes", count, 0);
  if (word_call<LIBC_FEOF>(f) == 0)
    die("FEOF after reading past the end: 0");
  expect_u64("FERROR", word_call<LIBC_FERROR>(f), 0);
  word_call<LIBC_CLEARERR>(f);
  expect_u64("FEOF after CLEARERR", word_call<LIBC_FEOF>(f), 0);
  expect_u64("FSEEK to 5 from the start", static_cast<uint64_t>(seek(f, 5, SEEK_SET)), 0);
  expect_u64("FTELL after FSEEK", word_call<LIBC_FTELL>(f), 5);
  std::string five = read_stream(f, 5, &count);
  expect_bytes("READ_FROM_STREAM after FSEEK", five.data(), five.size(), content.data() + 5, 5);
  expect_u64("FSEEK back 3 from here", static_cast<uint64_t>(seek(f, -3, SEEK_CUR)), 0);
  expect_u64("FTELL after a relative FSEEK", word_call<LIBC_FTELL>(f), 7);
  expect_u64("FSEEK to the end", static_cast<uint64_t>(seek(f, 0, SEEK_END)), 0);
  expect_u64("FTELL at the end", word_call<LIBC_FTELL>(f), content.size());
  expect_u64("FSEEK to 0", static_cast<uint64_t>(seek(f, 0, SEEK_SET)), 0);
  expect_u64("UNGETC", ungetc_on(f, 'Z'), 'Z');
  std::string two = read_stream(f, 2, &count);
  expect_bytes("READ_FROM_STREAM after UNGETC", two.data(), two.size(),
               (std::string("Z") + content[0]).data(), 2);
  expect_u64("CLOSE_FILE", close_file(f), 0);
  run.checks += 14;

  // Rename it, keep it for the caller to compare; a second file is made and removed.
  const std::string kept = run.name("kept.txt");
#ifdef LLVM_RPC_18
  // No RENAME or REMOVE: the file stays under its name.
  run.files.emplace_back(name, content);
#else
  expect_u64("RENAME", path_call<LIBC_RENAME>(name, &kept), 0);
  expect_u64("OPEN_FILE of the old name after RENAME", open_file(name, "r"), 0);
  run.files.emplace_back(kept, content);
  const std::string gone = run.name("removed.txt");
  f = open_file(gone, "w+");
  if (f == 0)
    die("OPEN_FILE(%s, \"w+\"): no handle", gone.c_str());
  expect_u64("CLOSE_FILE", close_file(f), 0);
  expect_u64("REMOVE", path_call<LIBC_REMOVE>(gone, nullptr), 0);
  expect_u64("OPEN_FILE after REMOVE", open_file(gone, "r"), 0);
  run.checks += 5;
#endif
}

// rpc-serve's stdin (the caller fed it `stdin`): fgets, then reads of the rest (serial only).
void test_stdin(Run &run, const std::string &stdin_text) {
  const uint64_t in = 1;  // the tag of stdin
  std::string line;
  size_t nl = stdin_text.find('\n');
  if (!gets_stream(in, 100, &line))
    die("READ_FGETS of stdin: nothing read");
  expect_bytes("READ_FGETS of stdin", line.data(), line.size(), stdin_text.data(), nl + 1);
  std::string rest;
  for (;;) {
    uint64_t count = 0;
    std::string part = read_stream(in, 1000, &count);
    if (count == 0)
      break;
    rest += part;
  }
  expect_bytes("READ_FROM_STREAM of stdin", rest.data(), rest.size(), stdin_text.data() + nl + 1,
               stdin_text.size() - nl - 1);
  if (word_call<LIBC_FEOF>(in) == 0)
    die("FEOF of stdin after reading it all: 0");
  run.checks += 3;
}

// ---- MALLOC and FREE -----------------------------------------------------------------------

uint64_t malloc_call(uint64_t size) { return word_call<LIBC_MALLOC>(size); }

void free_call(uint64_t ptr) {
  with_port<LIBC_FREE>([&](rpc::Client::Port &port) {
    port.send([=](rpc::Buffer *buffer, uint32_t) { buffer->data[0] = ptr; });
  });
}

// FREE has no reply: the client closes its port at once and the server frees when it serves
// it, perhaps after a later request on another port. Returns once the server has served every
// port (each port's inbox equals its outbox again), so everything sent before was handled.
// Serial run only: another thread's open request would keep a port busy.
void wait_until_served() {
  const uint32_t n = client_ports;
  const uint32_t *inbox = reinterpret_cast<const uint32_t *>(
      static_cast<const char *>(client_base) + ClientProcess::inbox_offset(n));
  const uint32_t *outbox = reinterpret_cast<const uint32_t *>(
      static_cast<const char *>(client_base) + ClientProcess::outbox_offset(n));
  for (uint32_t i = 0; i < n; ++i)
    while (__atomic_load_n(&inbox[i], __ATOMIC_ACQUIRE) !=
           __atomic_load_n(&outbox[i], __ATOMIC_RELAXED))
      std::this_thread::yield();
}

// What rpc-serve promises (rpc_core::services::malloc_alignment): above 256 KiB, 2 MiB, as
// LLVM's GPU allocator needs for its slabs and large blocks; below, the size rounded up to a
// power of two, at least 16.
uint64_t malloc_alignment(uint64_t size) {
  if (size > (256u << 10))
    return 2 << 20;
  uint64_t align = 16;
  while (align < size)
    align <<= 1;
  return align;
}

void test_malloc(Run &run) {
  std::vector<uint64_t> live;
  std::vector<uint64_t> sizes = {1, 64, 4096, 1 << 20, (2 << 20) + 1};
  if (run.serial())
    sizes.push_back(600ull << 20);
  for (uint64_t size : sizes) {
    uint64_t p = malloc_call(size);
    if (p == 0)
      die("MALLOC(%llu): null", (unsigned long long)size);
    if (p % malloc_alignment(size))
      die("MALLOC(%llu) = 0x%llx: not aligned to 0x%llx", (unsigned long long)size,
          (unsigned long long)p, (unsigned long long)malloc_alignment(size));
    for (uint64_t q : live)
      if (q == p)
        die("MALLOC(%llu) = 0x%llx: handed out twice", (unsigned long long)size,
            (unsigned long long)p);
    live.push_back(p);
    ++run.checks;
  }
  for (uint64_t p : live)
    free_call(p);
  if (run.serial()) {
    wait_until_served();
    // Freed means reusable: twice 600 MiB more fits rpc-serve's 1 GiB only if the first went.
    for (int i = 0; i < 2; ++i) {
      uint64_t p = malloc_call(600ull << 20);
      if (p == 0)
        die("MALLOC of 600 MiB after FREE: null (was the memory freed?)");
      free_call(p);
      wait_until_served();
    }
    // More than rpc-serve ever hands out: a null pointer, not a failure of the exchange.
    expect_u64("MALLOC of 2 GiB (over rpc-serve's cap)", malloc_call(2ull << 30), 0);
    run.checks += 3;
  }
}

// ---- the whole suite -----------------------------------------------------------------------

void suite(Run &run, const std::string &stdin_text) {
  test_increment(run);
  test_interface(run, true);
  test_interface(run, false);
  test_stream(run);
  test_stdio(run);
#ifndef LLVM_RPC_18
  test_printf(run);
#endif
  test_files(run);
  if (run.serial())
    test_stdin(run, stdin_text);
  test_malloc(run);
}

void write_file(const std::string &path, const std::string &bytes) {
  FILE *f = fopen(path.c_str(), "wb");
  if (!f || fwrite(bytes.data(), 1, bytes.size(), f) != bytes.size() || fclose(f) != 0)
    die("writing %s: %s", path.c_str(), strerror(errno));
}

std::string read_file(const std::string &path) {
  FILE *f = fopen(path.c_str(), "rb");
  if (!f)
    die("reading %s: %s", path.c_str(), strerror(errno));
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, f)) > 0)
    out.append(buf, n);
  fclose(f);
  return out;
}

[[noreturn]] void usage(const char *why) {
  fprintf(stderr,
          "llvm-client: %s\nusage: llvm-client MAILBOX --bytes B --ports N --gen v0|v1|v2 "
          "--expect DIR --stdin FILE [--threads T]\n",
          why);
  exit(2);
}

} // namespace

int main(int argc, char **argv) {
  const char *gen = nullptr, *expect_dir = nullptr, *stdin_path = nullptr;
  const Mailbox mailbox =
      parse_args(argc, argv, usage, [&](const std::string &arg, auto value) {
        if (arg == "--gen")
          gen = value();
        else if (arg == "--expect")
          expect_dir = value();
        else if (arg == "--stdin")
          stdin_path = value();
        else
          return false;
        return true;
      });
  const uint64_t bytes = mailbox.bytes;
  const uint32_t ports = mailbox.ports;
  const int threads = mailbox.threads;
  if (!mailbox.path || !gen || !expect_dir || !stdin_path || !bytes || !ports || threads < 0)
    usage("missing arguments");
  const std::string dir = expect_dir;

  // The generation rpc-serve was started with must be the header's.
  if (std::string(gen) != "v" + std::to_string(GENERATION))
    die("rpc-serve serves %s but this rpc.h is the v%d client (%zu bytes)", gen, GENERATION,
        sizeof(rpc::Client));
  if (ports > rpc::MAX_PORT_COUNT)
    die("%u ports: LLVM's client holds at most %llu", ports,
        (unsigned long long)rpc::MAX_PORT_COUNT);
  // LLVM's loader: allocation_size(warp size, ports) bytes of host memory.
  const uint64_t llvm_bytes = llvm_allocation_size(1, ports);
  expect_u64("LLVM's allocation_size(lane size 1, ports) against rpc-serve's mailbox bytes",
             llvm_bytes, bytes);
  // LLVM's sizes at every lane size and some port counts, for the caller to compare with
  // rpc-core's Layout: "PORTS LANES BYTES" lines.
  std::string sizes;
  for (uint32_t lanes : {1u, 32u, 64u})
    for (uint32_t n : {1u, 3u, 9u, 64u, 65u, static_cast<uint32_t>(rpc::MAX_PORT_COUNT)})
      sizes += std::to_string(n) + " " + std::to_string(lanes) + " " +
               std::to_string(llvm_allocation_size(lanes, n)) + "\n";

  void *base = map_mailbox(mailbox);

  // What LLVM's loader does: `rpc::Client client(NumPorts, RPCBuffer)`, then its bytes go to
  // the device's `__llvm_rpc_client`. Here the object is built in that global's place.
  client = new (client_storage) rpc::Client(ports, base);
  client_base = base;
  client_ports = ports;
  write_file(dir + "/client-object.bin",
             std::string(reinterpret_cast<const char *>(client_storage), sizeof client_storage));
  write_file(dir + "/client-object.base", std::to_string(reinterpret_cast<uintptr_t>(base)));
  write_file(dir + "/allocation-sizes.txt", sizes);

  const std::string stdin_text = read_file(stdin_path);
  Run serial{-1, {}, {}, {}, 0, SplitMix{0x1111}};
  const auto t0 = std::chrono::steady_clock::now();
  suite(serial, stdin_text);
  const auto t1 = std::chrono::steady_clock::now();

  std::vector<Run> runs;
  for (int t = 0; t < threads; ++t)
    runs.push_back(Run{t, {}, {}, {}, 0, SplitMix{0x2222 + static_cast<uint64_t>(t)}});
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t)
    pool.emplace_back([&, t] { suite(runs[t], stdin_text); });
  for (std::thread &th : pool)
    th.join();
  const auto t2 = std::chrono::steady_clock::now();

  uint64_t checks = serial.checks;
  write_file(dir + "/stdout.serial", serial.out);
  write_file(dir + "/stderr.serial", serial.err);
  std::vector<std::pair<std::string, std::string>> files = serial.files;
  for (int t = 0; t < threads; ++t) {
    write_file(dir + "/stdout.t" + std::to_string(t), runs[t].out);
    write_file(dir + "/stderr.t" + std::to_string(t), runs[t].err);
    files.insert(files.end(), runs[t].files.begin(), runs[t].files.end());
    checks += runs[t].checks;
  }
  for (auto &[name, content] : files)
    write_file(dir + "/files/" + name, content);
  auto ms = [](auto d) {
    return static_cast<long long>(std::chrono::duration_cast<std::chrono::milliseconds>(d).count());
  };
  printf("llvm-client: v%d client (%zu bytes), %u ports, %llu-byte mailbox: %llu replies "
         "checked (serial run %lld ms, %d threads at once %lld ms)\n",
         GENERATION, sizeof(rpc::Client), ports, (unsigned long long)bytes,
         (unsigned long long)checks, ms(t1 - t0), threads, ms(t2 - t1));
  return 0;
}

// rpc_client.cu: a CUDA client of the GPU-to-host RPC protocol (docs/PROTOCOL.md in the shared
// docs, v1 "pre-doorbell" layout, L = 32), and the kernels of the GPU check
// (`cuda-gpu-check`, docs/gpu-check.md).
//
// Written for this workspace from PROTOCOL alone. The host (plugin-cuda through rpc-core's
// PluginRuntime) finds `__llvm_rpc_client`, allocates the mailbox in pinned host memory mapped
// for the device, and fills the object's port count and pointers before any kernel runs.
//
// Compile:   nvcc -ptx -arch=sm_90 -o rpc_client.ptx rpc_client.cu
// (without the toolkit: clang, see clang_shim.h.)
//
// Conventions of every kernel: one-dimensional blocks (blockDim.y == blockDim.z == 1), so lane
// = threadIdx.x % 32 and a block's last warp may be partial; every kernel parameter is a
// pointer or a 64-bit integer (the host packs them as little-endian u64 words); each thread
// writes its verdict to result[global thread id]: 1 = pass, 0 = never ran, anything else = a
// failure code (described at each kernel) that the host prints.
//
// Memory ordering (PROTOCOL section 3), on mapped host memory that the CPU reads and writes
// concurrently:
// - inbox/outbox words: `volatile` 32-bit loads and stores (PTX ld/st.volatile, which the PTX
//   memory model treats as relaxed, system scope); never a read-modify-write;
// - before handing a port over (flip): __syncwarp (every lane's buffer accesses are done, and
//   ordered before what follows for the other lanes), __threadfence_system (release, cumulative),
//   then the leader lane stores the flipped word;
// - after observing ownership: __threadfence_system (acquire) and __syncwarp, then the lanes
//   read their buffers.
// The lock bits are device-private (never seen by the host): atomicOr/atomicAnd on the client
// object with __threadfence() (device scope) after taking and before releasing.

#ifdef RPC_CLANG_SHIM
#include "clang_shim.h"
#endif

typedef unsigned char u8;
typedef unsigned int u32;
typedef unsigned long long u64;

// ---------------------------------------------------------------------------------------------
// The wire layout (PROTOCOL sections 1, 2 and 8).

#define LANES 32u               // NVPTX warp width: L
#define V1_MAX_PORT_COUNT 4096u // MAX_PORT_COUNT of the v1 generation

struct Header {  // 16 bytes: mask at 0, opcode at 8, 4 bytes padding
  u64 mask;
  u32 opcode;
  u32 pad;
};
struct Buffer {  // 64 bytes, 8 little-endian words
  u64 data[8];
};
// The v1 client object: 8 + 4 x 8 + 512 = 552 bytes. The host writes port_count and the four
// addresses (inbox = primary, the server's words; outbox = secondary, ours); lock stays ours.
struct ClientObject {
  u32 port_count;
  u32 pad;
  u32 *inbox;
  u32 *outbox;
  Header *header;
  Buffer *packet;
  u32 lock[V1_MAX_PORT_COUNT / 32];
};
static_assert(sizeof(Header) == 16, "Header is 16 bytes");
static_assert(sizeof(Buffer) == 64, "Buffer is 64 bytes");
static_assert(sizeof(void *) == 8, "64-bit device pointers");
static_assert(sizeof(ClientObject) == 552, "the v1 client object is 552 bytes");
static_assert(__builtin_offsetof(ClientObject, inbox) == 8, "inbox at 8");
static_assert(__builtin_offsetof(ClientObject, outbox) == 16, "outbox at 16");
static_assert(__builtin_offsetof(ClientObject, header) == 24, "header at 24");
static_assert(__builtin_offsetof(ClientObject, packet) == 32, "packet at 32");
static_assert(__builtin_offsetof(ClientObject, lock) == 40, "lock at 40");

// The symbol the host looks for; its size (552) says "v1". Zero until the host writes it.
extern "C" {
__device__ ClientObject __llvm_rpc_client;
}

// Opcodes (PROTOCOL section 6).
#define OP_EXIT 0x63000001u
#define OP_WRITE_TO_STDOUT 0x63000002u
#define OP_PRINTF_TO_STDOUT 0x63000015u
#define OP_TEST_INCREMENT 0x63008000u
#define OP_TEST_STREAM 0x63008002u

// ---------------------------------------------------------------------------------------------
// Warp helpers.

static __device__ inline u32 lane_id() { return threadIdx.x % LANES; }
static __device__ inline u64 global_thread_id() {
  return (u64)blockIdx.x * blockDim.x + threadIdx.x;
}
static __device__ inline u32 warp_in_block() { return threadIdx.x / LANES; }
static __device__ inline u64 global_warp_id() {
  u64 warps_per_block = (blockDim.x + LANES - 1) / LANES;
  return (u64)blockIdx.x * warps_per_block + warp_in_block();
}
// The lowest lane of a non-empty mask.
static __device__ inline u32 lowest_lane(u32 mask) {
  u32 lane = 0;
  while (((mask >> lane) & 1u) == 0u) ++lane;
  return lane;
}
static __device__ inline u64 shfl64(u32 mask, u64 value, u32 src) {
  u32 lo = __shfl_sync(mask, (u32)value, (int)src);
  u32 hi = __shfl_sync(mask, (u32)(value >> 32), (int)src);
  return ((u64)hi << 32) | lo;
}
// The largest `value` over the lanes of `mask` (every lane of the mask calls it).
static __device__ inline u64 warp_max(u32 mask, u64 value) {
  u64 best = 0;
  for (u32 lane = 0; lane < LANES; ++lane) {
    if ((mask >> lane) & 1u) {
      u64 v = shfl64(mask, value, lane);
      if (v > best) best = v;
    }
  }
  return best;
}
static __device__ inline u32 load_word(const u32 *address) {
  return *(const volatile u32 *)address;
}
static __device__ inline void store_word(u32 *address, u32 value) {
  *(volatile u32 *)address = value;
}

// ---------------------------------------------------------------------------------------------
// The client port (PROTOCOL section 4). Every lane of `mask` holds an identical copy and calls
// every operation together with the others.

struct Port {
  u32 index;     // the port i
  u32 out;       // our word, secondary[i] (the outbox)
  u32 mask;      // the active lanes, fixed for the exchange
  u32 leader;    // the lowest lane of mask: takes the lock, writes the header, flips
  bool owns;     // we own the buffers
  bool receive;  // the previous operation was a recv
};

static __device__ inline Buffer *lane_buffer(const Port &p) {
  return &__llvm_rpc_client.packet[(u64)p.index * LANES + lane_id()];
}

// Hands the buffers over: flips our word after every lane's accesses (release).
static __device__ inline void flip(Port &p) {
  __syncwarp(p.mask);
  __threadfence_system();
  p.out ^= 1u;
  if (lane_id() == p.leader) store_word(&__llvm_rpc_client.outbox[p.index], p.out);
  p.owns = false;
}

// Waits until the client owns the buffers (inbox == our word), then acquires.
static __device__ inline void wait_owned(Port &p) {
  for (;;) {
    u32 in = 0;
    if (lane_id() == p.leader) in = load_word(&__llvm_rpc_client.inbox[p.index]);
    in = __shfl_sync(p.mask, in, (int)p.leader);
    if ((in != 0u) == (p.out != 0u)) break;
    __nanosleep(32);
  }
  __threadfence_system();
  __syncwarp(p.mask);
  p.owns = true;
}

// Opens a port for `opcode`: scans from a port derived from the warp's global id, wrapping,
// until it takes a port's lock bit while the client owns the port.
static __device__ Port open_port(u32 opcode) {
  ClientObject &c = __llvm_rpc_client;
  Port p;
  p.mask = __activemask();
  p.leader = lowest_lane(p.mask);
  const u32 lane = lane_id();
  const u32 count = c.port_count;
  if (count == 0u) __trap();  // the host never wrote the client object
  u32 i = (u32)(global_warp_id() % count);
  for (;; i = (i + 1u == count) ? 0u : i + 1u) {
    const u32 bit = 1u << (i % 32u);
    u32 taken = 0;
    if (lane == p.leader) taken = (atomicOr(&c.lock[i / 32u], bit) & bit) == 0u;
    taken = __shfl_sync(p.mask, taken, (int)p.leader);
    if (!taken) continue;
    u32 owned = 0;
    if (lane == p.leader) {
      __threadfence();  // acquire the lock: the previous holder is done with the port
      owned = load_word(&c.inbox[i]) == load_word(&c.outbox[i]);
      if (!owned) {
        // The server still owns it (it has not finished the previous exchange): next port.
        __threadfence();
        atomicAnd(&c.lock[i / 32u], ~bit);
      }
    }
    owned = __shfl_sync(p.mask, owned, (int)p.leader);
    if (!owned) continue;
    p.index = i;
    // Only we write the outbox, and we hold the lock: the leader reads it once for the warp.
    u32 out = 0;
    if (lane == p.leader) out = load_word(&c.outbox[i]);
    p.out = __shfl_sync(p.mask, out, (int)p.leader);
    p.owns = true;
    p.receive = false;
    __threadfence_system();  // acquire: the server's last accesses to the port come first
    if (lane == p.leader) {
      // Published by the first send's release.
      c.header[i].mask = (u64)p.mask;
      c.header[i].opcode = opcode;
    }
    __syncwarp(p.mask);
    return p;
  }
}

// Releases the port's lock bit (the client never flips at close).
static __device__ void close_port(Port &p) {
  __syncwarp(p.mask);
  if (lane_id() == p.leader) {
    __threadfence();  // every access of ours to the port happens before the next holder's
    atomicAnd(&__llvm_rpc_client.lock[p.index / 32u], ~(1u << (p.index % 32u)));
  }
  __syncwarp(p.mask);
}

// rpc_send(fill): wait until owned, fill our lane's buffer, flip.
template <class Fill>
static __device__ void rpc_send(Port &p, Fill fill) {
  if (!p.owns) wait_owned(p);
  fill(lane_buffer(p));
  flip(p);
  p.receive = false;
}

// rpc_recv(use): after a recv, first hand the buffer back (empty acknowledgement); wait until
// owned; let our lane read its buffer.
template <class Use>
static __device__ void rpc_recv(Port &p, Use use) {
  if (p.receive) flip(p);
  if (!p.owns) wait_owned(p);
  use(lane_buffer(p));
  p.receive = true;
}

// Copies `len` (<= 8 * words) bytes into buffer words, 8 bytes per store (host memory over the
// bus: whole words, not bytes). Bytes past len in the last word are zero.
static __device__ inline void bytes_to_words(u64 *dst, const u8 *src, u64 len) {
  for (u64 w = 0; w * 8 < len; ++w) {
    u64 word = 0;
    for (u64 b = 0; b < 8 && w * 8 + b < len; ++b) word |= (u64)src[w * 8 + b] << (8 * b);
    dst[w] = word;
  }
}
static __device__ inline void words_to_bytes(u8 *dst, const u64 *src, u64 len) {
  for (u64 w = 0; w * 8 < len; ++w) {
    u64 word = src[w];
    for (u64 b = 0; b < 8 && w * 8 + b < len; ++b) dst[w * 8 + b] = (u8)(word >> (8 * b));
  }
}
static __device__ inline u64 min64(u64 a, u64 b) { return a < b ? a : b; }

// rpc_send_n (PROTOCOL section 5): buf[0] = n and bytes 0..min(n, 56) at byte 8, then 64-byte
// packets until the longest lane is done (lanes done early still take part).
static __device__ void rpc_send_n(Port &p, const void *src, u64 n) {
  const u8 *bytes = (const u8 *)src;
  rpc_send(p, [&](Buffer *b) {
    b->data[0] = n;
    bytes_to_words(&b->data[1], bytes, min64(n, 56));
  });
  const u64 longest = warp_max(p.mask, n);
  for (u64 offset = 56; offset < longest; offset += 64) {
    rpc_send(p, [&](Buffer *b) {
      if (offset < n) bytes_to_words(b->data, bytes + offset, min64(n - offset, 64));
    });
  }
}

// rpc_recv_n: the lane's length from the first packet, its bytes (at most `capacity` kept) into
// dst. Returns the length the sender announced.
static __device__ u64 rpc_recv_n(Port &p, void *dst, u64 capacity) {
  u8 *out = (u8 *)dst;
  u64 n = 0;
  rpc_recv(p, [&](Buffer *b) {
    n = b->data[0];
    words_to_bytes(out, &b->data[1], min64(min64(n, 56), capacity));
  });
  const u64 longest = warp_max(p.mask, n);
  for (u64 offset = 56; offset < longest; offset += 64) {
    rpc_recv(p, [&](Buffer *b) {
      if (offset < n && offset < capacity)
        words_to_bytes(out + offset, b->data, min64(min64(n - offset, 64), capacity - offset));
    });
  }
  return n;
}

// ---------------------------------------------------------------------------------------------
// Small device utilities for the kernels.

static __device__ u64 string_length(const char *s) {
  u64 n = 0;
  while (s[n] != '\0') ++n;
  return n;
}
// Appends `text` at out[*at] (no NUL).
static __device__ void append(char *out, u32 *at, const char *text) {
  for (u64 k = 0; text[k] != '\0'; ++k) out[(*at)++] = text[k];
}
// Appends `value` in decimal.
static __device__ void append_u64(char *out, u32 *at, u64 value) {
  char digits[20];
  u32 n = 0;
  do {
    digits[n++] = (char)('0' + value % 10);
    value /= 10;
  } while (value != 0);
  while (n > 0) out[(*at)++] = digits[--n];
}
static __device__ inline void set_failure(u32 *code, u32 value) {
  if (*code == 1u) *code = value;
}

// ---------------------------------------------------------------------------------------------
// Kernels.

// TEST_INCREMENT: `iterations` times, open a port, send x, expect x + 1, close. With
// skip_odd_lanes != 0 the odd lanes return at once (a partial mask). Failure: 2 = wrong reply.
extern "C" __global__ void rpc_test_increment(u32 *result, u64 iterations, u64 skip_odd_lanes) {
  const u64 me = global_thread_id();
  const u32 lane = lane_id();
  if (skip_odd_lanes != 0 && (lane & 1u) != 0) {
    result[me] = 1;
    return;
  }
  u32 code = 1;
  for (u64 it = 0; it < iterations; ++it) {
    const u64 x = (me << 32) + it * 7u + lane;
    Port p = open_port(OP_TEST_INCREMENT);
    rpc_send(p, [&](Buffer *b) { b->data[0] = x; });
    u64 y = 0;
    rpc_recv(p, [&](Buffer *b) { y = b->data[0]; });
    close_port(p);
    if (y != x + 1) set_failure(&code, 2);
  }
  result[me] = code;
}

// The lengths TEST_STREAM sends, round by round; odd rounds add lane * 13 so the lanes of a
// warp differ (and finish at different packets).
__device__ const u32 kStreamLengths[] = {0, 1, 7, 55, 56, 57, 63, 64, 119, 120, 121, 1000, 1025, 3000};
#define STREAM_ROUNDS (sizeof(kStreamLengths) / sizeof(kStreamLengths[0]) + 1)

// TEST_STREAM: round r sends a per-lane byte pattern with send_n, receives it back with recv_n
// and compares. scratch holds 2 * per_thread bytes per thread (what goes, what comes back);
// per_thread >= 4096. Failure: 0x100 * round + 2 (wrong length) or + 3 (wrong bytes),
// 4 (scratch too small).
extern "C" __global__ void rpc_test_stream(u32 *result, u8 *scratch, u64 per_thread) {
  const u64 me = global_thread_id();
  const u32 lane = lane_id();
  u8 *mine = scratch + me * per_thread * 2;
  u8 *back = mine + per_thread;
  u32 code = per_thread >= 4096 ? 1u : 4u;
  // Every lane runs every round, failed or not: the warp stays converged.
  for (u32 round = 0; round < STREAM_ROUNDS; ++round) {
    // The last round: lane * 127 bytes, 0 to 3937.
    u64 len = round + 1 < STREAM_ROUNDS ? kStreamLengths[round] + ((round & 1u) ? lane * 13u : 0u)
                                        : (u64)lane * 127u;
    for (u64 k = 0; k < len; ++k) mine[k] = (u8)(me * 31u + k * 7u + round);
    for (u64 k = 0; k < per_thread; ++k) back[k] = 0xEE;
    Port p = open_port(OP_TEST_STREAM);
    rpc_send_n(p, mine, len);
    u64 got = rpc_recv_n(p, back, per_thread);
    close_port(p);
    if (got != len) {
      set_failure(&code, 0x100u * round + 2u);
    } else {
      for (u64 k = 0; k < len; ++k)
        if (back[k] != mine[k]) {
          set_failure(&code, 0x100u * round + 3u);
          break;
        }
    }
  }
  result[me] = code;
}

// WRITE_TO_STDOUT: each lane sends "hello from block B warp W lane L\n" (built here), expects
// the count of bytes written. Failure: 2 = a different count.
extern "C" __global__ void rpc_write_stdout(u32 *result) {
  const u64 me = global_thread_id();
  char line[64];
  u32 at = 0;
  append(line, &at, "hello from block ");
  append_u64(line, &at, blockIdx.x);
  append(line, &at, " warp ");
  append_u64(line, &at, warp_in_block());
  append(line, &at, " lane ");
  append_u64(line, &at, lane_id());
  line[at++] = '\n';
  Port p = open_port(OP_WRITE_TO_STDOUT);
  rpc_send_n(p, line, at);
  u64 written = 0;
  rpc_recv(p, [&](Buffer *b) { written = b->data[0]; });
  close_port(p);
  result[me] = written == at ? 1u : 2u;
}

// printf's strings: lane % 4 picks one; lane 31 passes a null pointer ("(null)").
__device__ const char kPrintfFormat[] = "block %d warp %d lane %d: %s %5.2f\n";
__device__ const char kWords[4][96] = {
    "alpha",
    "beta gamma",
    "a string longer than one packet: 0123456789abcdefghijklmnopqrstuvwxyz0123456789",
    "",
};

// PRINTF_TO_STDOUT of kPrintfFormat with (block, warp, lane, word, lane * 1.25 + block); the
// printf result goes to written[me]. Failure: 2 = the host wanted an argument buffer of other
// than 32 bytes, 3 = it asked for a pointer we did not pass.
extern "C" __global__ void rpc_printf_stdout(u32 *result, u64 *written) {
  const u64 me = global_thread_id();
  const u32 lane = lane_id();
  u32 code = 1;
  const char *word = lane == 31u ? (const char *)0 : kWords[lane % 4u];
  // Non-packed argument buffer (PROTOCOL section 7): int at 0, int at 4, int at 8, the
  // pointer aligned to 16, the double at 24: 32 bytes.
  union {
    double d;
    u64 u;
  } value;
  value.d = lane * 1.25 + blockIdx.x;
  u64 args[4];
  args[0] = (u64)blockIdx.x | ((u64)warp_in_block() << 32);
  args[1] = (u64)lane;
  args[2] = (u64)word;
  args[3] = value.u;

  Port p = open_port(OP_PRINTF_TO_STDOUT);
  rpc_send_n(p, kPrintfFormat, sizeof(kPrintfFormat));
  u64 size = 0;
  rpc_recv(p, [&](Buffer *b) { size = b->data[0]; });
  if (size != sizeof(args)) set_failure(&code, 2);
  rpc_send_n(p, args, min64(size, sizeof(args)));
  u64 printed = 0;
  for (;;) {
    u64 asked = 0, first = 0;
    rpc_recv(p, [&](Buffer *b) {
      first = b->data[0];
      asked = b->data[1];
    });
    if (!__any_sync(p.mask, asked != 0)) {
      printed = first;
      break;
    }
    // Only our own string is ever sent back; anything else gets 0 bytes.
    const char *s = (const char *)asked;
    if (asked != 0 && s != word) {
      set_failure(&code, 3);
      s = (const char *)0;
    }
    rpc_send_n(p, s, s ? string_length(s) + 1 : 0);
  }
  close_port(p);
  written[me] = printed;
  result[me] = code;
}

// EXIT with `status`: handshake (send, recv), then send buf[0] = status. Under the host's
// ExitPolicy::Record the kernel simply returns afterwards.
extern "C" __global__ void rpc_exit(u32 *result, u64 status) {
  Port p = open_port(OP_EXIT);
  rpc_send(p, [&](Buffer *b) { b->data[0] = 0; });
  rpc_recv(p, [&](Buffer *) {});
  rpc_send(p, [&](Buffer *b) { b->data[0] = status & 0xffffffffu; });
  close_port(p);
  result[global_thread_id()] = 1;
}

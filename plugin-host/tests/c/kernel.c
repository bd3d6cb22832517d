/* A native host image (built with `cc -shared` by the tests): one kernel, `ask`, whose
 * every active lane sends `value + global lane` with the args' opcode and stores the reply's
 * first word at `out[global lane]` (the host device's addresses are this process's). */
#include <stdint.h>
#include <string.h>

#include "rpc_plugin.h"

/* The client object the runtime fills (by default a v2 one: 2096 bytes), as on a GPU. The
 * tests build variants: -DCLIENT_SIZE=552 (v1), -DCLIENT_SIZE=100 (no generation),
 * -DNO_CLIENT (no RPC). */
#ifndef CLIENT_SIZE
#define CLIENT_SIZE 2096
#endif
#ifndef NO_CLIENT
__attribute__((aligned(64))) unsigned char __llvm_rpc_client[CLIENT_SIZE];
#endif

/* A data symbol, which is no kernel. */
int not_a_kernel = 1;

struct ask_args {
  uint32_t opcode;
  uint32_t unused;
  uint64_t value;
  uint64_t *out;
};

void ask(const RpcHostWarp *warp, const void *args, size_t len) {
  struct ask_args a;
  if (len != sizeof a) return;
  memcpy(&a, args, sizeof a);
  uint64_t buffers[64][8];
  memset(buffers, 0, sizeof buffers);
  uint32_t first = (warp->block * warp->warps_per_block + warp->warp) * warp->lane_size;
  for (uint32_t lane = 0; lane < warp->lane_size; lane++) buffers[lane][0] = a.value + first + lane;
  int rc = warp->call(warp, a.opcode, buffers);
  for (uint32_t lane = 0; lane < warp->lane_size; lane++)
    if (warp->mask >> lane & 1) a.out[first + lane] = rc == RPC_OK ? buffers[lane][0] : UINT64_MAX;
}

/* A C runtime of the host plugin's library (built with `cc` by the tests):
 * host LIBRARY KERNEL_IMAGE, its stdout /dev/full. Loads the plugin with dlopen and its entry
 * symbol, registers a handler, loads and launches the native kernel `ask`, checks the replies;
 * launches `ask` again writing to the device's stdout, where every byte is lost; stops the
 * server twice (RPC_OK, then RPC_ALREADY_STOPPED), checks the lost bytes were counted, and
 * deinitialises. Prints "ok" to stderr on success. */
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rpc_plugin.h"

#define OPCODE 0x75000009u /* Opcode::user(9) */
#define WRITE_TO_STDOUT 0x63000002u
#define THREADS 40u

static const RpcPluginTable *table;

static void fail(const char *what, int code) {
  fprintf(stderr, "host.c: %s failed (%d): %s\n", what, code, table ? table->last_error() : "");
  exit(1);
}

/* Each active lane's reply: its value times three; ctx counts the requests. */
static void triple(void *ctx, RpcPacketRequest *request) {
  ++*(int *)ctx;
  for (uint32_t lane = 0; lane < request->lane_size; lane++)
    if (request->mask >> lane & 1) request->buffers[lane][0] *= 3;
}

int main(int argc, char **argv) {
  if (argc != 3) return 2;
  void *library = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (!library) { fprintf(stderr, "dlopen: %s\n", dlerror()); return 1; }
  RpcPluginEntryFn entry = (RpcPluginEntryFn)dlsym(library, "rpc_plugin_entry");
  if (!entry) { fprintf(stderr, "no entry symbol\n"); return 1; }
  table = entry();
  if (table->abi_version != RPC_PLUGIN_ABI_VERSION) fail("abi version", (int)table->abi_version);
  if (strcmp(table->name, "host") != 0) fail("name", 0);
  RpcPlugin *plugin = NULL;
  int rc = table->init(RPC_INIT_RECORD_EXIT, &plugin);
  if (rc != RPC_OK) fail("init", rc);
  if (table->device_count(plugin) < 1) fail("device_count", 0);
  char name[16];
  if (table->device_name(plugin, 0, name, sizeof name) == 0 || strcmp(name, "cpu0") != 0) fail("device_name", 0);
  int requests = 0;
  rc = table->register_handler(plugin, OPCODE, triple, &requests);
  if (rc != RPC_OK) fail("register_handler", rc);

  FILE *file = fopen(argv[2], "rb");
  if (!file) fail("fopen", 0);
  static unsigned char bytes[1 << 22];
  size_t len = fread(bytes, 1, sizeof bytes, file);
  fclose(file);
  uint64_t image = 0;
  rc = table->load_image(plugin, 0, bytes, len, &image);
  if (rc != RPC_OK) fail("load_image", rc);
  if (table->start_server(plugin) != RPC_ALREADY_RUNNING) fail("start_server (loading starts it)", 0);

  uint64_t out[THREADS];
  memset(out, 0, sizeof out);
  struct { uint32_t opcode, unused; uint64_t value; uint64_t *out; } args = {OPCODE, 0, 100, out};
  RpcGrid grid = {{1, 1, 1}, {THREADS, 1, 1}};
  rc = table->launch(plugin, image, "ask", (const uint8_t *)&args, sizeof args, &grid);
  if (rc != RPC_OK) fail("launch", rc);
  RpcKernelExit exit_status;
  rc = table->synchronize(plugin, 0, &exit_status);
  if (rc != RPC_OK) fail("synchronize", rc);
  if (exit_status.kind != RPC_EXIT_NONE) fail("exit kind", (int)exit_status.kind);
  for (uint32_t i = 0; i < THREADS; i++)
    if (out[i] != 3 * (100 + i)) { fprintf(stderr, "out[%u] = %llu\n", i, (unsigned long long)out[i]); return 1; }
  /* 40 threads of 32-lane warps: two warps, one request each. */
  if (requests != 2) fail("requests", requests);
  if (table->launch(plugin, image, "nope", NULL, 0, &grid) != RPC_ERR_DEVICE) fail("unknown kernel", 0);
  if (strstr(table->last_error(), "nope") == NULL) fail("unknown kernel's message", 0);
  RpcStats stats;
  RpcServedCount served[8];
  size_t kinds = table->stats(plugin, &stats, served, 8);
  if (kinds != 1 || served[0].opcode != OPCODE || served[0].count != 2 || stats.served != 2) fail("stats", (int)kinds);

  /* Each lane writes `1 + lane` bytes (one packet: at most 40 of the 56 it holds) to stdout. */
  args.opcode = WRITE_TO_STDOUT;
  args.value = 1;
  rc = table->launch(plugin, image, "ask", (const uint8_t *)&args, sizeof args, &grid);
  if (rc != RPC_OK) fail("launch (write)", rc);
  rc = table->synchronize(plugin, 0, &exit_status);
  if (rc != RPC_OK) fail("synchronize (write)", rc);
  for (uint32_t i = 0; i < THREADS; i++)
    if (out[i] == UINT64_MAX) fail("write call", (int)i);
  if ((rc = table->shutdown_server(plugin)) != RPC_OK) fail("shutdown_server", rc);
  if ((rc = table->shutdown_server(plugin)) != RPC_ALREADY_STOPPED) fail("shutdown_server again", rc);
  /* 1 + 2 + ... + 40 bytes, none of which /dev/full took. */
  table->stats(plugin, &stats, served, 8);
  if (stats.output_lost_bytes != THREADS * (THREADS + 1) / 2) fail("output_lost_bytes", (int)stats.output_lost_bytes);
  if ((rc = table->deinit(plugin)) != RPC_OK) fail("deinit", rc);
  fprintf(stderr, "ok\n");
  return 0;
}

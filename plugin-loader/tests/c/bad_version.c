/* A library whose entry returns a table of another ABI version (999). */
#include <stdint.h>
static const struct { uint32_t abi_version; } table = {999};
const void *rpc_plugin_entry(void) { return &table; }

// gettid_shim.c: `gettid` for the kit's binaries, which are linked against glibc 2.17 (so
// they run on old distributions) while Rust's std calls `gettid`, which glibc has only
// since 2.30. `cargo xtask gpu-check` compiles this with zig for that glibc and links it
// into rpc-run and cuda-gpu-check; a newer glibc's own `gettid` is the same system call.
#define _GNU_SOURCE
#include <sys/syscall.h>
#include <unistd.h>

pid_t gettid(void) { return (pid_t)syscall(SYS_gettid); }

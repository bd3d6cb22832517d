// A hello world for the GPU, linked against LLVM's GPU libc by `cargo xtask gpu-images`
// (ours; LLVM's own integration tests are built beside it). `rpc-run hello a b` prints its
// arguments, one printf per thread, and returns the number of arguments.
#include <stdio.h>

int main(int argc, char **argv) {
  printf("Hello from the GPU: %d arguments, argv[0] = %s\n", argc, argv[0]);
  return argc - 1;
}

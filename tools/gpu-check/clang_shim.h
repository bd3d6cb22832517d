// clang_shim.h: the few CUDA names rpc_client.cu uses, for compiling it with clang without the
// CUDA toolkit (`-nocudainc -nocudalib`), as the workspace does on machines with no nvcc:
//
//   clang++ -x cuda --cuda-device-only --cuda-gpu-arch=sm_70 -nocudainc -nocudalib -O2 \
//     -Xclang -target-feature -Xclang +ptx70 -DRPC_CLANG_SHIM -S -o rpc_client.clang.ptx rpc_client.cu
//
// nvcc never sees this file: it brings the real definitions (cuda_runtime.h). Each definition
// below maps a CUDA runtime name onto the clang builtin (or the one PTX instruction) that the
// CUDA headers use for it.
#pragma once

#define __device__ __attribute__((device))
#define __global__ __attribute__((global))

// threadIdx, blockIdx, blockDim, gridDim: clang's own header (in its resource directory).
#include <__clang_cuda_builtin_vars.h>

static __device__ inline unsigned int __activemask() {
  unsigned int mask;
  asm volatile("activemask.b32 %0;" : "=r"(mask));
  return mask;
}
static __device__ inline unsigned int __shfl_sync(unsigned int mask, unsigned int value, int lane) {
  return (unsigned int)__nvvm_shfl_sync_idx_i32(mask, (int)value, lane, 0x1f);
}
static __device__ inline int __any_sync(unsigned int mask, int predicate) {
  return __nvvm_vote_any_sync(mask, predicate != 0);
}
static __device__ inline void __syncwarp(unsigned int mask) { __nvvm_bar_warp_sync(mask); }
static __device__ inline void __threadfence_system() { __nvvm_membar_sys(); }
static __device__ inline void __threadfence() { __nvvm_membar_gl(); }
static __device__ inline unsigned int atomicOr(unsigned int *address, unsigned int value) {
  return (unsigned int)__nvvm_atom_or_gen_i((int *)address, (int)value);
}
static __device__ inline unsigned int atomicAnd(unsigned int *address, unsigned int value) {
  return (unsigned int)__nvvm_atom_and_gen_i((int *)address, (int)value);
}
static __device__ inline void __nanosleep(unsigned int ns) {
  asm volatile("nanosleep.u32 %0;" ::"r"(ns));
}
static __device__ inline void __trap() { __builtin_trap(); }

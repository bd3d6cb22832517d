#!/usr/bin/env bash
# run.sh: the GPU check, on a machine with an NVIDIA GPU, its driver and (ideally) nvcc; no Rust
# needed. `cargo xtask gpu-check` puts this script, the prebuilt `cuda-gpu-check` (x86-64 Linux)
# and rpc_client.cu in one directory (target/gpu-check/). Usage:
#
#   bash target/gpu-check/run.sh [cuda-gpu-check options, e.g. --quick]
#
# Compiles rpc_client.cu to PTX with nvcc (sm_90, else the local GPU's arch, else compute_90;
# without nvcc, the PTX clang built next to the binary, when there is one), then runs the check
# on it. Prints everything; exits non-zero on any failure.
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
cd "$here" || exit 1

echo "== gpu-check in $here"
command -v nvidia-smi > /dev/null && nvidia-smi -L

nvcc_bin="$(command -v nvcc || true)"
if [ -z "$nvcc_bin" ] && [ -x /usr/local/cuda/bin/nvcc ]; then nvcc_bin=/usr/local/cuda/bin/nvcc; fi

ptx=""
if [ -n "$nvcc_bin" ]; then
  "$nvcc_bin" --version | tail -2
  for arch in -arch=sm_90 -arch=native -arch=compute_90; do
    echo "== $nvcc_bin -ptx $arch -o rpc_client.ptx rpc_client.cu"
    if "$nvcc_bin" -ptx "$arch" -o rpc_client.ptx rpc_client.cu; then
      ptx=rpc_client.ptx
      break
    fi
  done
else
  echo "run.sh: no nvcc on PATH or in /usr/local/cuda/bin"
fi
if [ -z "$ptx" ] && [ -f rpc_client.clang.ptx ]; then
  echo "run.sh: using rpc_client.clang.ptx (built by clang where the binary was built)"
  ptx=rpc_client.clang.ptx
fi
if [ -z "$ptx" ]; then
  echo "gpu-check: FAIL: no PTX (nvcc failed or is missing, and no clang-built PTX)"
  exit 1
fi
grep -q '__llvm_rpc_client' "$ptx" || { echo "gpu-check: FAIL: $ptx lacks __llvm_rpc_client"; exit 1; }

echo "== ./cuda-gpu-check $ptx $*"
RUST_LOG="${RUST_LOG:-warn}" timeout 540 ./cuda-gpu-check "$ptx" "$@"
status=$?
[ "$status" = 124 ] && echo "gpu-check: FAIL: timed out after 540 s"
echo "run.sh: exit status $status"
exit "$status"

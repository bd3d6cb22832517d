#!/usr/bin/env bash
# run.sh: the GPU check kit, for one run on a machine with an NVIDIA GPU, its driver and
# (ideally) the CUDA toolkit; no Rust needed, any x86-64 Linux with glibc 2.17 or newer.
# `cargo xtask gpu-check` assembles the kit in one directory (target/gpu-check/): this script,
# bin/cuda-gpu-check and bin/rpc-run (built for glibc 2.17), rpc_client.cu, a clang-built
# rpc_client.clang.ptx, and images/: LLVM's GPU libc tests that `cargo xtask gpu-images`
# built (PTX). Usage:
#
#   bash run.sh [cuda-gpu-check options, e.g. --quick]
#
# Steps, each bounded in time and reported as one `PASS name: ...`, `FAIL name: ...` or
# `SKIP name: why` line:
#   1. nvcc builds the kit's client as a cubin (sm_90, else the local GPU's arch), then as PTX
#      (sm_90, else compute_90); without nvcc, the clang-built PTX is used;
#   2. rpc-run --inspect reads the client as built (PTX, cubin, fat binary) and each LLVM image;
#   3. cuda-gpu-check runs on the cubin, and on the PTX only if the cubin did not pass (the
#      driver may be older than the toolkit: then it cannot JIT the toolkit's PTX, but loads
#      its cubin); a load failure prints the driver's JIT error log;
#   4. rpc-run runs each LLVM image (as PTX, and as a cubin where ptxas is there) with the
#      loader arguments LLVM's CMake gives it, and must exit with the image's status;
#   5. rpc-run reads and runs the Rust programs of rust/ (rpc-device's examples, v2 client):
#      hello on 2 blocks of 64 threads with typed calls (status 3, every line checked by
#      count and the last thread's exactly), panic (the message on stderr, then abort).
# A step needing a GPU where there is none (exit status 69 from either binary) is a SKIP.
# No core is ever dumped (ulimit -c 0), and the whole run is bounded (GPU_CHECK_TIMEOUT
# seconds, default 540) with `timeout -k`. The last line is always
#   GPU-CHECK SUMMARY pass=N fail=M skip=K
# and the exit status is 0 exactly when M is 0.
set -u
here="$(cd "$(dirname "$0")" && pwd)"
self="$here/$(basename "$0")"
cd "$here" || exit 1
ulimit -c 0
results="$here/results.txt"
# The process group of every bounded step (each `timeout` leads its own), so that a run
# stopped at its bound leaves nothing behind.
groups="$here/groups.txt"
NO_DEVICE=69

if [ "${1:-}" != "--inner" ]; then
  bound="${GPU_CHECK_TIMEOUT:-540}"
  : > "$results"
  : > "$groups"
  timeout -k 10 "$bound" bash "$self" --inner "$@"
  status=$?
  if [ "$status" = 124 ] || [ "$status" = 137 ]; then
    while read -r group; do kill -KILL -- "-$group" 2> /dev/null; done < "$groups"
    echo "FAIL run: the whole run passed its bound of $bound s and was stopped" | tee -a "$results"
  elif [ "$status" != 0 ]; then
    echo "FAIL run: run.sh stopped with status $status" | tee -a "$results"
  fi
  pass=$(grep -c '^PASS' "$results")
  fail=$(grep -c '^FAIL' "$results")
  skip=$(grep -c '^SKIP' "$results")
  echo "GPU-CHECK SUMMARY pass=$pass fail=$fail skip=$skip"
  [ "$fail" = 0 ]
  exit $?
fi
shift

# record VERDICT NAME TEXT: one result line, printed and kept for the summary.
record() { echo "$1 $2: $3" | tee -a "$results"; }
# bounded SECONDS COMMAND...: COMMAND with a time limit (then SIGKILL 5 s later), its
# process group noted for the whole run's bound.
bounded() {
  local seconds=$1; shift
  timeout -k 5 "$seconds" "$@" &
  local pid=$!
  echo "$pid" >> "$groups"
  wait "$pid"
}
# last_lines FILE: the end of a log, indented, for a failure's explanation.
last_lines() { tail -n 15 "$1" | sed 's/^/    /'; }

echo "== gpu-check kit in $here"
uname -srm
(ldd --version 2>&1 | head -n 1) || true
if command -v nvidia-smi > /dev/null; then
  bounded 30 nvidia-smi --query-gpu=name,driver_version,compute_cap --format=csv,noheader 2>&1
else
  echo "no nvidia-smi on PATH"
fi

nvcc_bin="$(command -v nvcc || true)"
if [ -z "$nvcc_bin" ] && [ -x /usr/local/cuda/bin/nvcc ]; then nvcc_bin=/usr/local/cuda/bin/nvcc; fi
ptxas_bin="$(command -v ptxas || true)"
if [ -z "$ptxas_bin" ] && [ -n "$nvcc_bin" ] && [ -x "$(dirname "$nvcc_bin")/ptxas" ]; then
  ptxas_bin="$(dirname "$nvcc_bin")/ptxas"
fi
mkdir -p build

# --- 1. the kit's client, compiled ----------------------------------------------------------
cubin="" ptx="" fatbin=""
if [ -n "$nvcc_bin" ]; then
  bounded 30 "$nvcc_bin" --version | tail -n 2
  for arch in sm_90 native; do
    if bounded 300 "$nvcc_bin" -cubin -arch="$arch" -o build/rpc_client.cubin rpc_client.cu > build/nvcc-cubin.log 2>&1; then
      cubin=build/rpc_client.cubin
      record PASS nvcc-cubin "nvcc -cubin -arch=$arch"
      break
    fi
  done
  [ -z "$cubin" ] && { record FAIL nvcc-cubin "nvcc -cubin failed for sm_90 and native:"; last_lines build/nvcc-cubin.log; }
  for arch in -arch=sm_90 -arch=compute_90; do
    if bounded 300 "$nvcc_bin" -ptx "$arch" -o build/rpc_client.ptx rpc_client.cu > build/nvcc-ptx.log 2>&1; then
      ptx=build/rpc_client.ptx
      record PASS nvcc-ptx "nvcc -ptx $arch"
      break
    fi
  done
  [ -z "$ptx" ] && { record FAIL nvcc-ptx "nvcc -ptx failed for sm_90 and compute_90:"; last_lines build/nvcc-ptx.log; }
  if bounded 300 "$nvcc_bin" -fatbin -gencode arch=compute_90,code=sm_90 -gencode arch=compute_90,code=compute_90 \
      -o build/rpc_client.fatbin rpc_client.cu > build/nvcc-fatbin.log 2>&1; then
    fatbin=build/rpc_client.fatbin
  else
    echo "nvcc -fatbin failed (only the fat binary inspection is skipped):"; last_lines build/nvcc-fatbin.log
  fi
else
  record SKIP nvcc-cubin "no nvcc on PATH or in /usr/local/cuda/bin"
  record SKIP nvcc-ptx "no nvcc on PATH or in /usr/local/cuda/bin"
fi
if [ -z "$ptx" ] && [ -f rpc_client.clang.ptx ]; then
  echo "using rpc_client.clang.ptx (clang built it where the kit was assembled)"
  ptx=rpc_client.clang.ptx
fi

# --- 2. rpc-run --inspect of real NVIDIA binaries (no GPU needed) ----------------------------
# inspect NAME FILE FORMAT: rpc-run must read FILE as FORMAT with the v1 client and kernels.
inspect() {
  local name=$1 file=$2 format=$3 log="build/inspect-$1.log"
  if bounded 30 bin/rpc-run --inspect "$file" > "$log" 2>&1 \
      && grep -q "^image format=$format " "$log" \
      && grep -q '^client symbol=__llvm_rpc_client size=552 generation=v1' "$log" \
      && grep -q '^kernel name=' "$log"; then
    record PASS "inspect-$name" "$(head -n 1 "$log"), $(grep -c '^kernel name=' "$log") kernels"
    sed 's/^/    /' "$log"
  else
    record FAIL "inspect-$name" "rpc-run --inspect $file did not read it as $format:"
    last_lines "$log"
  fi
}
[ -n "$ptx" ] && inspect client-ptx "$ptx" ptx
[ -n "$cubin" ] && inspect client-cubin "$cubin" cubin
[ -n "$fatbin" ] && inspect client-fatbin "$fatbin" fatbin

# --- 3. the kit's own check ------------------------------------------------------------------
# check NAME IMAGE: cuda-gpu-check on IMAGE; returns 0 when it passed.
check() {
  local name=$1 image=$2 log="build/$1.log"
  echo "== bin/cuda-gpu-check $image ${GPU_CHECK_ARGS:-}"
  RUST_LOG="${RUST_LOG:-warn}" bounded 300 bin/cuda-gpu-check "$image" ${GPU_CHECK_ARGS:-} 2>&1 | tee "$log"
  local status=${PIPESTATUS[0]}
  case "$status" in
    0) record PASS "$name" "$(grep '^gpu-check:' "$log" | tail -n 1)"; return 0 ;;
    "$NO_DEVICE") record SKIP "$name" "no CUDA device ($(grep '^cuda:' "$log" | head -n 1))" ;;
    124|137) record FAIL "$name" "timed out after 300 s" ;;
    *) record FAIL "$name" "exit status $status: $(grep -E '^(gpu-check|FAIL)' "$log" | head -n 3 | tr '\n' ' ')" ;;
  esac
  return 1
}
GPU_CHECK_ARGS="$*"
cubin_passed=""
if [ -n "$cubin" ]; then
  check gpu-check-cubin "$cubin" && cubin_passed=yes
else
  record SKIP gpu-check-cubin "no cubin (nvcc missing or failed)"
fi
if [ -n "$cubin_passed" ]; then
  record SKIP gpu-check-ptx "the cubin passed (PTX is the fallback for a driver older than nvcc)"
elif [ -n "$ptx" ]; then
  if grep -q '__llvm_rpc_client' "$ptx"; then
    check gpu-check-ptx "$ptx"
  else
    record FAIL gpu-check-ptx "$ptx lacks __llvm_rpc_client"
  fi
else
  record FAIL gpu-check-ptx "no PTX (nvcc failed or is missing, and no clang-built PTX)"
fi

# --- 4. LLVM's GPU libc tests under rpc-run --------------------------------------------------
# run_image NAME IMAGE STATUS LOADER_ARGS PROGRAM_ARGS ENV: rpc-run must exit with STATUS.
run_image() {
  local name=$1 image=$2 expected=$3 loader=$4 program=$5 env=$6 log="build/run-$1.log"
  # shellcheck disable=SC2086 # the argument lists are split on purpose
  bounded 120 env $env RUST_LOG="${RUST_LOG:-warn}" bin/rpc-run --timeout 100 $loader "$image" -- $program > "$log" 2>&1
  local status=$?
  sed 's/^/    /' "$log" | tail -n 20
  if [ "$status" = "$expected" ]; then
    record PASS "run-$name" "rpc-run $loader $image -- $program: exit status $status"
  elif [ "$status" = "$NO_DEVICE" ]; then
    record SKIP "run-$name" "no GPU ($(grep -m 1 -i 'gpu\|device\|driver' "$log"))"
  else
    record FAIL "run-$name" "rpc-run $loader $image -- $program: exit status $status, expected $expected"
  fi
}
# NAME|EXIT STATUS|LOADER ARGS|PROGRAM ARGS|ENVIRONMENT, from LLVM's libc/test CMake files
# (our hello returns its argument count less one).
images_table() {
  cat << 'EOF'
rpc_test|0|--blocks-x 2 --blocks-y 2 --blocks-z 2 --threads-x 4 --threads-y 4 --threads-z 4||
rpc_interface_test|0|||
rpc_stream_test|0|--threads 32 --blocks 8||
rpc_lane_test|0|--threads 32||
args_test|0||1 2 3|FRANCE=Paris GERMANY=Berlin
init_fini_array_test|0|||
printf_test|0|--threads 32 --blocks 4||
hello|2||a b|
EOF
}
found=0
while IFS='|' read -r name expected loader program env; do
  image="images/$name"
  if [ ! -f "$image" ]; then
    record SKIP "image-$name" "not in the kit (run cargo xtask gpu-images before cargo xtask gpu-check)"
    continue
  fi
  found=$((found + 1))
  inspect "$name" "$image" ptx
  run_image "$name" "$image" "$expected" "$loader" "$program" "$env"
  if [ -n "$ptxas_bin" ]; then
    if bounded 300 "$ptxas_bin" -arch=sm_90 -o "build/$name.cubin" "$image" > "build/ptxas-$name.log" 2>&1; then
      inspect "$name-cubin" "build/$name.cubin" cubin
      run_image "$name-cubin" "build/$name.cubin" "$expected" "$loader" "$program" "$env"
    else
      record FAIL "ptxas-$name" "ptxas -arch=sm_90 failed:"; last_lines "build/ptxas-$name.log"
    fi
  fi
done < <(images_table)
echo "== $found LLVM images in the kit"

# --- 5. Rust programs (rpc-device) under rpc-run ---------------------------------------------
if [ -f rust/hello.ptx ]; then
  log=build/inspect-rust-hello.log
  if bounded 30 bin/rpc-run --inspect rust/hello.ptx > "$log" 2>&1 \
      && grep -q '^image format=ptx ' "$log" \
      && grep -q '^client symbol=__llvm_rpc_client size=2096 generation=v2' "$log"; then
    record PASS inspect-rust-hello "$(head -n 1 "$log")"
  else
    record FAIL inspect-rust-hello "rpc-run --inspect rust/hello.ptx:"; last_lines "$log"
  fi
  log=build/run-rust-hello.log
  bounded 120 bin/rpc-run --timeout 100 --dispatch-tests --threads 64 --blocks 2 rust/hello.ptx typed > "$log" 2> build/run-rust-hello.err
  status=$?
  hellos=$(grep -c '^hello from thread' "$log")
  typed=$(grep -c ' typed: add ' "$log")
  last=$(grep -c '^thread 63 typed: add 103, fill 4 \[630, 631, 632, 633\], negate -64, length 5$' "$log")
  if [ "$status" = 3 ] && [ "$hellos" = 128 ] && [ "$typed" = 128 ] && [ "$last" = 2 ]; then
    record PASS run-rust-hello "2 x 64 threads: 128 lines, 128 typed calls' results, status 3"
  elif [ "$status" = "$NO_DEVICE" ]; then
    record SKIP run-rust-hello "no GPU"
  else
    record FAIL run-rust-hello "status $status (want 3), $hellos hello lines and $typed typed (want 128 each), thread 63's line $last times (want 2):"
    last_lines "$log"; last_lines build/run-rust-hello.err
  fi
else
  record SKIP rust-images "not in the kit (run cargo xtask rust-kernels before cargo xtask gpu-check)"
fi
if [ -f rust/panic.ptx ]; then
  log=build/run-rust-panic.log
  bounded 120 bin/rpc-run --timeout 100 --threads 2 rust/panic.ptx > "$log" 2>&1
  status=$?
  if [ "$status" = "$NO_DEVICE" ]; then
    record SKIP run-rust-panic "no GPU"
  elif [ "$status" != 0 ] && grep -q 'thread 1 looked for a value and found None' "$log"; then
    record PASS run-rust-panic "the panic's message on stderr, status $status"
  else
    record FAIL run-rust-panic "status $status, no panic message:"; last_lines "$log"
  fi
fi
exit 0

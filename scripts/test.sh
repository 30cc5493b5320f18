#!/usr/bin/env bash
# The whole test suite: installs what is missing, builds, and runs every C++ and Python test, then
# the op and identity tests once more on the baseline (non-AVX2) kernels and once more through the
# device-generic path, then installs convnn and builds the example consumer against it
# (scripts/install-check.sh), then the op, nn, data and train tests under AddressSanitizer and
# UndefinedBehaviorSanitizer, then the fuzz targets of the file readers.
set -euo pipefail
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# Each phase's wall time, so that a slow CI run says where its minutes went (README, "CI time").
phase_started=$SECONDS
phase_done() {
  printf '[test] %s: %d s (%d s since the start)\n' "$1" $((SECONDS - phase_started)) "$SECONDS" >&2
  phase_started=$SECONDS
}
bash "$repo_root/scripts/setup.sh"
phase_done "set-up and build"
# CI's machines have nvcc and the venv's triton: there the C++ build must embed the Triton kernels
# (src/ops/cuda/triton/), so that the CUDA build and its launchers cannot rot unseen. Elsewhere a
# build without them is legal (CONVNN_TRITON_AOT=AUTO), and its tests say so.
if [ -n "${CI:-}" ] && ! grep -q '^CONVNN_BUILD_TRITON_AOT:INTERNAL=ON' "$repo_root/build/CMakeCache.txt"; then
  echo "test.sh: CI=${CI} but build/ has no embedded Triton kernels (see 'convnn: ahead-of-time Triton" \
       "kernels' in CMake's output: it needs nvcc, a CUDA torch and triton in the venv)" >&2
  exit 1
fi
cd "$repo_root/build"
# CTest runs one test process per core, so each process keeps to one intra-op thread; tests that
# check multi-threaded kernels set their own thread count. (Cores are counted first: GNU nproc
# honours OMP_NUM_THREADS.)
cores="$(nproc)"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
ctest --output-on-failure --parallel "$cores" "$@"
phase_done "ctest"
# The kernels are compiled for AVX2 and for baseline x86-64, and the CPU picks one at run time
# (src/ops/cpu/isa.h): without this pass the baseline build, which CPUs without AVX2 run, could
# rot unseen. It runs the suites of tests/ops and tests/verify.
op_and_identity_suites="$("$repo_root/.venv/bin/python" "$repo_root/scripts/test_suites.py" \
  bin/convnn_tests ops verify | paste -sd'|' -)"
CONVNN_CPU_ISA=baseline ctest --output-on-failure --parallel "$cores" -R "^($op_and_identity_suites)\$"
phase_done "op and identity tests on the baseline ISA"
# The same suites through the device-generic path (src/ops/generic/, what CUDA, MPS, ... run): with
# CONVNN_CPU_KERNELS=generic the fused CPU kernels are not registered and CPU calls take it, so the
# whole op matrix (reference and fused comparisons, gradchecks, deterministic backward) proves the
# code that accelerators run.
CONVNN_CPU_KERNELS=generic ctest --output-on-failure --parallel "$cores" -R "^($op_and_identity_suites)\$"
phase_done "op and identity tests on the device-generic path"
# The Triton kernels (python/convnn/_triton), compiled for sm_80 and sm_90 without a GPU: a compile
# error, a register spill or a shared-memory overflow fails the run (their logic runs under Triton's
# interpreter in ctest's python.triton_interpreter).
"$repo_root/.venv/bin/python" "$repo_root/scripts/triton_compile_check.py" > /dev/null
phase_done "Triton compile check"
# The static cost report of the selection kernels and the attention backward's two kernels (issue
# 38 §5): SASS instructions per part of each loop for sm_90, trip counts on random data, launches
# per backward, and the estimated H100 bound at the paper's Table 1 shape and at 12 x 4096
# (BENCHMARKS.md). It fails if the kernels' loops can no longer be
# told apart in the compiled code; its figures are estimates, not tests.
"$repo_root/.venv/bin/python" "$repo_root/scripts/triton_cost_report.py" \
  --json "$repo_root/build/triton-cost-report.json" > "$repo_root/build/triton-cost-report.md"
phase_done "Triton static cost report"
# convnn as a dependency: install build/ into a scratch prefix, build examples/cpp against it with
# find_package(convnn), run it on a checkpoint of the installed `convnn train`, and check that
# convnn::ops alone pulls no image codec, zlib or nlohmann-json.
bash "$repo_root/scripts/install-check.sh"
phase_done "install check"
# The op, nn, data and train tests under AddressSanitizer and UndefinedBehaviorSanitizer, in their own
# build folder (about a minute with ccache warm; cold, build included: 175 s on a 2-core Zen 5, 219 s
# on a Zen 4, 915 s on a Zen 3 before unity builds).
bash "$repo_root/scripts/sanitize.sh"
phase_done "sanitizers (build and tests)"
# The readers of users' files (checkpoints, JSON configs) under libFuzzer with ASan and UBSan, 60 s
# per target from a seed corpus written by convnn's own writers (tests/fuzz): any finding fails.
bash "$repo_root/scripts/fuzz.sh" 60
phase_done "fuzzing (build and run)"

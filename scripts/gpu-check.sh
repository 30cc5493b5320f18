#!/usr/bin/env bash
# The GPU check (issue 25 §6): every CUDA test, compute-sanitizer on the op tests, and the
# benchmarks on a CUDA device, written to a report folder.
#
#   scripts/gpu-check.sh                      bundle, then run, on a GPU machine with the set-up
#   scripts/gpu-check.sh bundle [DIR]         build and stage what the run needs (no GPU needed)
#   scripts/gpu-check.sh run [DIR] [REPORT]   run from a bundle on a GPU machine, write REPORT
#
# Two halves because a lent GPU machine (the `device` tool) has torch, Triton, pytest, timm and
# the CUDA tools but not the Debian packages the build needs (GoogleTest, CLI11, libjpeg), and no
# network: the bundle is built here (x86-64 binaries against the same torch 2.11.0 wheel, whose
# libraries the run takes from the GPU machine's own torch) and travels with the working tree.
# DIR defaults to build-gpu-bundle, REPORT to gpu-report. Each step has its own time limit, so
# the whole check fits one 10-minute call on a 16-core machine with an H100; a step that fails
# or runs out of time is marked in REPORT/summary.txt and the next one still runs.
set -uo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo_root" || exit 1

bundle() {
  local dir="${1:-build-gpu-bundle}"
  set -e
  bash scripts/setup.sh
  local site
  site="$(.venv/bin/python -c 'import convnn, os; print(os.path.dirname(convnn.__file__))')"
  rm -rf "$dir"
  mkdir -p "$dir/bin" "$dir/lib" "$dir/site" "$dir/syslib"
  cp -a build/bin/convnn build/bin/convnn_tests "$dir/bin/"
  cp -a build/lib/*.so* "$dir/lib/"
  cp -a "$site" "$dir/site/convnn"
  find "$dir/site" -name __pycache__ -prune -exec rm -rf {} +
  # The system libraries the binaries need beyond glibc, libstdc++ and torch's own (libjpeg and
  # libpng from Debian are not on the GPU machine's image).
  ldd build/bin/convnn_tests | awk '/=> \/(usr\/)?lib\/x86_64-linux-gnu\/lib(jpeg|png16)\./ {print $3}' |
    while read -r lib; do cp -L "$lib" "$dir/syslib/"; done
  { echo "commit $(git rev-parse HEAD)$(git diff --quiet HEAD || echo ' + uncommitted changes')"
    echo "built $(date -u +%FT%TZ) on $(lscpu | sed -n 's/^Model name: *//p')"
    echo "torch $(.venv/bin/python -c 'import torch; print(torch.__version__)')"; } > "$dir/manifest.txt"
  set +e
  echo "gpu-check: bundle in $dir ($(du -sh "$dir" | cut -f1))"
}

# Runs one step with a time limit, its output into REPORT/<log>, and records the outcome.
step() {
  local name="$1" limit="$2" log="$3"
  shift 3
  local start=$SECONDS
  { echo "=== $name: $*"; } >> "$report/$log"
  timeout --kill-after=10 "$limit" "$@" >> "$report/$log" 2>&1
  local rc=$?
  local outcome="passed"
  [ $rc -eq 0 ] || outcome="FAILED (exit $rc)"
  [ $rc -eq 124 ] && outcome="TIMED OUT after $limit s"
  printf '%-44s %-26s %4d s\n' "$name" "$outcome" $((SECONDS - start)) | tee -a "$report/summary.txt"
}

run() {
  local dir="${1:-build-gpu-bundle}"
  report="${2:-gpu-report}"
  local python="${PYTHON:-python3}"
  dir="$(cd "$dir" && pwd)" || { echo "gpu-check: no bundle at $1 (run: scripts/gpu-check.sh bundle)"; exit 2; }
  mkdir -p "$report"
  report="$(cd "$report" && pwd)"
  : > "$report/summary.txt"
  if ! "$python" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)'; then
    echo "gpu-check: $python's torch sees no CUDA device" | tee "$report/summary.txt"
    exit 2
  fi
  # torch's libraries and the CUDA libraries of its wheel, from the GPU machine's own torch.
  local libs
  libs="$("$python" - <<'EOF'
import glob, os, torch
site = os.path.dirname(os.path.dirname(torch.__file__))
print(":".join([os.path.join(os.path.dirname(torch.__file__), "lib")] +
               sorted(d for d in glob.glob(os.path.join(site, "nvidia", "**", "lib"), recursive=True))))
EOF
)"
  export LD_LIBRARY_PATH="$dir/syslib:$libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  export PYTHONPATH="$dir/site${PYTHONPATH:+:$PYTHONPATH}"
  export PYTHONUNBUFFERED=1
  local bin="$dir/bin"
  { cat "$dir/manifest.txt"; nvidia-smi; "$python" -c 'import torch, triton, sys
print("python", sys.version.split()[0], "torch", torch.__version__, "triton", triton.__version__)
print("device", torch.cuda.get_device_name(), torch.cuda.get_device_properties(0))'; nproc; } > "$report/env.txt" 2>&1

  # The C++ tests that take a CUDA device when one is present, and the generic path's suites.
  step "C++ CUDA tests (GenericCuda, RegisteredDeviceSweep, Device, ...)" 150 cpp-tests.log \
    "$bin/convnn_tests" --gtest_brief=1 \
    --gtest_filter='*Cuda*:*CUDA*:*Registered*:Device.*:Checkpoint.*:Generic*:Bench*:TritonAot*'
  step "Python: Triton kernels on the GPU, CUDA API" 240 python-tests.log \
    "$python" -m pytest -q -p no:cacheprovider -o addopts= python/tests/test_triton_kernels.py \
    python/tests/test_bounded_select.py python/tests/test_cuda.py python/tests/test_opcheck.py
  # The benchmarks: the generic path (what CUDA tensors run) against the reference, module and op
  # level, at the paper's configuration, then the sweep; the Triton kernels from Python.
  local b
  for b in "module float32" "module bfloat16" "op float32" "op bfloat16"; do
    set -- $b
    step "bench --device cuda --level $1 --dtype $2" 60 bench.log \
      "$bin/convnn" bench --device cuda --impl generic --level "$1" --dtype "$2"
  done
  step "bench --device cuda --sweep (K = 9)" 150 bench.log \
    "$bin/convnn" bench --device cuda --impl generic --sweep --sweep-n 197 1024 4096 16384 --sweep-k 9 \
    --memory-cap 40 --sweep-batch 1 --sweep-iters 5 --sweep-warmup 2
  step "Triton kernels and op-level paths" 200 bench.log \
    "$python" scripts/gpu_bench.py --json "$report/gpu-bench.json"
  step "the running top-K's two designs (one warp per 32 rows, or 8 warps per 16)" 90 bench.log \
    "$python" scripts/gpu_bench.py --designs --json "$report/gpu-designs.json"
  step "knn_select on tensor cores: rows rerun, same indices, time vs IEEE and SDPA" 150 bench.log \
    "$python" scripts/gpu_bench.py --tensor-cores --json "$report/gpu-tensor-cores.json"
  step "knn_attention forward+backward, select on tensor cores, vs SDPA (causal or not)" 150 bench.log \
    "$python" scripts/gpu_bench.py --training --json "$report/gpu-training.json"
  # compute-sanitizer: out-of-bounds and misaligned accesses, shared-memory races.
  step "memcheck: C++ GenericCuda (2 cases)" 120 sanitizer.log \
    compute-sanitizer --tool memcheck --error-exitcode 3 "$bin/convnn_tests" --gtest_brief=1 \
    --gtest_filter='AttentionSweep/GenericCuda.*/0:AttentionSweep/GenericCuda.*/5'
  step "memcheck: C++ embedded Triton kernels" 90 sanitizer.log \
    compute-sanitizer --tool memcheck --error-exitcode 3 "$bin/convnn_tests" --gtest_brief=1 \
    --gtest_filter='TritonAotCuda.*'
  step "memcheck: Triton kernels" 150 sanitizer.log \
    compute-sanitizer --tool memcheck --error-exitcode 3 "$python" -m pytest -q -p no:cacheprovider \
    -o addopts= python/tests/test_triton_kernels.py -k "forward or repeatable or guard or select_picks"
  step "racecheck: Triton kernels" 150 sanitizer.log \
    compute-sanitizer --tool racecheck --error-exitcode 3 "$python" -m pytest -q -p no:cacheprovider \
    -o addopts= python/tests/test_triton_kernels.py -k "forward or repeatable or select_picks"
  echo "gpu-check: report in $report"
  grep -E "FAILED|TIMED OUT" "$report/summary.txt" > /dev/null && return 1
  return 0
}

case "${1:-all}" in
  bundle) shift; bundle "$@" ;;
  run) shift; run "$@" ;;
  all) bundle build-gpu-bundle && run build-gpu-bundle gpu-report ;;
  *) echo "usage: scripts/gpu-check.sh [bundle [DIR] | run [DIR] [REPORT]]" >&2; exit 2 ;;
esac

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
# DIR defaults to build-gpu-bundle, REPORT to gpu-report. The steps run in the order of what they
# prove (correctness, then issue 41's and issue 38's targets, then the rest), each under its own
# time limit and all under one budget (CONVNN_GPU_CHECK_BUDGET seconds, default 510: one 10-minute
# call of the device tool, the machine's start and the copies included): a step is cut to what is
# left of the budget, and one that cannot start with 20 s left is marked SKIPPED, so a lent
# machine's few minutes go first to what matters most. A step that fails or runs out of time is
# marked in REPORT/summary.txt and the next one still runs.
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
  # The device tool carries 64 MiB: the embedded kernels' library (cubins of every specialisation
  # for sm_80 and sm_90, about 380 MB) travels compressed (xz: about 27 MB); run() unpacks it.
  local library
  for library in "$dir"/lib/libconvnn_triton_kernels.so.*.*.*; do
    [ -L "$library" ] || xz -T0 -6 "$library"
  done
  { echo "commit $(git rev-parse HEAD)$(git diff --quiet HEAD || echo ' + uncommitted changes')"
    echo "built $(date -u +%FT%TZ) on $(lscpu | sed -n 's/^Model name: *//p')"
    echo "torch $(.venv/bin/python -c 'import torch; print(torch.__version__)')"; } > "$dir/manifest.txt"
  set +e
  echo "gpu-check: bundle in $dir ($(du -sh "$dir" | cut -f1))"
}

# Runs one step with a time limit (cut to what is left of the budget), its output into
# REPORT/<log>, and records the outcome.
step() {
  local name="$1" limit="$2" log="$3"
  shift 3
  local left=$((budget_end - SECONDS))
  if [ "$left" -lt 20 ]; then
    printf '%-44s %-26s %4d s\n' "$name" "SKIPPED (budget spent)" 0 | tee -a "$report/summary.txt"
    return
  fi
  [ "$limit" -gt "$left" ] && limit=$left
  local start=$SECONDS
  { echo "=== $name: $*"; } >> "$report/$log"
  # SIGINT first: pytest then prints its failures so far, and a bench has printed its rows so far.
  timeout -s INT --kill-after=15 "$limit" "$@" >> "$report/$log" 2>&1
  local rc=$?
  local outcome="passed"
  [ $rc -eq 0 ] || outcome="FAILED (exit $rc)"
  [ $rc -eq 124 ] && outcome="TIMED OUT after $limit s"
  printf '%-44s %-26s %4d s\n' "$name" "$outcome" $((SECONDS - start)) | tee -a "$report/summary.txt"
}

run() {
  local dir="${1:-build-gpu-bundle}"
  report="${2:-gpu-report}"
  budget_end=$((SECONDS + ${CONVNN_GPU_CHECK_BUDGET:-510}))
  local python="${PYTHON:-python3}"
  dir="$(cd "$dir" && pwd)" || { echo "gpu-check: no bundle at $1 (run: scripts/gpu-check.sh bundle)"; exit 2; }
  mkdir -p "$report"
  report="$(cd "$report" && pwd)"
  : > "$report/summary.txt"
  if ! "$python" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)'; then
    echo "gpu-check: $python's torch sees no CUDA device" | tee "$report/summary.txt"
    exit 2
  fi
  local packed
  for packed in "$dir"/lib/*.xz; do
    [ -e "$packed" ] || continue
    "$python" -c 'import lzma, shutil, sys
with lzma.open(sys.argv[1]) as source, open(sys.argv[1][:-3], "wb") as target:
    shutil.copyfileobj(source, target, 1 << 24)' "$packed" && rm "$packed" || exit 2
  done
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

  # First, at once: the correctness checks (the C++ tests that take a CUDA device; the Triton
  # kernels against the generic path by pytest over the cores, each test's outcome on its own line)
  # and the compiling of the timed steps' Triton kernels (over the cores too: Triton compiles a
  # kernel on its first launch, seconds each, single-threaded; measured on an H200 machine, the
  # timed steps spent most of their minutes compiling). The GPU is only shared, nothing is timed.
  local jobs=$(( $(nproc) / 3 > 1 ? $(nproc) / 3 : 1 ))
  step "C++ CUDA tests (GenericCuda, RegisteredDeviceSweep, Device, ...)" 150 cpp-tests.log \
    "$bin/convnn_tests" --gtest_brief=1 \
    --gtest_filter='*Cuda*:*CUDA*:*Registered*:Device.*:Checkpoint.*:Generic*:Bench*:TritonAot*' &
  local background=($!)
  local workers=()
  "$python" -c 'import xdist' 2>/dev/null && workers=(-n "$jobs")
  step "Python: Triton kernels on the GPU, CUDA API" 200 python-tests.log \
    "$python" -m pytest -v -rfE --tb=short -p no:cacheprovider -o addopts= "${workers[@]}" \
    python/tests/test_cuda.py python/tests/test_bounded_select.py python/tests/test_triton_kernels.py \
    python/tests/test_opcheck.py &
  background+=($!)
  step "compile: the training step's kernels" 200 compile.log \
    "$python" scripts/gpu_bench.py --training --compile-only --compile-jobs "$jobs" &
  background+=($!)
  step "compile: the tensor-core select's kernels" 200 compile.log \
    "$python" scripts/gpu_bench.py --tensor-cores --compile-only --compile-jobs "$jobs" &
  background+=($!)
  wait "${background[@]}"
  # Timed, one at a time: issue 41's targets (long sequences, the select on tensor cores, and a
  # profile of that select), then issue 38's (the Triton kernels, the op level and the paper's
  # Table 1 module against SDPA, eager and CUDA-graph).
  step "knn_attention forward+backward, select on tensor cores, vs SDPA (causal or not)" 150 bench.log \
    "$python" scripts/gpu_bench.py --training --json "$report/gpu-training.json"
  step "knn_select on tensor cores: rows rerun, same indices, time vs IEEE and SDPA" 150 bench.log \
    "$python" scripts/gpu_bench.py --tensor-cores --json "$report/gpu-tensor-cores.json"
  step "ncu: the tensor-core select (bfloat16, 12 x 4096)" 90 profile.log \
    ncu --clock-control none -k regex:_bounded_select_kernel --launch-skip 1 --launch-count 1 \
    --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
    --section SchedulerStats --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \
    --section SourceCounters "$python" scripts/gpu_bench.py --profile-select
  step "Triton kernels and op-level paths" 200 bench.log \
    "$python" scripts/gpu_bench.py --json "$report/gpu-bench.json"
  step "the running top-K's two designs (one warp per 32 rows, or 8 warps per 16)" 90 bench.log \
    "$python" scripts/gpu_bench.py --designs --json "$report/gpu-designs.json"
  # Issue 40's sequence cases (causal with key padding and grouped heads; a decoding step against
  # a cache) against SDPA, through the C++ command and its embedded kernels.
  step "bench --device cuda --sequence" 90 bench.log "$bin/convnn" bench --device cuda --sequence
  # The generic path (what CUDA tensors run without the Triton kernels) against the reference.
  local b
  for b in "module float32" "module bfloat16" "op float32" "op bfloat16"; do
    set -- $b
    step "bench --device cuda --level $1 --dtype $2" 60 bench.log \
      "$bin/convnn" bench --device cuda --impl generic --level "$1" --dtype "$2"
  done
  step "bench --device cuda --sweep (K = 9)" 150 bench.log \
    "$bin/convnn" bench --device cuda --impl generic --sweep --sweep-n 197 1024 4096 16384 --sweep-k 9 \
    --memory-cap 40 --sweep-batch 1 --sweep-iters 5 --sweep-warmup 2
  # compute-sanitizer: out-of-bounds and misaligned accesses, shared-memory races.
  step "memcheck: C++ embedded Triton kernels" 90 sanitizer.log \
    compute-sanitizer --tool memcheck --error-exitcode 3 "$bin/convnn_tests" --gtest_brief=1 \
    --gtest_filter='TritonAotCuda.*'
  step "memcheck: Triton kernels" 150 sanitizer.log \
    compute-sanitizer --tool memcheck --error-exitcode 3 "$python" -m pytest -q -p no:cacheprovider \
    -o addopts= python/tests/test_triton_kernels.py -k "forward or repeatable or guard or select_picks"
  step "racecheck: Triton kernels" 150 sanitizer.log \
    compute-sanitizer --tool racecheck --error-exitcode 3 "$python" -m pytest -q -p no:cacheprovider \
    -o addopts= python/tests/test_triton_kernels.py -k "forward or repeatable or select_picks"
  step "memcheck: C++ GenericCuda (2 cases)" 120 sanitizer.log \
    compute-sanitizer --tool memcheck --error-exitcode 3 "$bin/convnn_tests" --gtest_brief=1 \
    --gtest_filter='AttentionSweep/GenericCuda.*/0:AttentionSweep/GenericCuda.*/5'
  echo "gpu-check: report in $report"
  grep -E "FAILED|TIMED OUT|SKIPPED" "$report/summary.txt" > /dev/null && return 1  # incomplete counts
  return 0
}

case "${1:-all}" in
  bundle) shift; bundle "$@" ;;
  run) shift; run "$@" ;;
  all) bundle build-gpu-bundle && run build-gpu-bundle gpu-report ;;
  *) echo "usage: scripts/gpu-check.sh [bundle [DIR] | run [DIR] [REPORT]]" >&2; exit 2 ;;
esac

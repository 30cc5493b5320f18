#!/usr/bin/env bash
# The op, nn, data and train (checkpoint) tests under AddressSanitizer + UndefinedBehaviorSanitizer
# (CMake option CONVNN_SANITIZE), built in build-sanitize/. Any sanitizer report or failed test
# makes it exit non-zero. Assumes scripts/setup.sh has run (the venv is at .venv).
#
#   scripts/sanitize.sh                 configure, build, run
#   scripts/sanitize.sh ARGS...         ARGS go to the test binary after the selection
#                                       (a --gtest_filter there replaces the selection)
#   CONVNN_SANITIZE_SHARDS=N            test processes in parallel (default: the core count)
set -euo pipefail
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build_dir="$repo_root/build-sanitize"
supp_dir="$repo_root/tests/sanitizers"
log() { printf '[sanitize] %s\n' "$*" >&2; }

# Same ccache keys as scripts/setup.sh, so that every clone shares the sanitizer objects too.
export CCACHE_BASEDIR="$repo_root"
export CCACHE_SLOPPINESS="pch_defines,time_macros,include_file_mtime,include_file_ctime"
# The objects carry line tables (-g1, below), for which ccache hashes the build folder's absolute
# path unless told not to; without this a clone elsewhere (CI's) would miss on every file.
export CCACHE_NOHASHDIR=1

# Runtime options. They apply at build time too (gtest_discover_tests runs the test binary).
#  ASan: halt_on_error=1 and exitcode=1 are the defaults, spelled out. detect_leaks=1: LeakSanitizer
#  at exit (LibTorch's registries stay reachable from globals, so it reports none of theirs).
#  detect_stack_use_after_return=1 catches references to dead locals (+10 % run time);
#  check_initialization_order/strict_init_order: static-init-order bugs; detect_odr_violation=2;
#  strict_string_checks=1. alloc_dealloc_mismatch stays on (default): LibTorch's allocator pairs
#  posix_memalign with free, so it reports nothing. protect_shadow_gap stays on: only the CUDA
#  driver needs it off, and these tests never initialise CUDA.
#  No LD_PRELOAD: the binaries are linked with -fsanitize, so libasan is loaded first. OpenMP:
#  torch's bundled libgomp (uninstrumented) is the one loaded; its threads start through the
#  intercepted pthread_create, so ASan knows their stacks.
#  UBSan: built with -fno-sanitize-recover=all, so the first report ends the process (status 1);
#  print_stacktrace=1 for the frames.
export ASAN_OPTIONS="halt_on_error=1:exitcode=1:detect_leaks=1:detect_stack_use_after_return=1:check_initialization_order=1:strict_init_order=1:detect_odr_violation=2:strict_string_checks=1:suppressions=$supp_dir/asan.supp"
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1:report_error_type=1:suppressions=$supp_dir/ubsan.supp"
export LSAN_OPTIONS="suppressions=$supp_dir/lsan.supp:print_suppressions=0"

torch_cmake="$("$repo_root/.venv/bin/python" -c 'import torch;print(torch.utils.cmake_prefix_path)')"
# Clang at -O0 (issue 44): this build is compiled cold on every CI run, and Clang -O0 compiles it
# in well under half of GCC -O1's time (a typical file here: 31 s against 76 s), while its tests
# take about two minutes on 2 cores (Zen 3), a small part of what the compiler saves. A second compiler also holds the code to standard C++17 where GCC is
# lenient (a lambda capturing a structured binding). -g1: line tables only, which keep the objects
# and ccache small. NDEBUG as in the Release build, so that LibTorch's headers compile the same
# inline code as in the library it was built with.
compiler=clang++-14
# A build folder configured with another compiler (before this choice) is configured afresh.
if [ -f "$build_dir/CMakeCache.txt" ] && ! grep -q "^CMAKE_CXX_COMPILER:[A-Z]*=.*$compiler\$" "$build_dir/CMakeCache.txt"; then
  rm -rf "$build_dir/CMakeCache.txt" "$build_dir/CMakeFiles"
fi
log "configuring $build_dir"
cmake -S "$repo_root" -B "$build_dir" -G Ninja \
  -DCMAKE_CXX_COMPILER="$compiler" \
  -DCONVNN_SANITIZE=ON \
  -DCONVNN_TEST_DIRS="ops;nn;data;config;train" \
  -DCONVNN_WITH_CUDA=OFF \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O0 -g1 -DNDEBUG" \
  -DCMAKE_PREFIX_PATH="$torch_cmake" \
  -DPython3_EXECUTABLE="$repo_root/.venv/bin/python" >/dev/null
log "building (configured in ${SECONDS}s)"
cmake --build "$build_dir" --parallel "$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)" --target convnn_tests

# The tests to run: every suite with tests under tests/ops, nn, data, config or train, read from the
# binary's own listing (so new suites are picked up without editing this script).
tests_bin="$build_dir/bin/convnn_tests"
filter="$("$repo_root/.venv/bin/python" "$repo_root/scripts/test_suites.py" "$tests_bin" ops nn data config train |
  sed 's/$/.*/' | paste -sd: -)"
[ -n "$filter" ] || { log "no op/nn/data tests found in $tests_bin"; exit 1; }

# Two shards in parallel (one per core; CI machines have 2), one intra-op thread each as in
# scripts/test.sh; the tests that check multi-threaded kernels set their own thread count.
# (nproc itself honours OMP_NUM_THREADS, hence the count without it.)
shards="${CONVNN_SANITIZE_SHARDS:-$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)}"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
log "running the op, nn, data, config and train tests in $shards shards (built in ${SECONDS}s since the start)"
started=$SECONDS
pids=()
rm -f "$build_dir"/sanitize-shard*.log
for ((i = 0; i < shards; i++)); do
  GTEST_TOTAL_SHARDS=$shards GTEST_SHARD_INDEX=$i \
    "$tests_bin" --gtest_filter="$filter" "$@" >"$build_dir/sanitize-shard$i.log" 2>&1 &
  pids+=($!)
done
status=0
for ((i = 0; i < shards; i++)); do
  rc=0
  wait "${pids[$i]}" || rc=$?
  if ((rc == 0)); then
    log "shard $i: $(grep -E '^\[  PASSED  \]' "$build_dir/sanitize-shard$i.log" || echo passed)"
  else
    status=1
    log "shard $i FAILED (exit $rc); its log, $build_dir/sanitize-shard$i.log:"
    cat "$build_dir/sanitize-shard$i.log" >&2
  fi
done
# A report always ends its process with a non-zero status; this also catches one printed by a
# forked child (the fuzz tests' cases) whose parent test would not otherwise notice.
if grep -lE '^(==[0-9]+==ERROR|SUMMARY: (Address|UndefinedBehavior|Leak)Sanitizer)|runtime error:' \
     "$build_dir"/sanitize-shard*.log >/dev/null; then
  status=1
  log "a sanitizer report was printed (see above / the shard logs)"
fi
log "tests took $((SECONDS - started))s; $((SECONDS))s in all"
exit $status

#!/usr/bin/env bash
# The fuzz targets of tests/fuzz (libFuzzer, under AddressSanitizer and UndefinedBehaviorSanitizer):
# builds them with clang in build-fuzz/ against the main build's libraries, writes the seed corpus
# with convnn's own writers, and runs each target for a bounded time. Any finding (crash, sanitizer
# report, an exception other than convnn's refusal, an allocation over the RSS limit, one input
# running past the timeout) fails the run; the input that caused it is kept in build-fuzz/findings/.
# Assumes scripts/setup.sh has built build/.
#
#   scripts/fuzz.sh            60 s per target
#   scripts/fuzz.sh SECONDS    SECONDS per target
set -euo pipefail
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
seconds="${1:-60}"
build_dir="$repo_root/build-fuzz"
log() { printf '[fuzz] %s\n' "$*" >&2; }

export CCACHE_BASEDIR="$repo_root"
export CCACHE_SLOPPINESS="pch_defines,time_macros,include_file_mtime,include_file_ctime"
export CCACHE_NOHASHDIR=1
torch_cmake="$("$repo_root/.venv/bin/python" -c 'import torch;print(torch.utils.cmake_prefix_path)')"
if [ ! -f "$build_dir/build.ninja" ]; then
  log "configuring $build_dir"
  cmake -S "$repo_root/tests/fuzz" -B "$build_dir" -G Ninja \
    -DCMAKE_CXX_COMPILER=clang++-14 \
    -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-DNDEBUG" \
    -DCMAKE_PREFIX_PATH="$torch_cmake" \
    -DCONVNN_BUILD_DIR="$repo_root/build" >/dev/null
fi
log "building"
cmake --build "$build_dir" --parallel "$(env -u OMP_NUM_THREADS nproc)"

corpus="$build_dir/corpus"
rm -rf "$corpus" "$build_dir/findings"
mkdir -p "$build_dir/findings"
"$build_dir/fuzz_seeds" "$corpus/seeds-checkpoint" "$corpus/seeds-config"

# Leaks are checked after every input; the suppressions (one for LibTorch's zip reader, with its
# reason) are the sanitizer pass's.
supp_dir="$repo_root/tests/sanitizers"
export ASAN_OPTIONS="halt_on_error=1:detect_leaks=1:allocator_may_return_null=0:suppressions=$supp_dir/asan.supp"
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1:suppressions=$supp_dir/ubsan.supp"
export LSAN_OPTIONS="suppressions=$supp_dir/lsan.supp:print_suppressions=0"
export OMP_NUM_THREADS=1
# One target per core at once (libFuzzer runs on one thread): on 2 cores the two targets take the
# time of one.
fuzz_one() {
  local target="$1"
  # New inputs go to a scratch folder; the seeds stay as written.
  mkdir -p "$corpus/$target"
  # -rss_limit_mb: a file must not make a reader allocate much (a checkpoint of a 4x3 layer needs
  # a few MB); -timeout: nor take long; -max_len: the seeds are a few KB.
  "$build_dir/fuzz_$target" "$corpus/$target" "$corpus/seeds-$target" \
    -max_total_time="$seconds" -rss_limit_mb=2048 -malloc_limit_mb=1024 -timeout=20 -max_len=65536 \
    -artifact_prefix="$build_dir/findings/$target-" -print_final_stats=1 2>"$build_dir/fuzz_$target.log"
}
targets=(checkpoint config)
pids=()
for target in "${targets[@]}"; do
  log "fuzz_$target for ${seconds}s"
  fuzz_one "$target" &
  pids+=($!)
done
status=0
for i in "${!targets[@]}"; do
  target="${targets[$i]}"
  if ! wait "${pids[$i]}"; then
    tail -n 60 "$build_dir/fuzz_$target.log" >&2
    log "fuzz_$target found a defect: input in $build_dir/findings/"
    status=1
  else
    grep -E '^stat::(number_of_executed_units|new_units_added)' "$build_dir/fuzz_$target.log" >&2 || true
  fi
done
exit "$status"

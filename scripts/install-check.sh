#!/usr/bin/env bash
# convnn as another project sees it: installs the built build/ tree into a scratch prefix, builds
# the example consumer (examples/cpp) against that prefix alone with find_package(convnn), trains a
# tiny model with the installed `convnn` command and has the example load its checkpoint, and checks
# that a consumer of convnn::ops alone pulls none of the image codecs, zlib or nlohmann-json, that
# the package refuses another LibTorch, and that the README's consumer lines are the example's.
# Assumes scripts/setup.sh has built build/. Any failed step stops the run with a message.
#
# The prefix and the example's build folder are wiped at every run, but kept at a fixed path under
# build/ (not mktemp): ccache keys on the include paths, so a fixed path lets the example's two
# files come from the cache.
set -euo pipefail
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
work="$repo_root/build/install-check"
prefix="$work/prefix"
example="$work/example"
log() { printf '[install-check] %s\n' "$*" >&2; }
fail() { printf '[install-check] FAILED: %s\n' "$*" >&2; exit 1; }
# Runs a step quietly; on failure shows its output and stops.
quietly() {
  local what="$1"; shift
  if ! "$@" >"$work/step.log" 2>&1; then
    cat "$work/step.log" >&2
    fail "$what"
  fi
}

[ -x "$repo_root/build/bin/convnn" ] || fail "build/bin/convnn is missing: build first (scripts/setup.sh)"
export CCACHE_BASEDIR="$repo_root"
export CCACHE_SLOPPINESS="pch_defines,time_macros,include_file_mtime,include_file_ctime"
export CCACHE_NOHASHDIR=1
torch_cmake="$("$repo_root/.venv/bin/python" -c 'import torch;print(torch.utils.cmake_prefix_path)')"
launcher=()
if command -v ccache >/dev/null; then launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache); fi

rm -rf "$work"
mkdir -p "$work"
log "installing build/ into $prefix"
quietly "cmake --install build --prefix $prefix" cmake --install "$repo_root/build" --prefix "$prefix"
[ -f "$prefix/lib/cmake/convnn/convnnConfig.cmake" ] || fail "the install has no lib/cmake/convnn/convnnConfig.cmake"

# The README's consumer lines (its C++ section's cmake block) are the example's, so they cannot rot.
strip_cmake() { sed 's/#.*//; s/[[:space:]]*$//' | grep -v '^$' || true; }
mapfile -t readme_lines < <(awk '/^## Using it from C\+\+/ { section = 1 } section && /^```cmake/ { block = 1; next }
                                 block && /^```/ { exit } block { print }' "$repo_root/README.md" | strip_cmake)
[ "${#readme_lines[@]}" -ge 3 ] || fail "README.md's C++ section has no cmake block of the consumer's lines"
example_lines="$(strip_cmake <"$repo_root/examples/cpp/CMakeLists.txt")"
for line in "${readme_lines[@]}"; do
  grep -qxF "$line" <<<"$example_lines" || fail "README.md's consumer line '$line' is not in examples/cpp/CMakeLists.txt"
done

log "configuring examples/cpp against the prefix"
quietly "configuring examples/cpp with find_package(convnn)" \
  cmake -S "$repo_root/examples/cpp" -B "$example" -G Ninja -DCMAKE_BUILD_TYPE=Release "${launcher[@]}" \
    -DCMAKE_EXPORT_COMPILE_COMMANDS=ON -DCMAKE_PREFIX_PATH="$prefix;$torch_cmake" \
    --graphviz="$work/graph/deps.dot"
log "building the example"
quietly "building examples/cpp" cmake --build "$example" --parallel 2
# Nothing of the source tree may be on the example's include path: only the prefix's headers.
if grep -F -e "$repo_root/include" -e "$repo_root/src" "$example/compile_commands.json" >/dev/null; then
  fail "the example compiles with convnn's source tree on its include path ($example/compile_commands.json)"
fi

# <convnn/convnn.h> brings every installed header but bench/ and verify/ (libraries of their own,
# convnn::bench and convnn::verify): the headers the example's main.cpp was compiled with, as the
# compiler reported them to ninja (paths relative to the example's build folder when ccache rewrote
# them), as convnn/....
included="$(ninja -C "$example" -t deps CMakeFiles/convnn_example.dir/main.cpp.o |
            sed -n 's|^ *.*prefix/include/\(convnn/.*\)$|\1|p')"
while IFS= read -r header; do
  case "$header" in convnn/bench/* | convnn/verify/*) continue ;; esac
  grep -qxF "$header" <<<"$included" || fail "<convnn/convnn.h> does not bring $header"
done < <(cd "$prefix/include" && find convnn -name '*.h' | sort)

log "training a tiny branching ResNet-18 for 1 epoch with the installed convnn command"
mkdir -p "$work/run"
# The data set and the flags of the Python tests' tiny run (python/tests/cli_support.py).
mapfile -t tiny_run < <(cd "$work/run" && "$repo_root/.venv/bin/python" -c "
import pathlib, sys
sys.path.insert(0, sys.argv[1])
from cli_support import make_data_set, tiny_run_args
print('\n'.join(map(str, tiny_run_args(make_data_set(pathlib.Path('.'))))))" "$repo_root/python/tests")
[ "${#tiny_run[@]}" -gt 0 ] || fail "could not write the tiny data set"
(cd "$work/run" && quietly "the installed convnn train" \
  "$prefix/bin/convnn" train "${tiny_run[@]}" --layer branching --output runs --experiment tiny)
checkpoint="$work/run/runs/tiny/checkpoint-latest.pt"
[ -f "$checkpoint" ] || fail "convnn train wrote no $checkpoint"

log "running the example"
"$example/convnn_example" "$checkpoint" || fail "convnn_example (layers, registry, checkpoint)"
"$example/convnn_ops_example" || fail "convnn_ops_example (the ops alone)"

# The ops-only consumer's dependencies: ldd for the shared libraries it loads (every one found,
# convnn's from the prefix), CMake's own dependency graph for nlohmann-json, which is header-only.
# Each check is also run on the full example, which must show what the ops-only one must not:
# otherwise the check could not see them at all.
log "checking that convnn::ops alone pulls no image codec, zlib or nlohmann-json"
codecs='lib(jpeg|png[0-9]*|z)\.so'
ops_ldd="$(ldd "$example/convnn_ops_example")"
if grep -q "not found" <<<"$ops_ldd"; then fail "convnn_ops_example: a library is not found: $ops_ldd"; fi
grep -q "libconvnn_ops\.so.* => $prefix/lib/" <<<"$ops_ldd" || \
  fail "convnn_ops_example does not load libconvnn_ops from $prefix/lib: $ops_ldd"
if grep -E "$codecs" <<<"$ops_ldd"; then fail "convnn_ops_example loads the libraries above"; fi
# (ldd's output is held first: grep -q stopping early would break ldd's pipe, a failure under pipefail.)
full_ldd="$(ldd "$example/convnn_example")"
grep -Eq "$codecs" <<<"$full_ldd" || fail "ldd shows no codec even for convnn_example"
json='nlohmann_json|ZLIB|JPEG|PNG'
if grep -E "$json" "$work/graph/deps.dot.convnn_ops_example"; then
  fail "convnn::ops's dependency graph has the lines above ($work/graph/deps.dot.convnn_ops_example)"
fi
grep -q "nlohmann_json" "$work/graph/deps.dot.convnn_example" || \
  fail "the dependency graph shows no nlohmann_json even for convnn_example"

# The package refuses a LibTorch other than the one convnn was built against, naming both.
log "checking that find_package(convnn) refuses another LibTorch"
built_torch="$(sed -n 's/^set(convnn_TORCH_VERSION "\(.*\)")$/\1/p' "$prefix/lib/cmake/convnn/convnnConfig.cmake")"
[ -n "$built_torch" ] || fail "convnnConfig.cmake names no convnn_TORCH_VERSION"
other_torch="0.0.1"
mkdir -p "$work/other-torch/Torch" "$work/mismatch"
printf 'set(Torch_FOUND TRUE)\n' >"$work/other-torch/Torch/TorchConfig.cmake"
printf 'set(PACKAGE_VERSION "%s")\nset(PACKAGE_VERSION_COMPATIBLE TRUE)\n' "$other_torch" \
  >"$work/other-torch/Torch/TorchConfigVersion.cmake"
printf 'cmake_minimum_required(VERSION 3.22)\nproject(mismatch LANGUAGES NONE)\nfind_package(convnn REQUIRED)\n' \
  >"$work/mismatch/CMakeLists.txt"
if cmake -S "$work/mismatch" -B "$work/mismatch/build" \
    -DCMAKE_PREFIX_PATH="$prefix;$work/other-torch" >"$work/step.log" 2>&1; then
  fail "find_package(convnn) accepted LibTorch $other_torch (built against $built_torch)"
fi
refusal="$(tr -s ' \n' ' ' <"$work/step.log")"  # CMake wraps the message's lines
grep -q "built against LibTorch $built_torch, but find_package(Torch) found LibTorch $other_torch" <<<"$refusal" || {
  cat "$work/step.log" >&2
  fail "find_package(convnn) refused LibTorch $other_torch without naming both versions"
}
log "ok"

#!/usr/bin/env bash
# Installs everything convnn needs on a fresh Debian 12 machine, then configures and builds.
# Idempotent: a second run reuses the apt packages, the cached venv and the build folder.
#
#   scripts/setup.sh            install + configure + build (Release, into build/) + the Python package
#   CONVNN_SKIP_BUILD=1 ...     install only
#   CONVNN_BUILD_TARGETS="convnn_cli" ...
#                               build only these targets and not the Python package (the main job,
#                               scripts/run.sh: the tests are most of the build; a later full run
#                               builds the rest into the same build/, nothing twice)
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$repo_root/scripts/versions.sh"

log() { printf '[setup, %d s] %s\n' "$SECONDS" "$*" >&2; }

install_apt_packages() {
  local missing=()
  for pkg in "${CONVNN_APT_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed' || missing+=("$pkg")
  done
  if ((${#missing[@]})); then
    log "installing Debian packages: ${missing[*]}"
    local sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
  fi
}

# The torch wheel (with its CUDA libraries) is several GB, so the venv lives in a per-user cache
# keyed by the pinned versions, and every clone links to it as .venv.
install_venv() {
  local cache="${XDG_CACHE_HOME:-$HOME/.cache}/convnn"
  local venv="$cache/venv-torch-${CONVNN_TORCH_VERSION}-py$("$CONVNN_PYTHON" -c 'import sys;print(f"{sys.version_info[0]}.{sys.version_info[1]}")')"
  local wanted="torch==${CONVNN_TORCH_VERSION} ${CONVNN_PIP_PACKAGES[*]}"
  if [ ! -f "$venv/.complete" ]; then
    log "creating venv $venv (first time: downloads torch ${CONVNN_TORCH_VERSION}, ~4 GB)"
    rm -rf "$venv"
    mkdir -p "$cache"
    "$CONVNN_PYTHON" -m venv "$venv"
    "$venv/bin/python" -m pip install -q --upgrade pip
  fi
  # .complete records what was installed; a changed package list installs only what is new.
  if [ "$(cat "$venv/.complete" 2>/dev/null)" != "$wanted" ]; then
    # shellcheck disable=SC2086
    "$venv/bin/python" -m pip install -q $wanted
    echo "$wanted" > "$venv/.complete"
  fi
  ln -sfn "$venv" "$repo_root/.venv"
}

build() {
  local build_dir="$repo_root/build"
  # Relative paths in ccache's keys let every clone (CI's included) reuse the compiled objects;
  # the sloppiness settings let ccache cache the tests' precompiled header.
  export CCACHE_BASEDIR="$repo_root"
  export CCACHE_SLOPPINESS="pch_defines,time_macros,include_file_mtime,include_file_ctime"
  local torch_cmake
  torch_cmake="$("$repo_root/.venv/bin/python" -c 'import torch;print(torch.utils.cmake_prefix_path)')"
  if [ ! -f "$build_dir/build.ninja" ]; then
    log "configuring $build_dir"
    cmake -S "$repo_root" -B "$build_dir" -G Ninja \
      -DCMAKE_BUILD_TYPE=Release \
      -DCMAKE_PREFIX_PATH="$torch_cmake" \
      -DPython3_EXECUTABLE="$repo_root/.venv/bin/python"
  fi
  local targets=()
  # shellcheck disable=SC2206
  [ -z "${CONVNN_BUILD_TARGETS:-}" ] || targets=(--target $CONVNN_BUILD_TARGETS)
  log "building ${CONVNN_BUILD_TARGETS:-every target} (the venv is ready; ninja counts the steps)"
  cmake --build "$build_dir" --parallel "$(nproc)" "${targets[@]}"
}

# The Python package (pyproject.toml) into the venv: `pip install .`, without build isolation
# (the venv has scikit-build-core and torch). Its build folder, build-python/, persists, so a
# reinstall rebuilds only what changed; ccache shares objects with build/.
install_python_package() {
  log "installing the convnn Python package into the venv"
  export CCACHE_BASEDIR="$repo_root"
  export CCACHE_SLOPPINESS="pch_defines,time_macros,include_file_mtime,include_file_ctime"
  # The compiler build/ uses, by the same path: ccache keys on the compiler's name, and pip's build
  # would otherwise pick Python's (x86_64-linux-gnu-g++) and miss on every object (measured: 6 of
  # the cold CI run's minutes went to compiling the package's libraries a second time).
  local compiler
  compiler="$(sed -n 's/^CMAKE_CXX_COMPILER:[A-Z]*=//p' "$repo_root/build/CMakeCache.txt" 2>/dev/null)"
  local python_cache="$repo_root/build-python/CMakeCache.txt"
  if [ -n "$compiler" ] && [ -f "$python_cache" ] && ! grep -qx "CMAKE_CXX_COMPILER:FILEPATH=$compiler" "$python_cache"; then
    rm -rf "$repo_root/build-python"  # configured with another compiler (CMake keeps the first)
  fi
  CXX="${compiler:-${CXX:-c++}}" CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)" "$repo_root/.venv/bin/python" -m pip install -q \
    --no-build-isolation "$repo_root"
}

install_apt_packages
install_venv
if [ "${CONVNN_SKIP_BUILD:-0}" != 1 ]; then
  build
  [ -n "${CONVNN_BUILD_TARGETS:-}" ] || install_python_package
  log "done"
fi

#!/usr/bin/env bash
# The whole test suite: installs what is missing, builds, and runs every C++ and Python test.
set -euo pipefail
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$repo_root/scripts/setup.sh"
cd "$repo_root/build"
# CTest runs one test process per core, so each process keeps to one intra-op thread; tests that
# check multi-threaded kernels set their own thread count.
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
ctest --output-on-failure --parallel "$(nproc)" "$@"

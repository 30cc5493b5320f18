#!/usr/bin/env bash
# The whole test suite: installs what is missing, builds, and runs every C++ and Python test.
set -euo pipefail
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$repo_root/scripts/setup.sh"
cd "$repo_root/build"
ctest --output-on-failure --parallel "$(nproc)" "$@"

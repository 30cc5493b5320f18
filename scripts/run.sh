#!/usr/bin/env bash
# The main job: installs what is missing, builds, and runs `convnn verify`.
set -euo pipefail
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$repo_root/scripts/setup.sh"
exec "$repo_root/build/bin/convnn" verify "$@"

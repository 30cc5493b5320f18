#!/usr/bin/env bash
# The main job: installs what is missing, builds, and trains the default ConvNN model (ResNet-18
# with branching ConvNN/conv layers, configs/fashion-mnist.json) on Fashion-MNIST from Debian's
# dataset-fashion-mnist package, then prints the test accuracy and where the plots and
# checkpoints are. Extra arguments go to `convnn train` (e.g. --epochs 5, --experiment NAME).
# A finished run of the same name is not overwritten: a second call names its run by the time.
set -euo pipefail
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# Only what training needs: the command-line tool and its libraries (the tests and the Python
# package are most of a cold build; the test command builds them into the same build/), and the
# GPU kernels where there is a GPU to train on (compiling them is minutes of a cold build; without
# them a CUDA call takes the device-generic path).
targets=convnn_cli
if nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then targets="$targets convnn_gpu_kernels"; fi
CONVNN_BUILD_TARGETS="$targets" bash "$repo_root/scripts/setup.sh"
cd "$repo_root"
experiment=fashion-mnist-branching
if [[ -e "runs/$experiment/checkpoint-latest.pt" ]]; then
  experiment="$experiment-$(date +%Y%m%d-%H%M%S)"
fi
exec "$repo_root/build/bin/convnn" train --config configs/fashion-mnist.json --experiment "$experiment" "$@"

#!/usr/bin/env bash
# RESULTS.md's language-model comparison: lm_tiny with ConvNN attention (K = 8, 16, 32) and its
# MHSA twin, 3 seeds each, trained by configs/lm-fortunes.json on Debian's fortunes corpus, then a
# quiet speed pass (training and generation tokens per second, one model at a time), then the table
# (scripts/lm_results_table.py). Idempotent: finished runs are kept, a stopped one resumes.
#   scripts/lm-results.sh [runs|speed|table|all]   (default all; build/ must hold the convnn tool)
set -euo pipefail
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
convnn="${CONVNN_BIN:-$repo_root/build/bin/convnn}"
out="${CONVNN_LM_RESULTS:-$repo_root/runs/lm-results}"
stage="${1:-all}"
variants=("convnn 8" "convnn 16" "convnn 32" "mhsa 0")
seeds=(0 1 2)

name_of() { [[ "$1" == mhsa ]] && echo mhsa || echo "convnn-k$2"; }
model_flags() { if [[ "$1" == mhsa ]]; then echo "--attention mhsa"; else echo "--attention convnn --k $2"; fi; }

train_runs() {
  for variant in "${variants[@]}"; do
    read -r attention k <<<"$variant"
    for seed in "${seeds[@]}"; do
      local run="$out/$(name_of "$attention" "$k")-s$seed"
      if [[ -e "$run/checkpoint-latest.pt" ]]; then
        # Finished (metrics for every epoch) or stopped: resume does nothing past the last epoch.
        "$convnn" train --resume "$run" --quiet --log-interval 100 --no-plots
      else
        # shellcheck disable=SC2046
        "$convnn" train --config "$repo_root/configs/lm-fortunes.json" $(model_flags "$attention" "$k") \
          --seed "$seed" --output "$out" --experiment "$(basename "$run")" --quiet --log-interval 100 --no-plots
      fi
    done
  done
}

# Tokens per second with nothing else running: 80 training steps of each model (batch 32 x 256
# tokens), and 512 tokens generated from each seed-0 checkpoint (`convnn generate --speed`: the
# sampling's own time, without the process's start and the model's loading).
speed() {
  local speed_dir="$out/speed"
  rm -rf "$speed_dir"
  mkdir -p "$speed_dir"
  for variant in "${variants[@]}"; do
    read -r attention k <<<"$variant"
    local name
    name="$(name_of "$attention" "$k")"
    # shellcheck disable=SC2046
    "$convnn" train --config "$repo_root/configs/lm-fortunes.json" $(model_flags "$attention" "$k") --epochs 1 \
      --train-subset 2560 --val-subset 32 --output "$speed_dir" --experiment "train-$name" --quiet \
      --log-interval 1000 --no-plots >/dev/null
    # shellcheck disable=SC2046
    "$convnn" info --model lm_tiny $(model_flags "$attention" "$k") --num-classes 256 --json >"$speed_dir/info-$name.json"
    "$convnn" generate --checkpoint "$out/$name-s0" --prompt $'%\n' -n 512 --seed 0 --speed \
      >"$speed_dir/generate-$name.txt" 2>"$speed_dir/generate-$name.speed"
  done
}

case "$stage" in
  runs) train_runs ;;
  speed) speed ;;
  table) "${CONVNN_PYTHON:-python3}" "$repo_root/scripts/lm_results_table.py" "$out" ;;
  all)
    train_runs
    speed
    "${CONVNN_PYTHON:-python3}" "$repo_root/scripts/lm_results_table.py" "$out"
    ;;
  *) echo "usage: $0 [runs|speed|table|all]" >&2; exit 2 ;;
esac

#!/usr/bin/env bash
# The TRL + accelerate variant of one run (one node, 8 GPUs, ZeRO-3; runs: grpo, gspo, dcpo):
#   launch_trl.sh RUN --model MODEL_DIR --train TRAIN.parquet (verl RL layout, or GSM8K/MATH jsonl) [--out runs/cluster]
# Writes OUT/<recipe>/<run>/run.json and TRL's checkpoints and trainer_state.json; rerunning resumes.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
cd "$here/../../.."
exec accelerate launch --config_file "$here/accelerate_zero3.yaml" -m harness.cli recipe launch trl "$here" "$@"

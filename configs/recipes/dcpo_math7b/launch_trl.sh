#!/usr/bin/env bash
# The TRL + accelerate variant of one run (one node, 8 GPUs, ZeRO-3; runs: grpo, gspo, dcpo):
#   launch_trl.sh RUN --model MODEL_DIR --train TRAIN.parquet (verl RL layout, or GSM8K/MATH jsonl) [--out runs/cluster]
# Writes OUT/<recipe>/<run>/run.json and TRL's checkpoints and trainer_state.json; rerunning resumes.
# With --dry-run it prints the accelerate command and the trainer's settings, and needs neither accelerate's
# launcher nor DeepSpeed.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
cd "$here/../../.."
for arg in "$@"; do
    if [ "$arg" = "--dry-run" ]; then
        exec python -m harness.cli recipe launch trl "$here" "$@"
    fi
done
if ! python -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('deepspeed') is None)"; then
    echo "error: $0: the TRL variant runs under accelerate with ZeRO-3 ($here/accelerate_zero3.yaml), which needs DeepSpeed: pip install deepspeed" >&2
    exit 2
fi
exec accelerate launch --config_file "$here/accelerate_zero3.yaml" -m harness.cli recipe launch trl "$here" "$@"

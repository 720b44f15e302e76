#!/usr/bin/env bash
# One run of this recipe with verl (on the Ray head node, from the cliplab checkout):
#   launch_verl.sh RUN --model MODEL_DIR --train TRAIN.parquet --val VAL.parquet [--out runs/cluster] [hydra overrides]
# Checks the paths, writes OUT/<recipe>/<run>/run.json, verl.jsonl (verl's file logger) and console.log.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
cd "$here/../../.."
exec python -m harness.cli recipe launch verl "$here" "$@"

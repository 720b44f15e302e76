#!/usr/bin/env bash
# The tiny tier's runs (configs/tiny: GRPO, Dr.GRPO, DAPO, GSPO, DCPO, SAPO, CISPO and the clip-higher, SAPO-temperature
# and DCPO-attribution variants x 10 seeds x 300 steps; the seven algorithms' runs first, each part seed-major) in two
# lanes, in the background, on the tiny_char model (`make tiny-model` first).
# Resumable: run it again and finished runs are skipped, partial ones resume from their checkpoints.
# Arguments go to harness.runs.evidence (e.g. --seeds 0 1 2). Output: runs/tiny/ (weights, outside git); each
# finished run's config.json + metrics.jsonl are committed under reports/tiny/runs/<name>/seed<k>/.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PY:-.venv/bin/python}
MAIN="grpo dr_grpo dapo gspo dcpo sapo cispo"  # the seven algorithms first (every seed), then the variants
VARIANTS="grpo_beta0 grpo_beta0_eps_high028 grpo_beta0_unclipped sapo_tau_reversed dcpo_binary_reward dcpo_no_sas"
mkdir -p runs/tiny
for lane in 0 1; do
  (for runs in "$MAIN" "$VARIANTS"; do
     # shellcheck disable=SC2086  # the names are words
     HF_HUB_OFFLINE=1 PYTHONPATH=$PWD OMP_NUM_THREADS=1 nice -n 5 "$PY" -m harness.runs.evidence --lane $lane --lanes 2 \
       --configs configs/tiny --out runs/tiny --copy-to reports/tiny/runs --algos $runs --seeds 0 1 2 3 4 5 6 7 8 9 "$@"
   done >> runs/tiny/lane$lane.log 2>&1) &
  echo "lane $lane: pid $!"
done

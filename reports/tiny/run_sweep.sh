#!/usr/bin/env bash
# The tiny tier's runs in the regime where the algorithms differ (configs/tiny: 16 optimiser updates per rollout
# batch): the seven algorithms GRPO, Dr.GRPO, DAPO, GSPO, DCPO, SAPO, CISPO, and the variants: clip-higher at eps_high
# 0.2 / 0.28 / none with KL off, Clip-Cov and KL-Cov beside GRPO at their settings (grpo_cov_baseline), and SAPO's
# temperatures, each on both priors (exploration, sharpening); SAPO also at staleness 2, TIS / MIS under a sampler
# mismatch (staleness 2, pi_old recomputed), DCPO's attribution (binary reward; SAS off) and GSPO at staleness 2. 10
# seeds x 300 steps in two lanes, in the background, on the tiny_char models (`make tiny-model` first), in seven phases,
# each seed-major (every setting's seed k before any seed k + 1): seed 0 of every setting; GRPO's discovery seeds (the
# card reports/tiny/simulate.sh fits the simulator to); the discovery seeds 1-4, then the replication seeds 5-9, of
# the settings the exploration axis compares (clip-higher, Clip-Cov / KL-Cov, SAPO's temperatures, on both priors);
# the discovery seeds of the other ranked algorithms (so that the seven algorithms' ranking is tested sooner); then
# the same two of the others.
# Resumable: run it again and finished runs are skipped (a committed copy under $COPY_TO is enough: a new clone goes
# on where the last left off), partial ones resume from their checkpoints.
# Arguments go to harness.runs.evidence (e.g. --seeds 0 1 2; --steps 400 trains every run on to 400 steps, a finished
# shorter one from its last checkpoint, as if it had been started at 400: with COPY_TO elsewhere until all have).
# Output: $OUT/ (default runs/tiny_regime: weights, outside git); each finished run's config.json + metrics.jsonl are
# committed under $COPY_TO/<name>/seed<k>/ (default reports/tiny/runs_regime: the older tier's runs under
# reports/tiny/runs are left as they are). --set section.field=value applies a setting to every config.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PY:-.venv/bin/python}
COPY_TO=${COPY_TO:-reports/tiny/runs_regime}
OUT=${OUT:-runs/tiny_regime}
AXIS="grpo grpo_sharpening grpo_beta0 grpo_beta0_eps_high028 grpo_beta0_unclipped
  grpo_beta0_sharpening grpo_beta0_eps_high028_sharpening grpo_beta0_unclipped_sharpening
  clip_cov kl_cov clip_cov_sharpening kl_cov_sharpening grpo_cov_baseline grpo_cov_baseline_sharpening
  sapo sapo_tau_reversed sapo_sharpening sapo_tau_reversed_sharpening"
RANKED="dr_grpo dapo gspo dcpo cispo"  # with grpo and sapo (in AXIS), the seven algorithms the report ranks
OTHERS="$RANKED sapo_stale2 sapo_tau_reversed_stale2
  grpo_stale2_recompute grpo_stale2_recompute_tis grpo_stale2_recompute_mis dcpo_binary_reward dcpo_no_sas gspo_stale2"
PHASES=("$AXIS $OTHERS|0" "grpo|1 2 3 4" "$AXIS|1 2 3 4" "$AXIS|5 6 7 8 9"
        "$RANKED|1 2 3 4" "$OTHERS|1 2 3 4" "$OTHERS|5 6 7 8 9")
mkdir -p "$OUT"
for lane in 0 1; do
  (for phase in "${PHASES[@]}"; do
     # shellcheck disable=SC2086  # the names and seeds are words
     HF_HUB_OFFLINE=1 PYTHONPATH=$PWD OMP_NUM_THREADS=1 nice -n 5 \
       "$PY" -m harness.runs.evidence --lane $lane --lanes 2 \
       --configs configs/tiny --out "$OUT" --copy-to "$COPY_TO" --algos ${phase%|*} --seeds ${phase#*|} "$@" \
       || exit 1
   done >> "$OUT/lane$lane.log" 2>&1) &
  echo "lane $lane: pid $!"
done

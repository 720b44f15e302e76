#!/usr/bin/env bash
# Regenerate reports/sim/report.md: every sweep of the report (each resumable: rerun to continue), then the report;
# prints the wall time of each sweep. Sweeps run JOBS at a time (default: the number of cores), one process each,
# the largest first, so no core waits at the end of a small sweep. Usage: reports/sim/regenerate.sh [RUNS_DIR]
# (default runs/sim).
set -euo pipefail
RUNS=${1:-runs/sim}
PY=${PYTHON:-python}
JOBS=${JOBS:-$(nproc)}
DIRS=()
FAILED=$(mktemp)
trap 'kill $(jobs -p) 2> /dev/null || true; rm -f "$FAILED"' EXIT
T0=$SECONDS
sweep() {  # sweep ENV NAME ARGS...: one `cliplab sim` (5 seeds x 300 steps) into RUNS/ENV/NAME, timed, in the background
  local env=$1 name=$2; shift 2
  while (( $(jobs -rp | wc -l) >= JOBS )); do wait -n || true; done
  DIRS+=("$RUNS/$env/$name")
  mkdir -p "$RUNS/$env"
  (t0=$SECONDS  # the progress bar and any error go to RUNS/ENV/NAME.log
   if $PY -m harness.cli sim --env "$env" --seeds 5 --steps 300 --workers 1 --out "$RUNS/$env/$name" "$@" \
        > /dev/null 2> "$RUNS/$env/$name.log"
   then echo "$env/$name: $((SECONDS - t0)) s"
   else echo "$env/$name: $(tail -n 1 "$RUNS/$env/$name.log")" >> "$FAILED"; fi) &
}
# the two full comparisons first (the largest sweeps)
sweep feature_lm main --algos all
sweep toy_lm main --algos all
# feature LM (shared parameters; defaults: rollouts 2 steps old, 8 minibatches): the same questions, DAPO for
# clip-higher (no KL term), on-policy with one minibatch as the regime where ratios stay at 1; SAPO's mirrored
# temperatures at the defaults and in a stressed regime (rollouts 6 steps old, 16 minibatches, SAPO_STRESS)
sweep feature_lm clip_higher --algos dapo --set eps_high=0.2,0.28,100
sweep feature_lm random_reward --algos grpo --set reward=random --set beta=0 --set eps_high=0.2,100
sweep feature_lm clip_higher_onpolicy --algos dapo --set staleness=0 --set minibatches=1 --set eps_high=0.2,0.28,100
SAPO_STRESS=(--set staleness=6 --set minibatches=16 --set lr=0.06)
sweep feature_lm sapo_stress_a --algos sapo "${SAPO_STRESS[@]}" --set tau_pos=1.0 --set tau_neg=4.0
sweep feature_lm sapo_stress_b --algos sapo "${SAPO_STRESS[@]}" --set tau_pos=4.0 --set tau_neg=1.0
sweep feature_lm dcpo_binary --algos dcpo --set reward=binary
sweep feature_lm sapo_default_a --algos sapo --set tau_pos=1.0 --set tau_neg=1.05
sweep feature_lm sapo_default_b --algos sapo --set tau_pos=1.05 --set tau_neg=1.0
# toy LM (tabular): every algorithm; DCPO with the binary reward; clip-higher with the KL penalty off (GRPO beta=0)
# in the default regime, a stressed one (4 epochs, lr 0.1, rollouts 2 steps old) and on-policy (one minibatch);
# the random-reward control; SAPO's temperatures at the defaults and in a stressed regime
sweep toy_lm dcpo_binary --algos dcpo --set reward=binary
sweep toy_lm random_reward --algos grpo --set reward=random --set beta=0 --set eps_high=0.2,100
sweep toy_lm clip_higher --algos grpo --set beta=0 --set eps_high=0.2,0.28,100
sweep toy_lm clip_higher_stress --algos grpo --set beta=0 --set epochs=4 --set lr=0.1 --set staleness=2 \
  --set eps_high=0.2,0.28,100
sweep toy_lm clip_higher_onpolicy --algos grpo --set beta=0 --set epochs=1 --set minibatches=1 \
  --set eps_high=0.2,0.28,100
sweep toy_lm sapo_stress_a --algos sapo --set epochs=4 --set lr=0.3 --set tau_pos=1.0 --set tau_neg=2.0
sweep toy_lm sapo_stress_b --algos sapo --set epochs=4 --set lr=0.3 --set tau_pos=2.0 --set tau_neg=1.0
sweep toy_lm sapo_default_a --algos sapo --set tau_pos=1.0 --set tau_neg=1.05
sweep toy_lm sapo_default_b --algos sapo --set tau_pos=1.05 --set tau_neg=1.0
# the algorithms beyond the seeds, in both environments: Clip-Cov and KL-Cov (a share of 0.02 of the batch's
# tokens, so that a toy batch selects some) and CISPO beside PPO-clip (GRPO, KL off, token mean); GRPO under a
# rollout/trainer mismatch (rollout_noise) without and with TIS / MIS
for env in feature_lm toy_lm; do
  sweep $env beyond_cov --algos grpo,cispo,clip_cov,kl_cov --set beta=0 --set agg=token_mean \
    --set clip_cov_ratio=0.02 --set kl_cov_ratio=0.02
  sweep $env beyond_mismatch --algos grpo --set beta=0 --set rollout_noise=0,1 --set rollout_correction=None,tis,mis
done
wait
if [[ -s $FAILED ]]; then echo "failed (rerun to resume):" >&2; cat "$FAILED" >&2; exit 1; fi
$PY -m harness.cli report "${DIRS[@]}" --out reports/sim/report.md
for env in toy_lm feature_lm; do cp "$RUNS/$env/main/summary.json" "reports/sim/summary_${env}.json"; done
echo "total: $((SECONDS - T0)) s"

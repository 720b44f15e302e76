#!/usr/bin/env bash
# Regenerate reports/sim/report.md: every sweep of the report (each resumable: rerun to continue), then the report,
# and each sweep's summary.json into reports/sim/summaries/ (the test suite checks the report against them); prints
# the wall time of each sweep. Every sweep runs 20 seeds (0-9 discovery, 10-19 replication; blocks of 5 seeds share
# an environment draw, so each set spans 2 draws; a label's 20 seeds are one stacked trainer) x STEPS steps (default
# 150). Sweeps run JOBS at a time (default: the number of cores), one process each, the largest first. Usage:
# reports/sim/regenerate.sh [RUNS_DIR] (default runs/sim); SEEDS=1000-1009:1010-1019 OUT=/tmp/heldout
# reports/sim/regenerate.sh runs/heldout rebuilds it on other seeds (and environment draws) into a scratch folder.
set -euo pipefail
RUNS=${1:-runs/sim}
PY=${PYTHON:-python}
JOBS=${JOBS:-$(nproc)}
SEEDS=${SEEDS:-0-9:10-19}
STEPS=${STEPS:-150}
OUT=${OUT:-reports/sim}
ALGOS=grpo,dr_grpo,dapo,gspo,dcpo,sapo  # the algorithms the claims compare
EXTRA=()
# shellcheck source=reports/sim/sweeps.sh
source "$(dirname "$0")/sweeps.sh"
# the two comparisons first (the largest sweeps)
sweep feature_lm main --algos $ALGOS
sweep toy_lm main --algos $ALGOS
# then, largest first: on both LMs, Clip-Cov, KL-Cov and CISPO beside PPO-clip (GRPO) at the same settings (KL
# penalty off, token mean, 2% of tokens selected); TIS and MIS against no correction under a rollout/trainer mismatch
# (the sampler's parameters plus N(0, 0.2^2) noise each step)
COV=(--set beta=0 --set agg=token_mean --set clip_cov_ratio=0.02 --set kl_cov_ratio=0.02)
MISMATCH=(--set beta=0 --set rollout_noise=0.2 --set rollout_correction=None,tis,mis)
for env in feature_lm toy_lm; do
  sweep $env cov --algos grpo,clip_cov,kl_cov,cispo "${COV[@]}"
  sweep $env rollout_correction --algos grpo "${MISMATCH[@]}"
done
# feature LM (shared parameters; rollouts 2 steps old, 8 minibatches): clip-higher as DAPO's ladder states it
# (naive GRPO, KL penalty off: beta 0), the random-reward control, the collapse claims' controls (random reward, a
# learning rate near 0, SGD instead of Adam), SAPO's mirrored temperatures at the defaults and in a stressed regime
# (its principle: the negative side's gate decays faster, damping large negative updates, so stale, off-policy
# updates: rollouts 6 steps old, 16 minibatches, lr 0.06), DCPO under the binary reward
sweep feature_lm clip_higher --algos grpo --set beta=0 --set eps_high=0.2,0.28,100
# clip-higher's regime, from its principle (the upper clip stops the growth of positive-advantage tokens at pi_old
# < 0.2, DAPO Fig. 3a): a confident prior, as an instruct model's (dominant tokens near 0.92, above 1 / 1.2, so that
# only improbable tokens can reach the bound), and one fork per prompt whose correct token is an exploration token
# (difficulty -4..0: pi_old 0.03-0.38, median 0.11); the off-policy updates of the defaults. Chosen among six
# candidates on the discovery seeds by its mechanism (the most up-clipped tokens at forks), not by its effect
sweep feature_lm clip_higher_regime --algos grpo --set beta=0 --set eps_high=0.2,0.28,100 --set confidence=4 \
  --set forks=1 --set difficulty_low=-4 --set difficulty_high=0
sweep feature_lm random_reward --algos grpo --set reward=random --set beta=0 --set eps_high=0.2,100
sweep feature_lm control_random --algos grpo --set reward=random
sweep feature_lm control_lr --algos grpo --set lr=0.0001
sweep feature_lm control_sgd --algos grpo --set optimizer=sgd --set lr=1.0
sweep feature_lm sapo_default_a --algos sapo --set tau_pos=1.0 --set tau_neg=4.0
sweep feature_lm sapo_default_b --algos sapo --set tau_pos=4.0 --set tau_neg=1.0
SAPO_STRESS=(--set staleness=6 --set minibatches=16 --set lr=0.06)
sweep feature_lm sapo_stress_a --algos sapo "${SAPO_STRESS[@]}" --set tau_pos=1.0 --set tau_neg=4.0
sweep feature_lm sapo_stress_b --algos sapo "${SAPO_STRESS[@]}" --set tau_pos=4.0 --set tau_neg=1.0
sweep feature_lm dcpo_binary --algos dcpo --set reward=binary
# the exploration axis (the tiny tier's two priors): clip-higher, Clip-Cov / KL-Cov and SAPO's temperatures again with
# the tokens RL must raise below pi_old 0.2 (explore=exploration; the sweeps above run the default, sharpening)
EXPLORE=(--set explore=exploration)
sweep feature_lm clip_higher_exploration --algos grpo --set beta=0 --set eps_high=0.2,0.28,100 "${EXPLORE[@]}"
sweep feature_lm cov_exploration --algos grpo,clip_cov,kl_cov,cispo "${COV[@]}" "${EXPLORE[@]}"
sweep feature_lm sapo_exploration_a --algos sapo --set tau_pos=1.0 --set tau_neg=4.0 "${EXPLORE[@]}"
sweep feature_lm sapo_exploration_b --algos sapo --set tau_pos=4.0 --set tau_neg=1.0 "${EXPLORE[@]}"
# toy LM (tabular): DCPO with the binary reward; clip-higher with the KL penalty off (GRPO beta=0), and under the
# random reward; SAPO's mirrored temperatures at the defaults
sweep toy_lm dcpo_binary --algos dcpo --set reward=binary
sweep toy_lm clip_higher --algos grpo --set beta=0 --set eps_high=0.2,0.28,100
sweep toy_lm random_reward --algos grpo --set reward=random --set beta=0 --set eps_high=0.2,100
sweep toy_lm sapo_a --algos sapo --set tau_pos=1.0 --set tau_neg=4.0
sweep toy_lm sapo_b --algos sapo --set tau_pos=4.0 --set tau_neg=1.0
report_sweeps

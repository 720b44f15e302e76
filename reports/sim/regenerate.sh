#!/usr/bin/env bash
# Regenerate reports/sim/report.md: every sweep of the report (each resumable), then the report; prints the wall
# time of each sweep. Usage: reports/sim/regenerate.sh [RUNS_DIR] (default runs/sim).
set -euo pipefail
RUNS=${1:-runs/sim}
PY=${PYTHON:-python}
S=(--seeds 5 --steps 300)
sweep() {  # sweep NAME ENV ARGS...: one `cliplab sim` into RUNS/ENV/NAME, timed
  local name=$1 env=$2; shift 2
  local t0=$SECONDS
  $PY -m harness.cli sim --env "$env" "${S[@]}" --out "$RUNS/$env/$name" "$@" > /dev/null
  echo "$env/$name: $((SECONDS - t0)) s"
  DIRS+=("$RUNS/$env/$name")
}
DIRS=()
T0=$SECONDS
for env in toy_lm feature_lm; do
  sweep main "$env" --algos all
  sweep dcpo_binary "$env" --algos dcpo --set reward=binary
  sweep random_reward "$env" --algos grpo --set reward=random --set beta=0 --set eps_high=0.2,100
  sweep sapo_default "$env" --algos sapo --set tau_pos=1.0,1.05 --set tau_neg=1.0,1.05
done
# clip-higher, KL off (grpo beta=0 on the toy LM; DAPO has no KL term): the default regime, a stressed one, on-policy
sweep clip_higher toy_lm --algos grpo --set beta=0 --set eps_high=0.2,0.28,100
sweep clip_higher_stress toy_lm --algos grpo --set beta=0 --set epochs=4 --set lr=0.1 --set staleness=2 \
  --set eps_high=0.2,0.28,100
sweep clip_higher_onpolicy toy_lm --algos grpo --set beta=0 --set epochs=1 --set minibatches=1 \
  --set eps_high=0.2,0.28,100
sweep sapo_stress toy_lm --algos sapo --set epochs=4 --set lr=0.3 --set tau_pos=1.0,2.0 --set tau_neg=1.0,2.0
sweep clip_higher feature_lm --algos dapo --set eps_high=0.2,0.28,100
sweep clip_higher_onpolicy feature_lm --algos dapo --set staleness=0 --set minibatches=1 --set eps_high=0.2,0.28,100
sweep sapo_stress feature_lm --algos sapo --set lr=0.1 --set tau_pos=1.0,2.0 --set tau_neg=1.0,2.0
$PY -m harness.cli report "${DIRS[@]}" --out reports/sim/report.md
for env in toy_lm feature_lm; do cp "$RUNS/$env/main/summary.json" "reports/sim/summary_${env}.json"; done
echo "total: $((SECONDS - T0)) s"

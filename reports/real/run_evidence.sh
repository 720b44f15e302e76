#!/usr/bin/env bash
# The real-model evidence runs (configs/evidence: 8 algorithms and 3 variants x 5 seeds, seed-major) in two lanes,
# in the background.
# Resumable: run it again and finished runs are skipped, partial ones resume from their checkpoints.
# Arguments go to harness.runs.evidence (e.g. --seeds 0 1 2). Output: runs/evidence/ (weights, outside git); each
# finished run's config.json + metrics.jsonl are committed under reports/real/evidence/<algo>/seed<k>/.
# Then: python -m harness.reports.real (regenerates reports/real/README.md).
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PY:-/work/main/.venv/bin/python}
mkdir -p runs/evidence
for lane in 0 1; do
  HF_HUB_OFFLINE=1 PYTHONPATH=$PWD OMP_NUM_THREADS=1 nohup nice -n 5 "$PY" -m harness.runs.evidence --lane $lane --lanes 2 \
    "$@" >> runs/evidence/lane$lane.log 2>&1 &
  echo "lane $lane: pid $!"
done

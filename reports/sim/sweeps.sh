# Shared by reports/sim/regenerate.sh and reports/tiny/simulate.sh (sourced, not run): `sweep` starts one
# `cliplab sim` in the background, at most JOBS at a time; `report_sweeps` waits for them, then writes the report of
# every sweep into OUT/report.md (claims.json beside it) and each sweep's summary.json into OUT/summaries/.
# Reads RUNS, PY, JOBS, SEEDS, STEPS, OUT and EXTRA (settings added to every sweep, an array).
DIRS=()
FAILED=$(mktemp)
trap 'kill $(jobs -p) 2> /dev/null || true; rm -f "$FAILED"' EXIT
T0=$SECONDS
sweep() {  # sweep ENV NAME ARGS...: one `cliplab sim` into RUNS/ENV/NAME, timed, in the background
  local env=$1 name=$2; shift 2
  while (( $(jobs -rp | wc -l) >= JOBS )); do wait -n || true; done
  DIRS+=("$RUNS/$env/$name")
  mkdir -p "$RUNS/$env"
  (t0=$SECONDS  # the progress bar and any error go to RUNS/ENV/NAME.log
   if $PY -m harness.cli sim --env "$env" --seeds "$SEEDS" --steps "$STEPS" --workers 1 --out "$RUNS/$env/$name" "$@" \
        ${EXTRA[@]+"${EXTRA[@]}"} > /dev/null 2> "$RUNS/$env/$name.log"
   then echo "$env/$name: $((SECONDS - t0)) s"
   else echo "$env/$name: $(tail -n 1 "$RUNS/$env/$name.log")" >> "$FAILED"; fi) &
}
report_sweeps() {
  wait
  if [[ -s $FAILED ]]; then echo "failed (rerun to resume):" >&2; cat "$FAILED" >&2; exit 1; fi
  $PY -m harness.cli report "${DIRS[@]}" --out "$OUT/report.md"
  mkdir -p "$OUT/summaries"
  for d in "${DIRS[@]}"; do
    env=$(basename "$(dirname "$d")"); cp "$d/summary.json" "$OUT/summaries/${env}_$(basename "$d").json"
  done
  echo "total: $((SECONDS - T0)) s"
}

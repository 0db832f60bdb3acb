#!/usr/bin/env bash
# One GPU call: the lesson's four exercises with Nsight Compute, and `tuner explain` on the recorded transpose
# study, bundled for benchmarks/results/ and tests/data/ncu/.
#
#   OUT=/some/dir bash benchmarks/explain_capture.sh
#
# Needs: a GPU, ncu on PATH, the project on PYTHONPATH (optuna too for the explain part; it is skipped without).
# Writes under $OUT: explain_capture.tgz (lessons/*.png|json|csv, explain.txt, explain.json, roofline.png|html,
# explain-profiles.json, env.txt, one log per step) and summary.txt (every step's printed table, in order).
# `python benchmarks/explain_regen.py DIR OUT` re-explains an extracted bundle on the CPU with the current code. Each step has its own limit (4 x 115 s + 90 s + 20 s) so the bundle is written within 10 minutes.
set -u
OUT=${OUT:?set OUT to the output folder}
PY=${PYTHON:-python3}
WORK=$(mktemp -d)
mkdir -p "$WORK/lessons" "$OUT"
SUMMARY="$OUT/summary.txt"
: > "$SUMMARY"
started=$(date +%s)

{
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "gpu: $(nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv,noheader 2>&1 | head -1)"
  echo "ncu: $(ncu --version 2>&1 | tail -1)"
  echo "python: $($PY --version 2>&1)"
  echo "commit: $(git rev-parse HEAD 2>/dev/null || echo unknown)"
} > "$WORK/env.txt"
cat "$WORK/env.txt" >> "$SUMMARY"
# The metric names this ncu knows on this GPU: the reference for fixing tuner/ncu.py METRICS if one is refused.
ncu --query-metrics > "$WORK/ncu-metrics.txt" 2>&1 || true

step() {  # step NAME LIMIT_S COMMAND...: run, log, keep going on failure
  local name=$1 limit=$2; shift 2
  local t0; t0=$(date +%s)
  echo "== $name: $*" | tee -a "$SUMMARY"
  timeout "$limit" "$@" > "$WORK/$name.log" 2>&1
  local rc=$?
  cat "$WORK/$name.log" >> "$SUMMARY"
  echo "== $name: rc=$rc in $(( $(date +%s) - t0 )) s" | tee -a "$SUMMARY"
}

for lesson in coalescing bank-conflicts fusion registers; do
  step "lesson-$lesson" 115 $PY -m tuner lesson "$lesson" --ncu --budget-ms 10 --out "$WORK/lessons"
done

if $PY -c "import optuna" 2>/dev/null; then
  # A copy: explain stores its profiles in the study, and the recorded study stays as committed.
  $PY -c "import sqlite3, sys; sqlite3.connect('file:' + sys.argv[1] + '?mode=ro', uri=True).backup(sqlite3.connect(sys.argv[2]))" \
    tests/data/transpose_h200.db "$WORK/transpose.db"
  step explain 90 $PY -m tuner explain "$WORK/transpose.db" --best --worst --compare 36 103 \
    --plot "$WORK/roofline.png"
  step explain-json 20 $PY -m tuner explain "$WORK/transpose.db" --best --worst --compare 36 103 --json
  cp "$WORK/explain-json.log" "$WORK/explain.json"
  # The study's stored profiles (metrics in base units), for benchmarks/explain_regen.py and tests/data/ncu/.
  $PY -c "import json, sys, optuna
attrs = optuna.load_study(study_name=None, storage='sqlite:///' + sys.argv[1]).user_attrs
json.dump({k: v for k, v in attrs.items() if k.startswith('ncu:')}, open(sys.argv[2], 'w'), indent=1)" \
    "$WORK/transpose.db" "$WORK/explain-profiles.json" || echo "explain-profiles.json: not written" >> "$SUMMARY"
  rm -f "$WORK/transpose.db"*
else
  echo "== explain: skipped (optuna not importable; carry the devsite tarball)" | tee -a "$SUMMARY"
fi

echo "total: $(( $(date +%s) - started )) s" | tee -a "$SUMMARY"
tar -C "$WORK" -czf "$OUT/explain_capture.tgz" .
rm -rf "$WORK"

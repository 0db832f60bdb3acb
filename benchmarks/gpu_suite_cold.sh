#!/usr/bin/env bash
# The GPU suite from cold: N runs of the GPU tests in fresh processes, with the counts, the GPU and the date.
# The first run meets whatever caches the machine has (a freshly started machine has none). Writes one line per
# run (exit code, seconds, pytest's closing line) after the machine's GPU and date to OUTFILE, and prints it last.
#
#     bash benchmarks/gpu_suite_cold.sh [RUNS] [OUTFILE]        # default 3 runs, $OUT/gpu-suite-cold.txt
set -uo pipefail
cd "$(dirname "$0")/.."
runs=${1:-3}
outfile=${2:-${OUT:-/tmp}/gpu-suite-cold.txt}
{
  echo "command: python3 -m pytest -m gpu tests/ -q -p no:cacheprovider  (x$runs, fresh processes)"
  echo "gpu: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -n 1)"
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "commit: ${SUITE_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}"
} > "$outfile"
for i in $(seq 1 "$runs"); do
  log="${outfile%.txt}-run$i.log"
  start=$(date +%s)
  python3 -m pytest -m gpu tests/ -q -p no:cacheprovider > "$log" 2>&1
  rc=$?
  echo "run $i: exit $rc, $(( $(date +%s) - start )) s, $(grep -E '(passed|failed|error)' "$log" | tail -n 1)" >> "$outfile"
done
cat "$outfile"

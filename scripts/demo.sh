#!/usr/bin/env bash
# The demo: watch fields of a bundled multi-threaded workload with hardware watchpoints.
set -euo pipefail
BUILD=${1:-build/default}
KWATCH=$BUILD/cli/kwatch
WORKLOAD=$BUILD/tests/targets/field_writer
OUT=kwatch-demo
mkdir -p "$OUT"

bold() { printf '\n\033[1m%s\033[0m\n' "$*"; }

bold "\$ kwatch --write g_stats.misses -- field_writer 2 12      # every write, live"
"$KWATCH" --write g_stats.misses -- "$WORKLOAD" 2 12 | tee "$OUT/live.txt"

bold "\$ kwatch --rw g_stats -q -- field_writer 4 1000      # a whole struct, per field, 4 threads"
"$KWATCH" --rw g_stats -q -- "$WORKLOAD" 4 1000 | tee "$OUT/summary.txt"

bold "\$ kwatch --write g_stats.hits --json -- field_writer 2 500 > $OUT/events.jsonl"
"$KWATCH" --write g_stats.hits --json -- "$WORKLOAD" 2 500 --truth "$OUT/truth.jsonl" > "$OUT/events.jsonl"
echo "$(grep -c '"type":"event"' "$OUT/events.jsonl") events, summary: $(tail -n 1 "$OUT/events.jsonl" | cut -c1-160)..."

bold "Report files:"
for f in live.txt summary.txt events.jsonl; do
  printf '  %s/%s\n' "$OUT" "$f"
done

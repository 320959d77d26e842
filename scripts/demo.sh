#!/usr/bin/env bash
# The demo: watch and profile the fields of bundled multi-threaded workloads, record the
# session, and turn the recording into a report and a heatmap image.
set -euo pipefail
BUILD=${1:-build/default}
KWATCH=$BUILD/cli/kwatch
TARGETS=$BUILD/tests/targets
OUT=kwatch-demo
mkdir -p "$OUT"
rm -f "$OUT"/*.kwdb "$OUT"/*.kwdb-wal "$OUT"/*.kwdb-shm

bold() { printf '\n\033[1m%s\033[0m\n' "$*"; }

bold "\$ kwatch --write g_stats.misses -- field_writer 2 12      # every write, live"
"$KWATCH" --write g_stats.misses -- "$TARGETS/field_writer" 2 12 | tee "$OUT/live.txt"

bold "\$ kwatch --rw g_stats -q -o $OUT/run.kwdb -- field_writer 4 2000      # a whole struct, 4 threads, recorded"
"$KWATCH" --rw g_stats -q -o "$OUT/run.kwdb" -- "$TARGETS/field_writer" 4 2000 \
  --truth "$OUT/truth.jsonl" | tee "$OUT/summary.txt"

bold "\$ kwatch report $OUT/run.kwdb --png $OUT/heatmap.png      # the storage profile of the recording"
"$KWATCH" report "$OUT/run.kwdb" --png "$OUT/heatmap.png" | tee "$OUT/report.txt"
"$KWATCH" report "$OUT/run.kwdb" --format json > "$OUT/report.json"

bold "\$ kwatch --write g_shared g_padded -q -o $OUT/false_sharing.kwdb -- false_sharing 20000"
"$KWATCH" --write g_shared g_padded -q -o "$OUT/false_sharing.kwdb" -- "$TARGETS/false_sharing" 20000 \
  | tee "$OUT/false_sharing.txt"
"$KWATCH" report "$OUT/false_sharing.kwdb" --png "$OUT/false_sharing.png" > "$OUT/false_sharing_report.txt"

bold "\$ kwatch-gui --export-png $OUT/viewer.png $OUT/false_sharing.kwdb      # the viewer, rendered headless"
"$BUILD/gui/kwatch-gui" --export-png "$OUT/viewer.png" "$OUT/false_sharing.kwdb"

bold "\$ kwatch probe 'tick i r->len' 'tick%return \$retval' -o $OUT/probes.kwdb -- uprobe_loop 5      # probes run inside the program (a jump to a trampoline, no trap)"
# shellcheck disable=SC2016  # $retval is kwatch's probe syntax, not the shell's
"$KWATCH" probe 'tick i r->len' 'tick%return $retval' -o "$OUT/probes.kwdb" -- "$TARGETS/uprobe_loop" 5 \
  | tee "$OUT/probes.txt"

bold "\$ kwatch --write g_stats.hits --json -- field_writer 2 500 > $OUT/events.jsonl"
"$KWATCH" --write g_stats.hits --json -- "$TARGETS/field_writer" 2 500 --truth "$OUT/truth2.jsonl" > "$OUT/events.jsonl"
echo "$(grep -c '"type":"event"' "$OUT/events.jsonl") events, summary: $(tail -n 1 "$OUT/events.jsonl" | cut -c1-160)..."

bold "Report files:"
for f in live.txt summary.txt run.kwdb report.txt report.json heatmap.png false_sharing.txt \
         false_sharing.kwdb false_sharing_report.txt false_sharing.png viewer.png probes.txt probes.kwdb \
         events.jsonl; do
  printf '  %s/%s\n' "$OUT" "$f"
done
echo "  (open a recording with: sqlite3 $OUT/run.kwdb; one row per event: kwatch export --sql rows.kwdb $OUT/run.kwdb; see docs/recording.md)"

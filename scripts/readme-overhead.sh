#!/usr/bin/env bash
# Puts the latest comparison table (bench/results/compare.md, written by bench/compare) into
# README.md between the "overhead" markers, so that the README shows measured numbers only.
set -euo pipefail
TABLE=${1:-bench/results/compare.md}
README=${2:-README.md}
[ -s "$TABLE" ] || { echo "readme-overhead: $TABLE is missing or empty" >&2; exit 1; }
grep -q '<!-- overhead:begin -->' "$README" || { echo "readme-overhead: no overhead markers in $README" >&2; exit 1; }
awk -v table="$TABLE" '
  /<!-- overhead:begin -->/ { print; while ((getline line < table) > 0) print line; skip = 1; next }
  /<!-- overhead:end -->/ { skip = 0 }
  !skip { print }' "$README" >"$README.tmp"
mv "$README.tmp" "$README"
echo "readme-overhead: README.md overhead table updated from $TABLE"

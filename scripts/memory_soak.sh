#!/usr/bin/env bash
# memory_soak.sh: does kwatch's memory stay bounded over a long session? Runs kwatch on the
# tests/targets/soak_writer fixture (THREADS threads writing and reading the fields of g_soak
# from several source lines and calling soak_tick() in a loop, as fast as they can), records
# the session with -o, and samples kwatch's memory every INTERVAL seconds into a CSV.
#
# usage: scripts/memory_soak.sh [options]
#   --mode watch|probe   watch: kwatch --backend page --rw g_soak (page-protection watch: every
#                        access to g_soak's page is an event; the mode that delivers events on
#                        machines whose hypervisor drops debug-register traps)
#                        probe: kwatch probe --backend ptrace 'soak_tick i' (INT3 probe, one
#                        hit per call)                                        (default: watch)
#   --seconds N          session length                                      (default: 3600)
#   --interval S         seconds between samples                             (default: 10)
#   --threads T          soak_writer worker threads                          (default: 4)
#   --churn MS           soak_writer replaces one worker thread every MS ms  (default: off)
#   --build DIR          build directory holding kwatch and tests/targets/   (default: build)
#   --out DIR            where the CSV, the recording and the log go         (default: .)
#   --backend B          override the backend (watch: page|perf|stop|auto; probe: ptrace|uprobe)
#
# Build first: `ninja -C DIR kwatch target_soak_writer`. Run as root (ptrace, perf). Example,
# the one-hour figure of the README:
#   nice -n 5 scripts/memory_soak.sh --mode watch --seconds 3600 --build /tmp/kwb --out /tmp/soak
#
# Output: DIR/soak-MODE.csv with one row per sample:
#   t_s,vmrss_kb,vmhwm_kb,vmsize_kb,recording_bytes,wal_bytes,kwatch_cpu_s
# (recording_bytes: the .kwdb file; wal_bytes: its -wal file while recording), DIR/soak-MODE.kwdb
# (the recording), DIR/soak-MODE.log (kwatch's summary and messages). At the end it prints the
# events recorded, events per second, peak RSS and RSS at 1, 10, 30 and 60 minutes.
# kwatch ends when soak_writer exits after N seconds; the target's line
# "iterations=... threads_started=..." is in the log.
set -euo pipefail

MODE=watch
SECONDS_TOTAL=3600
INTERVAL=10
THREADS=4
CHURN=0
BUILD=build
OUT=.
BACKEND=
while [ $# -gt 0 ]; do
  case "$1" in
    --mode) MODE=$2; shift 2 ;;
    --seconds) SECONDS_TOTAL=$2; shift 2 ;;
    --interval) INTERVAL=$2; shift 2 ;;
    --threads) THREADS=$2; shift 2 ;;
    --churn) CHURN=$2; shift 2 ;;
    --build) BUILD=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    --backend) BACKEND=$2; shift 2 ;;
    -h|--help) sed -n '2,30p' "$0"; exit 0 ;;
    *) echo "memory_soak: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done

KWATCH=$BUILD/cli/kwatch
[ -x "$KWATCH" ] || KWATCH=$BUILD/kwatch
TARGET=$BUILD/tests/targets/soak_writer
for f in "$KWATCH" "$TARGET"; do
  [ -x "$f" ] || { echo "memory_soak: $f is missing: ninja -C $BUILD kwatch target_soak_writer" >&2; exit 1; }
done
mkdir -p "$OUT"
CSV=$OUT/soak-$MODE.csv
REC=$OUT/soak-$MODE.kwdb
LOG=$OUT/soak-$MODE.log
rm -f "$REC" "$REC-wal" "$REC-shm"

TARGET_ARGS=("$TARGET" "$THREADS" "$SECONDS_TOTAL")
if [ "$CHURN" != 0 ]; then
  TARGET_ARGS+=(--churn "$CHURN")
fi
case "$MODE" in
  watch)
    "$KWATCH" --backend "${BACKEND:-page}" --rw g_soak -q -o "$REC" -- "${TARGET_ARGS[@]}" \
      >"$LOG" 2>&1 &
    ;;
  probe)
    "$KWATCH" probe --backend "${BACKEND:-ptrace}" -q -o "$REC" 'soak_tick i' \
      -- "${TARGET_ARGS[@]}" >"$LOG" 2>&1 &
    ;;
  *) echo "memory_soak: --mode watch or probe" >&2; exit 2 ;;
esac
KW=$!
trap 'kill $KW 2>/dev/null || true' INT TERM

size_of() { stat -c %s "$1" 2>/dev/null || echo 0; }
status_kb() { awk -v k="$1:" '$1 == k { print $2 }' "/proc/$KW/status" 2>/dev/null || true; }
cpu_s() {
  # utime + stime (fields 14 and 15 of /proc/PID/stat, after the command in parentheses).
  local stat
  stat=$(cat "/proc/$KW/stat" 2>/dev/null) || return 0
  stat=${stat##*) }
  awk -v hz="$(getconf CLK_TCK)" '{ printf "%.2f", ($12 + $13) / hz }' <<<"$stat"
}

echo "t_s,vmrss_kb,vmhwm_kb,vmsize_kb,recording_bytes,wal_bytes,kwatch_cpu_s" >"$CSV"
START=$(date +%s.%N)
while kill -0 "$KW" 2>/dev/null; do
  rss=$(status_kb VmRSS); hwm=$(status_kb VmHWM); vsz=$(status_kb VmSize); cpu=$(cpu_s)
  [ -n "$rss" ] || break
  t=$(awk -v s="$START" -v n="$(date +%s.%N)" 'BEGIN { printf "%.0f", n - s }')
  echo "$t,$rss,$hwm,$vsz,$(size_of "$REC"),$(size_of "$REC-wal"),$cpu" >>"$CSV"
  sleep "$INTERVAL"
done
set +e
wait "$KW"
RC=$?
set -e
echo "memory_soak: kwatch exited with status $RC; log $LOG"

EVENTS=
if command -v sqlite3 >/dev/null && [ -s "$REC" ]; then
  if [ "$MODE" = watch ]; then
    EVENTS=$(sqlite3 -readonly "$REC" 'SELECT event_count FROM session' 2>/dev/null || true)
  else
    EVENTS=$(sqlite3 -readonly "$REC" 'SELECT hit_count FROM session' 2>/dev/null || true)
  fi
fi
awk -F, -v events="$EVENTS" -v total="$SECONDS_TOTAL" -v rec="$(size_of "$REC")" '
  NR == 1 { next }
  { last = $1; last_rss = $2; if ($3 > peak) peak = $3
    for (i = 1; i <= 4; ++i) if (!(i in at) && $1 >= mark[i]) { at[i] = $2 } }
  BEGIN { mark[1] = 60; mark[2] = 600; mark[3] = 1800; mark[4] = 3600
          name[1] = "1 min"; name[2] = "10 min"; name[3] = "30 min"; name[4] = "60 min" }
  END {
    printf "memory_soak: %s s sampled; peak RSS (VmHWM) %.1f MiB\n", last, peak / 1024
    for (i = 1; i <= 4; ++i) if (i in at) printf "memory_soak: RSS at %s: %.1f MiB\n", name[i], at[i] / 1024
    printf "memory_soak: RSS at the last sample (%s s): %.1f MiB\n", last, last_rss / 1024
    if (events != "") printf "memory_soak: %d events recorded, %.0f events/s\n", events, events / total
    printf "memory_soak: recording %.1f MiB\n", rec / 1048576
  }' "$CSV"
exit "$RC"

#!/usr/bin/env bash
# Probe and watchpoint overhead of kwatch next to gdb, perf and bpftrace, on the same target
# programs in the same run.
#
#   bench/compare/compare.sh [BUILD_DIR] [OUT_DIR]
#
# Code probes: tests/targets/uprobe_loop N calls tick() N times; every tool puts one probe on
# tick. Watchpoints: tests/targets/field_writer 1 N writes g_stats.hits N times (and other
# fields of the same struct); every tool watches g_stats.hits for writes. perf mem: and
# bpftrace watchpoint: need an absolute address: they run with ASLR off (setarch -R around
# the tool, so that the tool attaches to the program itself, not to setarch, whose own PIE
# data sits at the same address), as gdb runs its programs.
#
# Every run is a pair: the program at N/4 and at N hits. The cost per hit is the slope
# (t(N) - t(N/4)) / (N - N/4), so a tool's start-up and the program's own work cancel out;
# the bare program's slope is subtracted. RUNS pairs per tool (default 5): median, min, max.
# Each run's hit count is checked against what the program did; a tool that counted something
# else is shown with what it counted and why, never with a cost. Writes OUT_DIR/compare.md
# (the table) and OUT_DIR/compare.tsv (every run); REUSE_TSV=1 remakes the table from it.
#
# kwatch's agent backend (probes run inside the program by libkwatch-agent.so): each agent
# row checks the path the summary names for the probe ("path": jump or int3); a run placed on
# another path is recorded under its own label saying so. Its cost per hit is, as for every
# tool here, the whole run's: the hit in the program and kwatch draining and counting its
# record (the hit alone: bench/agent_bench). A thread's ring holds 1 MiB of records
# (watch/probe/agent_session.cc: about 18,700 of tick's), drained every 10 ms: uprobe_loop's tight
# loop on the jump path fills it long before, the records beyond are lost (counted in the
# summary's "lost"), and the row says so rather than show a cost for hits kwatch never read.
# The floor under the in-process INT3 path is bench/compare/int3_floor.c: uprobe_loop's loop
# with an int3 per tick() into an empty SIGTRAP handler, no tracer.
#
# Environment: RUNS, NPROBE, NWATCH (sizes above); REUSE_TSV=1; ROWS=REGEX runs only
# the rows whose "MECHANISM TOOL" (probe or watch, then the tool column) matches the extended
# regex (grep -E), e.g. ROWS='agent|floor|ptrace INT3|uprobe'; the bare programs always run.
# A ROWS run writes OUT_DIR/compare-rows.md and compare-rows.tsv and leaves compare.md (the
# README's table, scripts/readme-overhead.sh) and compare.tsv alone.
set -uo pipefail

BUILD=${1:-build/default}
OUT=${2:-bench/results}
RUNS=${RUNS:-5}
NPROBE=${NPROBE:-20000}
NWATCH=${NWATCH:-20000}
ROWS=${ROWS:-}
KWATCH=$(realpath "$BUILD/cli/kwatch")
LOOP=$(realpath "$BUILD/tests/targets/uprobe_loop")
WRITER=$(realpath "$BUILD/tests/targets/field_writer")
mkdir -p "$OUT"
WORK=$(mktemp -d /tmp/kwatch-compare.XXXXXX)
trap 'rm -rf "$WORK"' EXIT

log() { printf 'compare: %s\n' "$*" >&2; }

# --- peers: install what is missing (Debian packages) ---------------------------------------
need=()
command -v gdb >/dev/null || need+=(gdb)
command -v perf >/dev/null || need+=(linux-perf)
command -v bpftrace >/dev/null || need+=(bpftrace)
if [ ${#need[@]} -gt 0 ]; then
  log "installing ${need[*]}"
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO=sudo
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}" >"$WORK/apt.log" 2>&1 ||
    { $SUDO apt-get update -qq >/dev/null 2>&1 &&
      $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}" >"$WORK/apt.log" 2>&1; } ||
    log "could not install ${need[*]}: the table says so"
fi
# perf probe and bpftrace's uprobes want tracefs.
if [ ! -e /sys/kernel/tracing/uprobe_events ]; then
  mount -t tracefs nodev /sys/kernel/tracing >/dev/null 2>&1 || true
fi

SETARCH=(/usr/bin/setarch "$(uname -m)" -R)
# g_stats.hits (offset 0 of g_stats) with ASLR off: the PIE base is 0x555555554000.
GSTATS_OFF=$(nm "$WRITER" | awk '$3 == "g_stats" {print $1}')
WADDR=$(printf '0x%x' $((0x555555554000 + 0x$GSTATS_OFF)))

# --- measuring ------------------------------------------------------------------------------
now() { date +%s%N; }
TSV="$OUT/compare.tsv"
MD="$OUT/compare.md"
if [ -n "$ROWS" ]; then
  TSV="$OUT/compare-rows.tsv"
  MD="$OUT/compare-rows.md"
fi
# REUSE_TSV=1: only remake the table from an earlier run's compare.tsv.
if [ -n "${REUSE_TSV:-}" ] && [ -s "$TSV" ]; then
  log "reusing $TSV (REUSE_TSV): the table only"
else
printf 'mechanism\ttool\trun\tn\twall_ns\thits\n' >"$TSV"

# run_tool MECH TOOL COUNT_FN CMD... : CMD with @N@ standing for the number of hits; COUNT_FN
# prints the hit count read from $WORK/out (stdout and stderr of the run), knowing $N.
# PATH_WANT=P before the call: the kwatch summary must name path P for the probe; a run on
# another path is recorded under "TOOL [placed on PATH, not P: REASON]".
run_tool() {
  local mech=$1 tool=$2 count_fn=$3
  shift 3
  if [ -n "$ROWS" ] && [ "$tool" != "(none)" ] && ! grep -qE -- "$ROWS" <<<"$mech $tool"; then
    return 0
  fi
  log "$mech: $tool"
  local full=$NPROBE
  [ "$mech" = watch ] && full=$NWATCH
  local r a s e hits label path
  for r in $(seq 1 "$RUNS"); do
    for N in $((full / 4)) "$full"; do
      local args=()
      for a in "$@"; do args+=("${a//@N@/$N}"); done
      s=$(now)
      "${args[@]}" >"$WORK/out" 2>&1 </dev/null
      e=$(now)
      hits=$($count_fn)
      label=$tool
      if [ -n "${PATH_WANT:-}" ]; then
        path=$(kwatch_probe_field path)
        if [ "$path" != "$PATH_WANT" ]; then
          label="$tool [placed on ${path:-no path}, not $PATH_WANT: $(kwatch_probe_field path_reason)]"
        fi
      fi
      printf '%s\t%s\t%d\t%d\t%d\t%s\n' "$mech" "$label" "$r" "$N" $((e - s)) "${hits:-0}" >>"$TSV"
      cp "$WORK/out" "$WORK/last-$(echo "$mech-$tool" | tr -c 'a-zA-Z0-9' '_').txt"
    done
  done
}

# The bare programs' own proof that they ran: uprobe_loop's sum of 3i + 100 over i < N,
# field_writer's count of its writes.
count_sum_ok() { grep -q "^sum=$((3 * N * (N - 1) / 2 + 100 * N))$" "$WORK/out" && echo "$N"; }
count_writer_ok() { grep -q "\"hits_w\":$N," "$WORK/out" && echo "$N"; }
count_gdb() { grep -oE 'already hit [0-9]+ time' "$WORK/out" | awk '{print $3}' | tail -n 1; }
# gdb's `watch` reports a store only when it changes the value (every store still traps):
# field_writer's first store writes 0 over 0, so its N stores show as N-1 hits.
count_gdb_watch() {
  local n
  n=$(count_gdb)
  if [ "$n" = $((N - 1)) ]; then echo "$N"; else echo "$n"; fi
}
count_dprintf() { grep -c '^tick ' "$WORK/out"; }
count_perf_stat() { awk -F, '/probe_uprobe_loop:tick/ {print $1}' "$WORK/out" | head -n 1; }
count_perf_stat_mem() { awk -F, '/mem:/ {print $1}' "$WORK/out" | head -n 1; }
count_perf_record() { grep -oE '\(([0-9]+) samples\)' "$WORK/out" | tr -dc '0-9'; }
count_bpftrace() { grep -oE '^@c: [0-9]+' "$WORK/out" | awk '{print $2}'; }
count_floor() { grep -oE '^hits=[0-9]+' "$WORK/out" | cut -d= -f2; }
# int3_floor: uprobe_loop's sum (the loop ran) and its handler's count of the traps.
count_int3_floor() { [ "$(count_sum_ok)" = "$N" ] && count_floor; }
count_kwatch_probe() { grep '"type":"summary"' "$WORK/out" | grep -oE '"hits":[0-9]+' | head -n 1 | cut -d: -f2; }
# A string field of the first probe in kwatch probe's JSON summary ("path", "path_reason").
kwatch_probe_field() {
  grep '"type":"summary"' "$WORK/out" | grep -oE "\"$1\":\"[^\"]*\"" | head -n 1 | cut -d'"' -f4
}
count_kwatch_watch() { grep '"type":"summary"' "$WORK/out" | grep -oE '"events":[0-9]+' | head -n 1 | cut -d: -f2; }

# --- code probes on tick --------------------------------------------------------------------
log "code probes: uprobe_loop $((NPROBE / 4)) and $NPROBE, $RUNS runs each"
run_tool probe "(none)" count_sum_ok "$LOOP" @N@

printf '%s\n' "set pagination off" "set confirm off" "break tick" "commands" "silent" "continue" \
  "end" "run" "info breakpoints" >"$WORK/gdb-break.gdb"
run_tool probe "gdb break + silent continue" count_gdb gdb -batch -nx -x "$WORK/gdb-break.gdb" --args "$LOOP" @N@

printf '%s\n' "set pagination off" "set confirm off" 'dprintf tick,"tick %ld\n", i' "run" \
  >"$WORK/gdb-dprintf.gdb"
run_tool probe "gdb dprintf" count_dprintf gdb -batch -nx -x "$WORK/gdb-dprintf.gdb" --args "$LOOP" @N@

perf probe -q -d 'probe_uprobe_loop:*' >/dev/null 2>&1
if perf probe -q -x "$LOOP" tick >"$WORK/perf-probe.txt" 2>&1; then
  run_tool probe "perf probe + perf stat" count_perf_stat perf stat -x, -e probe_uprobe_loop:tick -- "$LOOP" @N@
  run_tool probe "perf probe + perf record" count_perf_record perf record -o "$WORK/perf.data" -e probe_uprobe_loop:tick -- "$LOOP" @N@
  perf probe -q -d 'probe_uprobe_loop:*' >/dev/null 2>&1
else
  PERF_PROBE_ERROR=$(head -n 1 "$WORK/perf-probe.txt")
  run_tool probe "perf probe + perf stat" count_perf_stat false
fi

run_tool probe "bpftrace uprobe count()" count_bpftrace bpftrace -e "uprobe:$LOOP:tick { @c = count(); }" -c "$LOOP @N@"
# The floor under every ptrace tool here: a 100-line tracer that emulates tick's first
# instruction and does nothing else (bench/compare/ptrace_floor.c).
TICK_OFF=$(nm "$LOOP" | awk '$3 == "tick" {print $1}')
if cc -O2 -o "$WORK/ptrace_floor" "$(dirname "$0")/ptrace_floor.c" 2>"$WORK/floor-cc.txt"; then
  run_tool probe "minimal ptrace tracer (emulates; the floor)" count_floor "$WORK/ptrace_floor" "0x$TICK_OFF" "$LOOP" @N@
else
  run_tool probe "minimal ptrace tracer (emulates; the floor)" count_floor false
fi
run_tool probe "kwatch probe (ptrace INT3)" count_kwatch_probe "$KWATCH" probe -q --json --backend ptrace tick -- "$LOOP" @N@
run_tool probe "kwatch probe (uprobe PMU)" count_kwatch_probe "$KWATCH" probe -q --json --backend uprobe tick -- "$LOOP" @N@
run_tool probe "kwatch probe --hw (debug register)" count_kwatch_probe "$KWATCH" probe -q --json --hw tick -- "$LOOP" @N@

# kwatch's agent backend: the probe runs in the program (libkwatch-agent.so), no tracer while
# it runs; through a jump to a trampoline, or the agent's own SIGTRAP handler (--no-jump),
# whose floor is an int3 into an empty SIGTRAP handler, no agent (bench/compare/int3_floor.c).
PATH_WANT=jump run_tool probe "kwatch probe --backend agent (jump)" count_kwatch_probe \
  "$KWATCH" probe -q --json --backend agent tick -- "$LOOP" @N@
PATH_WANT=int3 run_tool probe "kwatch probe --backend agent --no-jump (in-process INT3)" count_kwatch_probe \
  "$KWATCH" probe -q --json --backend agent --no-jump tick -- "$LOOP" @N@
if cc -O2 -o "$WORK/int3_floor" "$(dirname "$0")/int3_floor.c" 2>"$WORK/int3-floor-cc.txt"; then
  run_tool probe "int3 into an empty SIGTRAP handler (in-process; the floor)" count_int3_floor "$WORK/int3_floor" @N@
else
  run_tool probe "int3 into an empty SIGTRAP handler (in-process; the floor)" count_int3_floor false
fi

# --- watchpoints on g_stats.hits ------------------------------------------------------------
log "watchpoints: field_writer 1 $((NWATCH / 4)) and $NWATCH (g_stats.hits at $WADDR with ASLR off), $RUNS runs each"
run_tool watch "(none)" count_writer_ok "$WRITER" 1 @N@

printf '%s\n' "set pagination off" "set confirm off" "set can-use-hw-watchpoints 1" "break main" \
  "run" "watch g_stats.hits" "commands" "silent" "continue" "end" "continue" "info watchpoints" \
  >"$WORK/gdb-watch.gdb"
run_tool watch "gdb watch (hardware)" count_gdb_watch gdb -batch -nx -x "$WORK/gdb-watch.gdb" --args "$WRITER" 1 @N@
run_tool watch "perf stat -e mem:ADDR:w:u" count_perf_stat_mem "${SETARCH[@]}" perf stat -x, -e "mem:$WADDR:w:u" -- "$WRITER" 1 @N@
run_tool watch "perf record -e mem:ADDR:w:u" count_perf_record "${SETARCH[@]}" perf record -o "$WORK/perf-mem.data" -e "mem:$WADDR:w:u" -- "$WRITER" 1 @N@
run_tool watch "bpftrace watchpoint:ADDR:8:w" count_bpftrace "${SETARCH[@]}" bpftrace -e "watchpoint:$WADDR:8:w { @c = count(); }" -c "$WRITER 1 @N@"
run_tool watch "kwatch --backend perf (stream)" count_kwatch_watch "$KWATCH" -q --json --backend perf --write g_stats.hits -- "$WRITER" 1 @N@
run_tool watch "kwatch --stop (ptrace debug registers)" count_kwatch_watch "$KWATCH" -q --json --stop --write g_stats.hits -- "$WRITER" 1 @N@
run_tool watch "kwatch --backend page" count_kwatch_watch "$KWATCH" -q --json --backend page --write g_stats.hits -- "$WRITER" 1 @N@

fi  # measuring

# --- the table ------------------------------------------------------------------------------
# Per tool: the slope of each run pair, then median, min, max; the hits must equal N in every
# run. Only complete pairs count (a kwatch run on another path than its row's is recorded
# under another label, which can split a pair). Output: mech, tool, median, min, max,
# counted, expected, ok.
awk -F'\t' '
  NR == 1 { next }
  {
    key = $1 "\t" $2
    if (!(key in seen)) { seen[key] = 1; keys[++k] = key }
    if ($3 > maxrun[key]) maxrun[key] = $3
    t[key, $3, $4] = $5
    if ($4 > full[key]) full[key] = $4
    if ($6 != $4 && !(key in bad)) { bad[key] = 1; got[key] = $6; want[key] = $4 }
  }
  END {
    for (i = 1; i <= k; i++) {
      key = keys[i]; f = full[key]; q = int(f / 4)
      split(key, p, "\t")
      if (key in bad) { print p[1] "\t" p[2] "\t-\t-\t-\t" got[key] "\t" want[key] "\t0"; continue }
      m = 0
      for (j = 1; j <= maxrun[key]; j++)
        if (((key, j, f) in t) && ((key, j, q) in t)) a[++m] = (t[key, j, f] - t[key, j, q]) / (f - q)
      if (m == 0) { print p[1] "\t" p[2] "\t-\t-\t-\tunpaired\t" f "\t0"; continue }
      for (x = 1; x <= m; x++) for (y = x + 1; y <= m; y++) if (a[y] < a[x]) { tmp = a[x]; a[x] = a[y]; a[y] = tmp }
      med = (m % 2) ? a[(m + 1) / 2] : (a[m / 2] + a[m / 2 + 1]) / 2
      print p[1] "\t" p[2] "\t" med "\t" a[1] "\t" a[m] "\t" f "\t" f "\t1"
    }
  }' "$TSV" >"$WORK/stats"

base_of() { awk -F'\t' -v mech="$1" '$1 == mech && $2 == "(none)" {print $3}' "$WORK/stats"; }
# kwatch's reference per mechanism: its fastest backend that counted every hit and whose cost
# is measurable (no slope below the bare program's).
ref_of() {
  awk -F'\t' -v mech="$1" -v base="$2" '
    $1 == mech && $2 ~ /^kwatch/ && $8 == 1 && $4 - base >= 0 { c = $3 - base; if (best == "" || c < best) best = c }
    END { print best }' "$WORK/stats"
}
base_probe=$(base_of probe)
base_watch=$(base_of watch)
ref_probe=$(ref_of probe "$base_probe")
ref_watch=$(ref_of watch "$base_watch")

traps_delivered() { [ "$(cut -f2- <<<"$(grep -P '^watch\t(kwatch --backend perf|gdb watch)' "$WORK/stats")" | awk -F'\t' '$7 == 1' | wc -l)" -gt 0 ]; }

why() {  # MECH TOOL COUNTED: one line on why a tool counted something else
  local last lost
  last="$WORK/last-$(echo "$1-${2%% \[placed on *}" | tr -c 'a-zA-Z0-9' '_').txt"
  case "$1|$2" in
    probe\|kwatch*)
      lost=$(grep -s '"type":"summary"' "$last" | grep -oE '"lost":[0-9]+' | head -n 1 | cut -d: -f2)
      if [ "${lost:-0}" -gt 0 ]; then
        echo "kwatch's summary counts $lost records lost (a full ring: its hits are the records it read), last run"
      else
        echo "see compare.tsv and the tool's output"
      fi ;;
    watch\|bpftrace*)
      echo "bpftrace 0.17 opens its watchpoint on the main thread only (bpftrace issue #826, fixed in later releases); field_writer stores from a worker thread" ;;
    watch\|*)
      if [ "$3" = 0 ] && ! traps_delivered; then
        echo "no debug-register trap was delivered: this machine's hypervisor accepts hardware breakpoints but never raises their traps"
      else
        echo "see compare.tsv and the tool's output"
      fi ;;
    probe\|perf*) echo "perf probe failed: ${PERF_PROBE_ERROR:-see compare.tsv}" ;;
    *) echo "see compare.tsv and the tool's output" ;;
  esac
}

{
  echo "| mechanism | tool | ns per hit (median) | min | max | hits counted / expected | ratio to kwatch |"
  echo "|---|---|---:|---:|---:|---:|---:|"
  while IFS=$'\t' read -r mech tool med lo hi counted expect ok; do
    base=$base_probe refc=$ref_probe mname="code probe on tick()"
    if [ "$mech" = watch ]; then base=$base_watch refc=$ref_watch mname="write watchpoint on g_stats.hits"; fi
    if [ "$tool" = "(none)" ]; then
      printf '| %s | none (the bare program: %.0f ns per iteration) | - | - | - | %s / %s | - |\n' \
        "$mname" "$med" "$counted" "$expect"
    elif [ "$counted" = unpaired ]; then
      printf '| %s | %s | cannot measure here: no run has both sizes under this label (the probe'"'"'s path changed between them) | - | - | - | - |\n' \
        "$mname" "$tool"
    elif [ "$ok" != 1 ]; then
      printf '| %s | %s | cannot measure here: counted %s of %s hits; %s | - | - | %s / %s | - |\n' \
        "$mname" "$tool" "$counted" "$expect" "$(why "$mech" "$tool" "$counted")" "$counted" "$expect"
    else
      awk -v mname="$mname" -v tool="$tool" -v med="$med" -v lo="$lo" -v hi="$hi" -v base="$base" \
        -v n="$expect" -v refc="$refc" 'BEGIN {
        if (lo - base < 0) {
          # A negative slope: the tool'"'"'s own fixed run time varies more than the hits cost
          # (perf record spends about a second of its own, partly while the program runs).
          printf "| %s | %s | not measurable by wall time here: its own run time varies more than the hits cost (slopes from %.0f to %.0f ns per hit) | - | - | %d / %d | - |\n", mname, tool, lo - base, hi - base, n, n
          exit
        }
        r = (refc != "" && refc > 0) ? sprintf("%.2fx", (med - base) / refc) : "-"
        printf "| %s | %s | %.0f | %.0f | %.0f | %d / %d | %s |\n", mname, tool, med - base, lo - base, hi - base, n, n, r }'
    fi
  done <"$WORK/stats"
} >"$WORK/table"

{
  if [ -n "${REUSE_TSV:-}" ]; then
    echo "Measured on $(uname -n) (table remade $(date -u '+%Y-%m-%d %H:%M UTC') from $(basename "$TSV"), modified $(date -u -r "$TSV" '+%H:%M UTC')): $(nproc) CPUs ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')), kernel $(uname -r)."
  else
    echo "Measured $(date -u '+%Y-%m-%d %H:%M UTC') on $(uname -n): $(nproc) CPUs ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')), kernel $(uname -r), load average $(cut -d' ' -f1-3 /proc/loadavg)."
  fi
  echo "$RUNS run pairs per tool. Code probes: \`uprobe_loop N\` (one probe on tick(), hit N times); watchpoints: \`field_writer 1 N\` (g_stats.hits written N times); N = $((NPROBE / 4)) and $NPROBE, $((NWATCH / 4)) and $NWATCH."
  echo "Cost per hit: slope of wall time over hits between the two sizes (start-up cancels out) minus the bare program's slope. Ratio: to kwatch's fastest backend that counted every hit."
  if [ -n "$ROWS" ]; then
    echo "Partial run: only the rows matching ROWS='$ROWS' (and the bare programs); the full table is compare.md."
  fi
  echo
  cat "$WORK/table"
  echo
  # The in-process INT3 path against its floor (issue 16: at most 1.3x), both less the bare slope.
  awk -F'\t' -v base="$base_probe" '
    $1 == "probe" && $8 == 1 && $2 == "kwatch probe --backend agent --no-jump (in-process INT3)" { a = $3 - base }
    $1 == "probe" && $8 == 1 && $2 ~ /^int3 into an empty SIGTRAP handler/ { f = $3 - base }
    END { if (a != "" && f > 0) printf "In-process INT3 probe / its floor (medians): %.2fx.\n\n", a / f }' "$WORK/stats"
  echo "Versions: $(gdb --version | head -n 1); $(perf --version 2>/dev/null); bpftrace $(bpftrace --version 2>/dev/null | awk '{print $2}'); $("$KWATCH" --version 2>/dev/null)."
  echo "Reproduce: \`make bench\` (or \`bench/compare/compare.sh BUILD_DIR\`); every run is in \`bench/results/$(basename "$TSV")\`."
} >"$MD"
cat "$MD"

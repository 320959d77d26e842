#!/usr/bin/env bash
# Runs kwatch's libFuzzer targets (fuzz/). Usage: fuzz/run.sh BUILD_DIR SECONDS [TARGET...]
#   BUILD_DIR  a build configured with -DKWATCH_FUZZ=ON (cmake --preset fuzz: build/fuzz)
#   SECONDS    fuzzing time per target
#   TARGET     expr probe_spec args_json trace_reader trace_sql elf kallsyms btf condition kcore
#              (default: all)
# Each target first replays fuzz/regressions/TARGET/ and fuzz/known/TARGET/ (inputs that once
# crashed), then fuzzes from the committed seeds fuzz/corpus/TARGET/ plus a working corpus kept
# in BUILD_DIR/fuzz-corpus/TARGET/ (the repository is never written). A crash, leak or sanitizer
# report stops the run with a failure; its input is saved under BUILD_DIR/fuzz-artifacts/.
# Prints one line per target: executions, executions per second, coverage (edges) and features.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ $# -lt 2 ]; then
  echo "usage: $0 BUILD_DIR SECONDS [TARGET...]" >&2
  exit 2
fi
build=$1
seconds=$2
shift 2
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  targets=(expr probe_spec args_json trace_reader trace_sql elf kallsyms btf condition kcore)
fi

# Largest input per target: the seeds' size plus room to grow (ELF and SQLite seeds are
# kilobytes; text parsers need little).
max_len() {
  case $1 in
    elf) echo 32768 ;;
    trace_reader) echo 16384 ;;
    btf | kallsyms | kcore) echo 8192 ;;
    *) echo 4096 ;;
  esac
}

# trace_reader writes each input to a file: keep those in memory when possible.
if [ -z "${TMPDIR:-}" ] && [ -d /dev/shm ] && [ -w /dev/shm ]; then
  export TMPDIR=/dev/shm
fi

artifacts=$build/fuzz-artifacts
mkdir -p "$artifacts"
status=0
for t in "${targets[@]}"; do
  bin=$build/fuzz/fuzz_$t
  if [ ! -x "$bin" ]; then
    echo "fuzz: $bin is missing: build it first (cmake --build --preset fuzz)" >&2
    exit 1
  fi
  log=$build/fuzz-$t.log
  replay=()
  for d in "fuzz/regressions/$t" "fuzz/known/$t"; do
    if [ -d "$d" ]; then
      replay+=("$d"/*)
    fi
  done
  if [ ${#replay[@]} -gt 0 ]; then
    if ! "$bin" -runs=1 "${replay[@]}" >"$log" 2>&1; then
      echo "fuzz: $t: a regression input crashes again (log: $log)" >&2
      tail -n 40 "$log" >&2
      status=1
      continue
    fi
  fi
  work=$build/fuzz-corpus/$t
  mkdir -p "$work"
  dict=()
  if [ -f "fuzz/$t.dict" ]; then
    dict=(-dict="fuzz/$t.dict")
  fi
  # -timeout: one input taking this long is a hang, reported as a failure.
  if ! "$bin" "${dict[@]}" -max_total_time="$seconds" -max_len="$(max_len "$t")" -timeout=25 \
      -rss_limit_mb=4096 -print_final_stats=1 -artifact_prefix="$artifacts/$t-" \
      "$work" "fuzz/corpus/$t" >"$log" 2>&1; then
    echo "fuzz: $t FAILED (log: $log; input saved under $artifacts/)" >&2
    grep -E 'ERROR|SUMMARY|runtime error|Test unit written' "$log" | head -n 20 >&2 || true
    status=1
    continue
  fi
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log")
  cov=$(grep -E '^#[0-9]+' "$log" | tail -n 1 | sed -E 's/.* cov: ([0-9]+) ft: ([0-9]+).*/\1 edges, \2 features/')
  printf 'fuzz: %-13s %4ss  %9s execs  %6s exec/s  %s\n' "$t" "$seconds" "$execs" "$rate" "$cov"
done
exit $status

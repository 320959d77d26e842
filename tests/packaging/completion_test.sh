#!/usr/bin/env bash
# The generated shell completions (scripts/cli_docs.py) complete what --help defines.
#   completion_test.sh KWATCH_BIN COMPLETIONS_DIR [KWATCH_GUI_BIN]
# bash: runs the completion functions on a few command lines and compares the candidates
# exactly, then checks that `-` completes every option of each command's --help. zsh: the
# file parses (zsh -n) and names every option of each --help.
set -euo pipefail
kwatch=$1
dir=$2
gui=${3:-}
fails=0
# shellcheck source=/dev/null
. "$dir/kwatch.bash"

complete_line() {  # WORD...: the candidates for the last word, sorted, one line
  COMP_WORDS=("$@")
  COMP_CWORD=$((${#COMP_WORDS[@]} - 1))
  COMPREPLY=()
  if [ "$1" == kwatch-gui ]; then _kwatch_gui; else _kwatch; fi
  printf '%s\n' "${COMPREPLY[@]}" | sort | tr '\n' ' ' | sed 's/ $//'
}

expect() {  # WANT WORD...
  local want=$1 got
  shift
  got=$(complete_line "$@")
  if [ "$got" != "$want" ]; then
    echo "FAIL: '$*' completes to '$got', want '$want'"
    fails=1
  fi
}

expect "--backend" kwatch --ba
expect "auto page perf stop" kwatch --backend ""
expect "page perf" kwatch --backend = p
expect "1 2 4 8" kwatch --len ""
expect "agent auto" kwatch probe --backend a
expect "--no-jump" kwatch probe --n
expect "gdbserver probe report slots" kwatch ""
expect "slots" kwatch sl
expect "--field --format --from" kwatch report --f
expect "chrome-trace csv folded json text" kwatch report --format ""
expect "--help --json --pid -h -p" kwatch slots -
expect "--overcommit" kwatch -p 1 --overc
expect "fail multiplex pages" kwatch --write x --overcommit ""
expect "" kwatch --count ""
if [ -n "$gui" ]; then
  expect "--export-png --export-svg" kwatch-gui --ex
fi

# Every option of every --help, offered for `-`.
help_options() {  # the option names of a --help on stdin
  sed -n '/^Options:/,/^$/p' | grep -E '^  -' |
    sed -E 's/^ +//; s/ Excludes:.*//; s/  .*//; s/, /,/g; s/[ =<].*//' | tr ',' '\n' | sort
}
check_all() {  # NAME HELP_COMMAND... -- COMPLETION WORDS...
  local name=$1 help=() words=()
  shift
  while [ "$1" != -- ]; do
    help+=("$1")
    shift
  done
  shift
  words=("$@")
  local want got
  want=$(QT_QPA_PLATFORM=offscreen "${help[@]}" --help 2>/dev/null | help_options | tr '\n' ' ')
  got=$(complete_line "${words[@]}" - | tr ' ' '\n' | sort | tr '\n' ' ')
  if [ "$want" != "$got" ] || [ "$(wc -w <<<"$want")" -lt 3 ]; then
    echo "FAIL: $name: '-' completes to '$got'; --help has '$want'"
    fails=1
  fi
  local o
  for o in $want; do
    if ! grep -qF -- "$o" "$dir/_kwatch"; then
      echo "FAIL: $name: $o is not in the zsh completion"
      fails=1
    fi
  done
}
check_all kwatch "$kwatch" -- kwatch
check_all "kwatch probe" "$kwatch" probe -- kwatch probe
check_all "kwatch report" "$kwatch" report -- kwatch report
check_all "kwatch slots" "$kwatch" slots -- kwatch slots
check_all "kwatch gdbserver" "$kwatch" gdbserver -- kwatch gdbserver
if [ -n "$gui" ]; then
  check_all kwatch-gui "$gui" -- kwatch-gui
fi

if ! zsh -n "$dir/_kwatch"; then
  echo "FAIL: zsh -n $dir/_kwatch"
  fails=1
fi
if [ $fails -ne 0 ]; then
  exit 1
fi
echo "completion_test: ok"

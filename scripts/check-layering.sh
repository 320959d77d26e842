#!/usr/bin/env bash
# Rejects includes that point the wrong way (STYLE.md: drmgr -> core, watch -> drmgr, core;
# cli, gui -> everything above; nothing depends on cli/ or gui/; Qt only in gui/).
set -uo pipefail
cd "$(dirname "$0")/.."
fail=0
check() {  # folder, forbidden include prefixes (regex)
  local dir=$1 pattern=$2
  [ -d "$dir" ] || return 0
  local hits
  hits=$(grep -rnE "#include \"($pattern)/" "$dir" --include='*.h' --include='*.cc' || true)
  if [ -n "$hits" ]; then
    echo "layering: $dir/ must not include ($pattern)/:"
    echo "$hits"
    fail=1
  fi
}
check core 'drmgr|watch|cli|gui|bench|tests'
check drmgr 'watch|cli|gui|bench|tests'
check watch 'cli|gui|bench|tests'
check cli 'gui|bench|tests'
qt=$(grep -rnE '#include <Q' core drmgr watch cli bench --include='*.h' --include='*.cc' 2>/dev/null || true)
if [ -n "$qt" ]; then
  echo "layering: Qt appears only in gui/:"
  echo "$qt"
  fail=1
fi
[ $fail -eq 0 ] && echo "layering: ok"
exit $fail

#!/usr/bin/env bash
# Rejects includes that point the wrong way (STYLE.md: drmgr -> core, watch -> drmgr, core;
# cli, gui -> everything above; nothing depends on cli/ or gui/; Qt only in gui/), and the
# edges between core's subfolders (core/CMakeLists.txt: base <- ptrace, x86 <- symbols <- probe,
# store, kernel; core/event.h is shared by all); a folder's *_internal.h stays in it.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
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
check agent 'core|drmgr|watch|cli|gui|bench|tests'
check drmgr 'watch|cli|gui|bench|tests'
check watch 'cli|gui|bench|tests'
check cli 'gui|bench|tests'
check gui 'cli|bench|tests'
check version 'agent|core|drmgr|watch|cli|gui|bench|tests'
check core/base 'core/(ptrace|x86|symbols|probe|store|kernel)'
check core/ptrace 'core/(x86|symbols|probe|store|kernel)'
check core/x86 'core/(ptrace|symbols|probe|store|kernel)'
check core/symbols 'core/(ptrace|probe|store|kernel)'
check core/probe 'core/(store|kernel)'
check core/store 'core/(ptrace|x86|probe|kernel)'
check core/kernel 'core/(ptrace|probe|store)'
stray=$(find core -maxdepth 1 -name '*.cc' -o -maxdepth 1 -name '*.h' ! -name event.h)
if [ -n "$stray" ]; then
  echo "layering: core/ files belong in a subfolder (only core/event.h is shared):"
  echo "$stray"
  fail=1
fi
# The agent runs inside other programs: its own headers, libc, Linux UAPI and compiler
# headers only (docs/agent.md); nothing of the project's libraries, Abseil, Zydis, libdw, Qt.
agent_deps=$(grep -rnE '#include (<(absl|Zydis|elfutils|Q|sqlite|CLI|gtest|benchmark)|"[^a]|"a[^g])' agent \
  --include='*.h' --include='*.cc' 2>/dev/null || true)
if [ -n "$agent_deps" ]; then
  echo "layering: agent/ includes only agent/, libc, Linux and compiler headers:"
  echo "$agent_deps"
  fail=1
fi
# A folder's *_internal.h headers are its own: no other folder includes them.
while IFS= read -r h; do
  dir=$(dirname "$h")
  outside=$(grep -rn "#include \"$h\"" core drmgr watch cli gui bench fuzz tests \
              --include='*.h' --include='*.cc' | grep -v "^$dir/[^/]*:" || true)
  if [ -n "$outside" ]; then
    echo "layering: $h is private to $dir/:"
    echo "$outside"
    fail=1
  fi
done < <(find core drmgr watch cli gui -name '*_internal.h')
qt=$(grep -rnE '#include <Q' core drmgr watch cli bench --include='*.h' --include='*.cc' 2>/dev/null || true)
if [ -n "$qt" ]; then
  echo "layering: Qt appears only in gui/:"
  echo "$qt"
  fail=1
fi
[ $fail -eq 0 ] && echo "layering: ok"
exit $fail

#!/usr/bin/env bash
# kwatch installed with `cmake --install` works as it does from the build tree.
#   install_test.sh BUILD_DIR TARGETS_DIR
# Installs into a temporary prefix (and once more staged with DESTDIR), checks the exact list
# of installed files, then runs the installed kwatch: --version and --help as the build tree's,
# a watch on field_writer and an agent probe on agent_maps, with exact counts, the probe
# loading the installed lib/kwatch/libkwatch-agent.so.
set -euo pipefail
build=$1
targets=$2
tmp=$(mktemp -d /tmp/kwatch-install-test.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
fail() {
  echo "install_test: FAIL: $*" >&2
  exit 1
}

expected_files() {  # the installed files, relative to the prefix, sorted
  printf '%s\n' bin/kwatch lib/kwatch/libkwatch-agent.so \
    share/bash-completion/completions/kwatch share/man/man1/kwatch-gdbserver.1 \
    share/man/man1/kwatch-probe.1 \
    share/man/man1/kwatch-report.1 share/man/man1/kwatch-slots.1 share/man/man1/kwatch.1 \
    share/zsh/site-functions/_kwatch
  if [ -x "$build/gui/kwatch-gui" ]; then
    printf '%s\n' bin/kwatch-gui share/applications/kwatch-gui.desktop \
      share/bash-completion/completions/kwatch-gui share/man/man1/kwatch-gui.1
  fi
}

prefix=$tmp/prefix
cmake --install "$build" --prefix "$prefix" >"$tmp/install.log" || {
  cat "$tmp/install.log"
  fail "cmake --install --prefix"
}
diff <(expected_files | sort) <(cd "$prefix" && find . -type f | sed 's|^\./||' | sort) ||
  fail "installed files under --prefix differ from the expected list (above)"

DESTDIR=$tmp/stage cmake --install "$build" --prefix /usr >"$tmp/stage.log" ||
  fail "DESTDIR=... cmake --install --prefix /usr"
diff <(expected_files | sed 's|^|usr/|' | sort) \
  <(cd "$tmp/stage" && find . -type f | sed 's|^\./||' | sort) ||
  fail "installed files under DESTDIR differ from the expected list (above)"

kwatch=$prefix/bin/kwatch
for args in "--version" "--help" "probe --help" "report --help" "slots --help" \
  "gdbserver --help"; do
  # shellcheck disable=SC2086  # args are words
  [ "$("$kwatch" $args)" == "$("$build/cli/kwatch" $args)" ] ||
    fail "installed 'kwatch $args' prints other text than the build tree's"
done

summary() {  # the JSON summary line of kwatch's stdout ($1), one field ($2) of it
  python3 -c 'import json, sys
s = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{\"type\":\"summary\"")]
assert len(s) == 1, "one summary line, got %d" % len(s)
print(eval(sys.argv[2], {}, {"s": s[0]}))' "$1" "$2"
}

# A watch: 2 threads x 300 writes of g_stats.hits (auto: perf where debug traps are delivered,
# else page protection; both count every write).
"$kwatch" --write g_stats.hits -q --json -- "$targets/field_writer" 2 300 >"$tmp/watch.out" \
  2>"$tmp/watch.err" || {
  cat "$tmp/watch.err"
  fail "installed kwatch watch failed"
}
[ "$(summary "$tmp/watch.out" 's["events"]')" == 600 ] ||
  fail "watch: events $(summary "$tmp/watch.out" 's["events"]'), want 600"
[ "$(summary "$tmp/watch.out" 's["watches"][0]["writes"]')" == 600 ] ||
  fail "watch: writes of g_stats.hits, want 600"
[ "$(summary "$tmp/watch.out" 's["exit_code"]')" == 0 ] || fail "watch: target exit code"

# An agent probe: step() called 2500 times; the target lists the agent it had mapped.
"$kwatch" probe --backend agent -q --json step -- "$targets/agent_maps" 2500 \
  >"$tmp/probe.out" 2>"$tmp/probe.err" || {
  cat "$tmp/probe.err"
  fail "installed kwatch probe failed"
}
[ "$(summary "$tmp/probe.out" 's["backend"]')" == agent ] || fail "probe: backend, want agent"
[ "$(summary "$tmp/probe.out" 's["hits"]')" == 2500 ] ||
  fail "probe: hits $(summary "$tmp/probe.out" 's["hits"]'), want 2500"
[ "$(summary "$tmp/probe.out" 's["probes"][0]["hits"]')" == 2500 ] || fail "probe: step hits"
grep -q '^sum=6247500$' "$tmp/probe.out" || fail "probe: the target's sum is not 6247500"
agent=$(realpath "$prefix/lib/kwatch/libkwatch-agent.so")
mapped=$(awk '$6 ~ /libkwatch-agent\.so$/ {print $6}' "$tmp/probe.out" | sort -u)
[ "$mapped" == "$agent" ] ||
  fail "probe: the target mapped '$mapped', not the installed agent $agent"

echo "install_test: ok (prefix and DESTDIR trees as expected; watch 600 events, probe 2500 hits" \
  "through $agent)"

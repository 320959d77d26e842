#!/usr/bin/env bash
# --version names the release and the git commit (version/, cmake/git_version.cmake).
#   version_test.sh SOURCE_DIR KWATCH_BIN GENERATED_HEADER [KWATCH_GUI_BIN]
# 1. kwatch, kwatch probe and kwatch-gui print the text of the build's generated header, in
#    the documented shape.
# 2. version/ built in a scratch git repository (a copy of version/ and the script, with a
#    two-line program): the commit, ", dirty" for changed tracked and for untracked files, a
#    new commit picked up by a plain rebuild (no reconfigure) recompiling only version.cc,
#    the header left alone when nothing changed, and a copy outside git saying so.
set -euo pipefail
src=$1
kwatch=$2
header=$3
gui=${4:-}
tmp=$(mktemp -d /tmp/kwatch-version-test.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
fail() {
  echo "version_test: FAIL: $*" >&2
  exit 1
}

full=$(sed -n 's/^#define KWATCH_VERSION_FULL "\(.*\)"$/\1/p' "$header")
release=$(sed -n 's/^project(kwatch VERSION \([0-9.]*\) .*/\1/p' "$src/CMakeLists.txt")
shape="^$release \\((git [0-9a-f]{8}(, dirty)?|not built from a git checkout)\\)$"
[[ $full =~ $shape ]] || fail "the generated header says '$full'"
[ "$("$kwatch" --version)" == "kwatch $full" ] || fail "kwatch --version: $("$kwatch" --version)"
[ "$("$kwatch" probe --version)" == "kwatch $full" ] || fail "kwatch probe --version"
if [ -n "$gui" ]; then
  got=$(QT_QPA_PLATFORM=offscreen "$gui" --version 2>/dev/null)
  [ "$got" == "kwatch-gui $full" ] || fail "kwatch-gui --version: '$got'"
fi

# 2. The scratch project.
repo=$tmp/repo
mkdir -p "$repo/cmake"
cp -r "$src/version" "$repo/"
cp "$src/cmake/git_version.cmake" "$repo/cmake/"
cat >"$repo/CMakeLists.txt" <<'CMAKE'
cmake_minimum_required(VERSION 3.25)
project(kwatch VERSION 7.8.9 LANGUAGES CXX)
set(CMAKE_CXX_STANDARD 20)
function(kwatch_library name)
  cmake_parse_arguments(ARG "" "" "SOURCES;DEPS" ${ARGN})
  add_library(${name} STATIC ${ARG_SOURCES})
  target_include_directories(${name} PUBLIC ${PROJECT_SOURCE_DIR})
endfunction()
add_subdirectory(version)
add_executable(v main.cc)
target_link_libraries(v PRIVATE kwatch_version)
CMAKE
cat >"$repo/main.cc" <<'CC'
#include <cstdio>
#include "version/version.h"
int main() { std::puts(kwatch::version::Full().c_str()); }
CC
printf 'build/\n' >"$repo/.gitignore"
g() { git -C "$repo" -c user.name=t -c user.email=t@t "$@"; }
g init -q
g add -A
g commit -q -m one
b=$repo/build
cmake -S "$repo" -B "$b" -G Ninja >"$tmp/configure.log" || fail "configure (see $tmp)"
build() { cmake --build "$b" >"$tmp/build.log" 2>&1 || fail "build: $(cat "$tmp/build.log")"; }
short() { g rev-parse HEAD | cut -c1-8; }
build
[ "$("$b/v")" == "7.8.9 (git $(short))" ] || fail "first commit: '$("$b/v")'"
touch -d 2001-01-01 "$b/version/generated/version/build_version.h"
build
[ "$(stat -c %Y "$b/version/generated/version/build_version.h")" == \
  "$(date -d 2001-01-01 +%s)" ] || fail "the header was rewritten without a change"
grep -q 'version.cc.o' "$tmp/build.log" && fail "version.cc recompiled without a change"

echo '// an edit' >>"$repo/main.cc"
build
[ "$("$b/v")" == "7.8.9 (git $(short), dirty)" ] || fail "edited tracked file: '$("$b/v")'"
g commit -q -am two
build
[ "$("$b/v")" == "7.8.9 (git $(short))" ] || fail "second commit: '$("$b/v")'"
grep -q 'version.cc.o' "$tmp/build.log" || fail "a new commit did not recompile version.cc"
grep -q 'main.cc.o' "$tmp/build.log" && fail "a new commit recompiled main.cc"
touch "$repo/untracked.txt"
build
[ "$("$b/v")" == "7.8.9 (git $(short), dirty)" ] || fail "untracked file: '$("$b/v")'"

# Outside git: a plain copy, and a copy unpacked inside another repository.
for where in "$tmp/plain" "$repo/sub/unpacked"; do
  mkdir -p "$where"
  cp -r "$repo/version" "$repo/cmake" "$repo/CMakeLists.txt" "$repo/main.cc" "$where/"
  cmake -S "$where" -B "$where/build" -G Ninja >"$tmp/configure.log" || fail "configure $where"
  cmake --build "$where/build" >"$tmp/build.log" 2>&1 || fail "build $where"
  [ "$("$where/build/v")" == "7.8.9 (not built from a git checkout)" ] ||
    fail "$where: '$("$where/build/v")'"
done
echo "version_test: ok ('kwatch $full'; commit, dirty and outside-git cases rebuilt)"

#!/usr/bin/env bash
# Installs the Debian 12 packages kwatch needs to build, test and demo.
# Idempotent and non-interactive: only missing packages are installed.
set -euo pipefail

PACKAGES=(
  build-essential cmake ninja-build pkg-config git
  libdw-dev libelf-dev libabsl-dev libgtest-dev libgmock-dev libbenchmark-dev
  libzydis-dev libsqlite3-dev sqlite3 libzstd-dev libcli11-dev nlohmann-json3-dev libcairo2-dev
  libbpf-dev bpftool dwarves
  clang-14 clang libclang-rt-14-dev clang-format clang-tidy shellcheck python3 python3-jsonschema
  qt6-base-dev qt6-charts-dev qt6-svg-dev libqt6opengl6-dev fonts-dejavu-core
  man-db groff-base zsh dpkg-dev
  gdb
)

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#PACKAGES[@]} packages present"
  exit 0
fi

echo "install-deps: installing ${missing[*]}"
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  SUDO="sudo"
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"

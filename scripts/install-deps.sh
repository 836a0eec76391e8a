#!/usr/bin/env bash
# Installs the Debian packages strata needs to build, test and demo.
# Idempotent: quick when everything is present. Needs root (apt-get).
set -euo pipefail

PKGS=(
  build-essential cmake make pkg-config clang llvm
  libbpf-dev bpftool libelf-dev libdw-dev zlib1g-dev
  libsqlite3-dev sqlite3 libzstd-dev libprotobuf-dev protobuf-compiler
  libcpp-httplib-dev libssl-dev libgtest-dev libgmock-dev libcli11-dev nlohmann-json3-dev
  linux-perf bpftrace python3 python3-torch iproute2 procps
  zstd clickhouse-server clickhouse-client
)
# The web UI: built with node/npm, tested in headless chromium. A nodejs that bundles npm (NodeSource)
# needs no Debian npm, which would conflict with it.
PKGS+=(nodejs chromium)
if ! command -v npm >/dev/null 2>&1; then PKGS+=(npm); fi

missing=()
for p in "${PKGS[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
if ((${#missing[@]} == 0)); then
  exit 0
fi
if [[ $(id -u) != 0 ]]; then
  echo "install-deps: missing Debian packages: ${missing[*]}; run as root or install them with apt-get" >&2
  exit 2
fi
echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null

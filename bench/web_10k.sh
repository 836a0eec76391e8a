#!/usr/bin/env bash
# The web UI at 10,000 ranks: tests/web/e2e.mjs --10k opens a 10,000-rank synthetic store's job page in
# headless Chromium and checks that the straggler's heatmap row is marked without a click (the same
# checks web_e2e makes at 1,000 ranks). Minutes on a 2-core machine, hence here and not in `make test`.
# Usage: bash bench/web_10k.sh [BUILD_DIR]   (root; needs Debian's chromium and node)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=build
for a in "$@"; do [[ $a == --* ]] || BUILD=$a; done
BUILD=$(realpath "$BUILD")
export STRATA_BIN=$BUILD/bin STRATA_BUILD=$BUILD STRATA_SOURCE=$PWD
start=$(date +%s)
node tests/web/e2e.mjs --10k
echo "web_10k: ok in $(( $(date +%s) - start )) s"

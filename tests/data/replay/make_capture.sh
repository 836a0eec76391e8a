#!/bin/sh
# Regenerates the replay test's data (tests/unit/replay_test.cpp), as root (strata record loads BPF):
#   sim.cap            what `strata record --save-events` captured of a short 2-rank strata-sim job
#   sim.expected.txt   what that live run stored, dumped by strata-replay-dump (tests/unit/replay_dump.h)
# The capture is made with frame-pointer stacks only (STRATA_USER_STACK_MODE=0: replay does not
# read the targets' binaries, so it cannot unwind stack copies), 1 s windows, no cost budget (the
# agent's own CPU is not taped) and every layer (NVML, which replay leaves out, is absent here and
# not dumped).
# Usage: tests/data/replay/make_capture.sh [BUILD_DIR]   (BUILD_DIR defaults to ./build; it needs
# the targets strata, strata-sim and strata-replay-dump)
set -eu
B=$(cd "${1:-build}" && pwd)
HERE=$(cd "$(dirname "$0")" && pwd)
STEPS=${STRATA_REPLAY_STEPS:-20}  # a few seconds of the sim: several windows, a small file
TMP=$(mktemp -d /tmp/strata-capture-XXXXXX)
trap 'rm -rf "$TMP"' EXIT
[ "$(id -u)" = 0 ] || { echo "make_capture.sh: run as root (strata record loads BPF programs)" >&2; exit 2; }
STRATA_USER_STACK_MODE=0 "$B/bin/strata" record -o "$TMP/live.db" --save-events "$TMP/sim.cap" \
  --window 1 --budget 0 --layers cpu,offcpu,os,gpu,comm --node replay-node -- \
  "$B/bin/strata-sim" run --ranks 2 --steps "$STEPS" --seed 7 --quiet
"$B/tests/strata-replay-dump" "$TMP/live.db" > "$TMP/sim.expected.txt"
cp "$TMP/sim.cap" "$TMP/sim.expected.txt" "$HERE/"
ls -l "$HERE/sim.cap" "$HERE/sim.expected.txt"
grep '^# ' "$HERE/sim.expected.txt"

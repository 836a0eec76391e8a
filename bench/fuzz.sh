#!/bin/sh
# Runs every libFuzzer target of tests/fuzz for SECONDS each (default 60) and prints executions and
# findings per target. New crashes land in tests/fuzz/regressions/<target>/ (commit them: the replay
# unit tests then keep them fixed). The corpus grows in a scratch folder, not in the repository.
# Usage: bench/fuzz.sh [SECONDS] [TARGET...]   (builds build-fuzz with clang; FUZZ_NO_BUILD=1: as is)
set -eu
SRC=$(cd "$(dirname "$0")/.." && pwd)
S=${1:-60}; [ $# -gt 0 ] && shift
TARGETS=${*:-"elf cfi python ingest store spec cli"}
B=${FUZZ_BUILD:-$SRC/build-fuzz}
if [ ! -f "$B/CMakeCache.txt" ]; then
  CC=clang CXX=clang++ cmake -S "$SRC" -B "$B" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSTRATA_FUZZ=ON >/dev/null
fi
[ -n "${FUZZ_NO_BUILD:-}" ] || \
  cmake --build "$B" -j "${JOBS:-2}" --target $(for t in $TARGETS; do printf 'fuzz_%s ' "$t"; done) >/dev/null
W=$(mktemp -d); trap 'rm -rf "$W"' EXIT
printf '%-8s %10s %9s %8s %9s %s\n' target execs exec/s corpus findings note
for t in $TARGETS; do
  mkdir -p "$W/$t" "$SRC/tests/fuzz/regressions/$t"
  # -rss_limit_mb / -malloc_limit_mb: a parser that allocates past 512 MB on some input is a finding.
  # -fork=1 -ignore_crashes=1: a crash is saved and the run goes on for the rest of the time.
  ASAN_OPTIONS=detect_leaks=1:halt_on_error=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
    "$B/bin/fuzz_$t" -max_total_time="$S" -rss_limit_mb=1024 -malloc_limit_mb=512 -timeout=10 \
      -max_len=65536 -print_final_stats=1 -artifact_prefix="$SRC/tests/fuzz/regressions/$t/" \
      "$W/$t" "$SRC/tests/fuzz/corpus/$t" >"$W/$t.log" 2>&1 && rc=0 || rc=$?
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$W/$t.log" | tail -1)
  speed=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$W/$t.log" | tail -1)
  corpus=$(ls "$W/$t" | wc -l)
  found=$(ls "$SRC/tests/fuzz/regressions/$t" | grep -c -E '^(crash|leak|timeout|oom|slow-unit)-' || true)
  note=""; [ "$rc" -ne 0 ] && note="exit $rc: see $t.log below"
  printf '%-8s %10s %9s %8s %9s %s\n' "$t" "${execs:-?}" "${speed:-?}" "$corpus" "$found" "$note"
  if [ "$rc" -ne 0 ]; then grep -E 'ERROR|SUMMARY|#0 |#1 |#2 |#3 ' "$W/$t.log" | head -12 | sed 's/^/    /'; fi
done

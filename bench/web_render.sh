#!/usr/bin/env bash
# web_render.sh [BUILD_DIR] [--quick] [--baseline STRATA_BIN WEB_DIR]: how long the web UI's job page
# takes to render a job of 1,000 ranks in the test browser (Debian's chromium, headless, driven by
# playwright-core). A synthetic store (bench/web_store.cpp: 1,000 ranks x 60 steps, one straggler) is
# served by `strata serve`; the page counts as rendered when its findings, heatmap and per-rank
# breakdown are on screen. Measured, not asserted (target: under 2 s). With --baseline, an older
# `strata` and its web UI serve the same store too and the two are measured in turns, side by side
# (the machine's load then weighs on both alike). Results: bench/results/web_render.txt.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(dirname "$HERE")
BUILD=$ROOT/build
RUNS=5
BASE_BIN=
BASE_WEB=
while [[ $# -gt 0 ]]; do
  case "$1" in
    --quick) RUNS=3 ;;
    --baseline)
      [[ $# -ge 3 ]] || { echo "web_render: --baseline needs STRATA_BIN WEB_DIR" >&2; exit 1; }
      BASE_BIN=$(realpath "$2"); BASE_WEB=$(realpath "$3"); shift 2 ;;
    -*) echo "web_render: unknown option $1" >&2; exit 1 ;;
    *) BUILD=$1 ;;
  esac
  shift
done
BUILD=$(cd "$BUILD" && pwd)
RANKS=${STRATA_WEB_BENCH_RANKS:-1000}
for f in "$BUILD/bin/strata" "$BUILD/bin/strata-web-bench-store" "$BUILD/web/index.html" /usr/bin/chromium \
         "$ROOT/web/node_modules/playwright-core/package.json" ${BASE_BIN:+"$BASE_BIN" "$BASE_WEB/index.html"}; do
  [[ -e "$f" ]] || { echo "web_render: missing $f (build with make build; chromium from scripts/install-deps.sh)" >&2; exit 2; }
done
WORK=$(mktemp -d /tmp/strata-web-bench.XXXXXX)
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; wait "${PIDS[@]}" 2>/dev/null; rm -rf "$WORK"; }
trap cleanup EXIT

"$BUILD/bin/strata-web-bench-store" "$WORK/bench.db" "$RANKS" 60
# The baseline reads its own copy: a newer server may migrate the file to a schema it cannot read.
[[ -n "$BASE_BIN" ]] && cp "$WORK/bench.db" "$WORK/baseline.db"
# serve BIN WEB_DIR DB: starts a server on a free port; its URL in SERVED.
SERVED=
serve() {
  local port
  port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
  "$1" serve --store "sqlite:$3" --listen "127.0.0.1:$port" --web-dir "$2" >"$WORK/serve-$port.log" 2>&1 &
  PIDS+=($!)
  for _ in $(seq 100); do curl -sf "http://127.0.0.1:$port/api/v1/jobs" >/dev/null && break; sleep 0.1; done
  curl -sf "http://127.0.0.1:$port/api/v1/jobs" >/dev/null || { echo "web_render: $1 serve did not start: $(cat "$WORK/serve-$port.log")" >&2; exit 2; }
  SERVED="http://127.0.0.1:$port"
}
serve "$BUILD/bin/strata" "$BUILD/web" "$WORK/bench.db"
URL=$SERVED
BASE_URL=
if [[ -n "$BASE_BIN" ]]; then serve "$BASE_BIN" "$BASE_WEB" "$WORK/baseline.db"; BASE_URL=$SERVED; fi

mkdir -p "$HERE/results"
STRATA_URL="$URL" STRATA_BASE_URL="$BASE_URL" STRATA_RUNS=$RUNS STRATA_WORK="$WORK" STRATA_RANKS=$RANKS \
  STRATA_SHOT="$BUILD/test-artifacts/web/bench-job-${RANKS}-ranks.png" \
  node --input-type=module - <<'JS' | tee "$HERE/results/web_render.txt"
import { createRequire } from 'node:module';
import fs from 'node:fs';
import path from 'node:path';
const { chromium } = createRequire(path.join(process.cwd(), 'web', 'package.json'))('playwright-core');
const runs = Number(process.env.STRATA_RUNS);
const servers = [{ name: 'this build', url: process.env.STRATA_URL }];
if (process.env.STRATA_BASE_URL) servers.push({ name: 'baseline', url: process.env.STRATA_BASE_URL });
const ctx = await chromium.launchPersistentContext(path.join(process.env.STRATA_WORK, 'profile'), {
  executablePath: '/usr/bin/chromium', headless: true, viewport: { width: 1400, height: 1000 },
  args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
    '--disable-background-networking', '--disable-component-update', '--disable-sync'],
});
const measure = async (url, hash, sections) => {
  const page = await ctx.newPage();
  const t0 = Date.now();
  await page.goto(`${url}/${hash}`);
  await page.waitForFunction((s) => s.every((w) => (document.body.dataset.ready ?? '').split(' ').includes(w)), sections, { timeout: 60_000, polling: 10 });
  const wall = Date.now() - t0;
  const nav = await page.evaluate(() => performance.now());  // ms since navigation start
  // What the page cost: bytes over the wire, DOM size.
  const bytes = await page.evaluate(() => performance.getEntriesByType('resource').reduce((n, e) => n + (e.encodedBodySize || 0), 0));
  const nodes = await page.evaluate(() => document.getElementsByTagName('*').length);
  return { page, wall, nav, bytes, nodes };
};
// One warm-up load per server (the browser's and the server's first request), then turns.
for (const s of servers) (await measure(s.url, '#/job?job=bench-1k', ['findings', 'heatmap', 'breakdown'])).page.close();
const job = new Map(servers.map((s) => [s.name, []]));
for (let i = 0; i < runs; i++) {
  for (const s of servers) {
    const r = await measure(s.url, '#/job?job=bench-1k', ['findings', 'heatmap', 'breakdown']);
    job.get(s.name).push(r);
    if (i === runs - 1 && s === servers[0]) {
      fs.mkdirSync(path.dirname(process.env.STRATA_SHOT), { recursive: true });
      await r.page.screenshot({ path: process.env.STRATA_SHOT, fullPage: true });
    }
    await r.page.close();
  }
}
// The heatmap and breakdown alone, another metric.
const heat = [];
for (const s of servers) {
  const r = await measure(s.url, '#/job?job=bench-1k&metric=collective_ms', ['heatmap', 'breakdown']);
  heat.push(`${s.name} ${r.nav.toFixed(0)} ms`);
  await r.page.close();
}
await ctx.close();
const med = (a) => [...a].sort((x, y) => x - y)[a.length >> 1];
console.log(`web_render: job page of ${process.env.STRATA_RANKS} ranks x 60 steps in headless chromium, ${runs} runs${servers.length > 1 ? ' per server, in turns' : ''}`);
for (const s of servers) {
  const rs = job.get(s.name);
  const navs = rs.map((r) => r.nav);
  console.log(`  ${s.name}: rendered (findings + heatmap + breakdown), ms from navigation: median ${med(navs).toFixed(0)}, ` +
    `min ${Math.min(...navs).toFixed(0)}, max ${Math.max(...navs).toFixed(0)}; page.goto to rendered, median ${med(rs.map((r) => r.wall))} ms; ` +
    `${(rs[0].bytes / 1024).toFixed(0)} KiB of responses (encoded), ${rs[0].nodes} DOM elements`);
}
console.log(`  heatmap + breakdown only (collective wait metric): ${heat.join(', ')}`);
const best = med(job.get(servers[0].name).map((r) => r.nav));
console.log(`  target: under 2000 ms -> ${best < 2000 ? 'met' : 'NOT met'} (this build)`);
JS

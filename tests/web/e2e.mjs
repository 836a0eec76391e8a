// End-to-end test of the web UI in headless Chromium (Debian's chromium, driven by playwright-core):
// record a 4-rank sim run with a fault under `strata record`, serve the store with `strata serve`
// (its default web directory: the build's web/), and walk the pages a person would: the job list,
// the job (the finding names the faulty rank and its cause, the heatmap), a heatmap cell's flame
// graphs for that step's time window, the culprit's differential flame graph (the culprit function
// stands out), the timeline and its chrome-trace download (also from a server with a bearer token:
// the token never rides in a URL), and the nodes. Then a synthetic 1,000-rank job with a straggler
// (bench/web_store.cpp, rank 137): the job page marks the straggler's heatmap row without a click
// (its gutter label and the canvas's pixels), the hover names rank and node, the per-rank table
// fits the 1,400 px window, and the cross-rank timeline puts rank 137 beside its peers on one time
// axis. With --10k (its own CTest, web_e2e_10k): at 10,000 ranks the straggler's row is still
// marked and red. Screenshots land in build/test-artifacts/web/.
//
// Environment (CTest sets them): STRATA_BIN, STRATA_BUILD, STRATA_SOURCE. Needs root (strata record).
// Exit 77: skipped (not root, or no chromium).
import { spawn, spawnSync } from 'node:child_process';
import { createRequire } from 'node:module';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { freePort } from './ports.mjs';

const BIN = process.env.STRATA_BIN;
const HUGE_ONLY = process.argv.includes('--10k');
const BUILD = process.env.STRATA_BUILD;
const SOURCE = process.env.STRATA_SOURCE;
const CHROMIUM = process.env.STRATA_CHROMIUM || '/usr/bin/chromium';
if (!BIN || !BUILD || !SOURCE) {
  console.error('e2e: STRATA_BIN, STRATA_BUILD and STRATA_SOURCE must be set (ctest sets them)');
  process.exit(1);
}
if (process.getuid() !== 0) {
  console.log('e2e: SKIP: strata record needs root');
  process.exit(77);
}
if (!fs.existsSync(path.join(BIN, 'strata-sim')) || !fs.existsSync(path.join(BIN, 'strata-web-bench-store'))) {
  console.log('e2e: SKIP: no strata-sim or strata-web-bench-store (built with STRATA_BUILD_TESTBED=OFF)');
  process.exit(77);
}
if (!fs.existsSync(CHROMIUM)) {
  console.log(`e2e: SKIP: no ${CHROMIUM} (apt-get install chromium)`);
  process.exit(77);
}
const { chromium } = createRequire(path.join(SOURCE, 'web', 'package.json'))('playwright-core');
const ARTIFACTS = path.join(BUILD, 'test-artifacts', 'web');
fs.mkdirSync(ARTIFACTS, { recursive: true });
const work = fs.mkdtempSync(path.join(os.tmpdir(), 'strata-web-e2e-'));
const children = [];
let failures = 0;

function check(ok, what) {
  console.log(`${ok ? 'ok  ' : 'FAIL'} ${what}`);
  if (!ok) failures++;
}

function recordOnce(name, fault, extra = []) {
  const db = path.join(work, `${name}.db`);
  fs.rmSync(db, { force: true });
  const r = spawnSync(path.join(BIN, 'strata'),
    ['record', '-o', db, ...extra, '--', path.join(BIN, 'strata-sim'), 'run', '--ranks', '4', '--steps', '30', '--fault', fault,
      '--truth', path.join(work, `${name}.truth.json`)],
    { encoding: 'utf8', timeout: 240_000 });
  if (r.status !== 0) throw new Error(`strata record (${fault}) failed: ${r.stderr.slice(-2000)}`);
  return db;
}

// The recording is this test's input, not what it tests: on a machine busy with other work (CPU
// hogs of other tests, builds) the diagnosis can rightly see contention instead of the planted
// fault. Record again (up to 3 times) until `strata diagnose` names the fault, then check the UI.
function record(name, fault, rank, causes, extra = []) {
  let last = '';
  for (let attempt = 1; attempt <= 3; attempt++) {
    const db = recordOnce(name, fault, extra);
    const d = spawnSync(path.join(BIN, 'strata'), ['diagnose', db, '--json'], { encoding: 'utf8' });
    last = d.stdout;
    try {
      const findings = JSON.parse(d.stdout).findings ?? [];
      if (findings.some((f) => f.rank === rank && causes.test(f.cause + ' ' + f.culprit))) return db;
    } catch { /* not JSON: fall through */ }
    console.log(`e2e: recording ${attempt} of ${fault}: the diagnosis does not name it (load ${os.loadavg()[0].toFixed(1)}): ${last.slice(0, 300)}`);
  }
  throw new Error(`no recording of ${fault} that strata diagnose names (machine too busy?): ${last.slice(0, 500)}`);
}

// Starts `strata serve` on the store; with `token`, behind that bearer token. Returns its URL.
async function serve(db, token) {
  const port = await freePort();
  const logPath = path.join(work, `serve-${port}.log`);
  const log = fs.openSync(logPath, 'w');
  const args = ['serve', '--store', `sqlite:${db}`, '--listen', `127.0.0.1:${port}`];
  if (token) {
    const tf = path.join(work, `token-${port}`);
    fs.writeFileSync(tf, token + '\n', { mode: 0o600 });
    args.push('--token-file', tf);
  }
  const p = spawn(path.join(BIN, 'strata'), args, { stdio: ['ignore', log, log] });
  children.push(p);
  const url = `http://127.0.0.1:${port}`;
  serve.procs.set(url, { proc: p, logPath });
  const headers = token ? { Authorization: `Bearer ${token}` } : {};
  for (let i = 0; i < 100; i++) {
    try {
      if ((await fetch(`${url}/api/v1/jobs`, { headers })).ok) return url;
    } catch { /* not up yet */ }
    await new Promise((r) => setTimeout(r, 100));
  }
  throw new Error(`strata serve on ${url} did not answer (log: ${fs.readFileSync(path.join(work, `serve-${port}.log`), 'utf8')})`);
}

serve.procs = new Map();

async function stopServer(url) {
  const { proc } = serve.procs.get(url);
  if (proc.exitCode !== null) return;
  const exited = new Promise((r) => proc.once('exit', r));
  proc.kill('SIGTERM');
  await exited;
}

// Clicks the chrome-trace download of a timeline page; returns the saved file's text.
async function downloadTrace(page) {
  const [dl] = await Promise.all([page.waitForEvent('download', { timeout: 60_000 }), page.click('#download-trace')]);
  const failure = await dl.failure();
  if (failure) throw new Error(`chrome-trace download failed: ${failure}`);
  return { name: dl.suggestedFilename(), text: fs.readFileSync(await dl.path(), 'utf8'), url: dl.url() };
}

function parseJson(text) {
  try {
    return JSON.parse(text);
  } catch {
    return null;
  }
}

async function waitReady(page, what) {
  await page.waitForFunction((w) => (document.body.dataset.ready ?? '').split(' ').includes(w), what, { timeout: 60_000 });
}

// The synthetic 1,000-rank job (bench/web_store.cpp): rank 137 computes 40 ms longer from the middle
// step on while every rank's step time is alike (synchronous training).
const STRAGGLER = 137;

async function bigJob(browser) {
  const db = path.join(work, 'bench-1k.db');
  const made = spawnSync(path.join(BIN, 'strata-web-bench-store'), [db, '1000', '60'], { encoding: 'utf8', timeout: 240_000 });
  if (made.status !== 0) throw new Error(`strata-web-bench-store failed: ${made.stderr}`);
  const url = await serve(db);
  const page = await browser.newPage();
  page.on('pageerror', (e) => check(false, `no page error at 1,000 ranks (${e.message})`));
  await page.goto(`${url}/`);
  await page.waitForSelector('table.jobs tbody tr .step-ms', { timeout: 60_000 });
  const status = (await page.textContent('table.jobs .status-cell')).trim();
  check(!/degraded|silent/.test(status) && status.length < 80, `jobs page at 1,000 ranks: a short status cell, no node list ("${status}")`);
  const jobsStep = (await page.textContent('table.jobs .step-ms')).trim();
  await page.click('table.jobs tbody tr a');
  await waitReady(page, 'heatmap');
  await waitReady(page, 'breakdown');
  const pageStep = await page.getAttribute('#job-summary', 'data-step-ms');
  check(jobsStep === `${Number(pageStep).toFixed(1)} ms`, `one step time on the jobs page (${jobsStep}) and the job page (${Number(pageStep).toFixed(1)} ms)`);
  // No click: the straggler's row is labelled in the heatmap's gutter...
  const marks = await page.$$eval('.heatmap-mark', (ms) => ms.map((m) => ({ rank: m.getAttribute('data-rank'), node: m.getAttribute('data-node'), y: Number(m.getAttribute('data-y')) })));
  check(marks.length >= 1 && marks[0].rank === String(STRAGGLER),
    `heatmap at 1,000 ranks: rank ${STRAGGLER}'s row is marked without a click (marks: ${marks.map((m) => m.rank).join(', ') || 'none'})`);
  // ...and its pixel row is red in the slow steps where the rows around it are pale.
  await stragglerPixels(page, marks[0]?.y ?? 0, '1,000');
  // The hover names rank and node.
  await page.locator('canvas.heatmap').scrollIntoViewIfNeeded();
  const box = await page.locator('canvas.heatmap').boundingBox();
  await page.mouse.move(box.x + box.width * 0.9, box.y + 1 + (marks[0]?.y ?? 0) + 0.5);
  const tip = await page.textContent('#heatmap-tip');
  check(new RegExp(`rank ${STRAGGLER} on node-17`).test(tip), `heatmap hover names the rank and its node ("${tip.slice(0, 120)}")`);
  const notch = await page.evaluate(() => {
    const n = document.querySelector('.heatmap-hover-row');
    return n && !n.hidden ? n.getBoundingClientRect().height : 0;
  });
  check(notch >= MIN_MARKED_ROW_PX, `heatmap hover: the hovered row has a ${notch} px notch in the gutter (>= ${MIN_MARKED_ROW_PX})`);
  await bigJobRest(page);
}

// A marked rank's row is painted at least this many px tall (web/src/shape.ts MARK_ROW_PX): a 1 px
// row at 1,000 ranks is a hairline seen only thanks to its label.
const MIN_MARKED_ROW_PX = 3;

// Reads the heatmap's canvas as the page drew it: pixel row `y` (the straggler's) must be red in the
// slow steps (the second half), painted MIN_MARKED_ROW_PX tall or more (the run of red rows through
// y), and the rows 20 px above and below it must have no red pixel.
async function stragglerPixels(page, y, ranks) {
  const px = await page.evaluate((y) => {
    const c = document.querySelector('canvas.heatmap');
    const ctx = c.getContext('2d');
    const row = (yy) => {
      const d = ctx.getImageData(0, yy, c.width, 1).data;
      const out = [];
      for (let x = 0; x < c.width; x++) out.push([d[4 * x], d[4 * x + 1], d[4 * x + 2]]);
      return out;
    };
    const rows = [];
    for (let yy = Math.max(0, y - 20); yy <= Math.min(c.height - 1, y + 20); yy++) rows.push(row(yy));
    return { w: c.width, h: c.height, row: row(y), above: row(Math.max(0, y - 20)), below: row(Math.min(c.height - 1, y + 20)),
      near: rows, nearFrom: Math.max(0, y - 20) };
  }, y);
  const red = ([r, g, b]) => r > 180 && g < 110 && b < 110;
  const slow = (row) => row.slice(Math.ceil(px.w / 2) + 1);
  const share = (row) => slow(row).filter(red).length / Math.max(1, slow(row).length);
  const slowCols = slow(px.row);
  const redShare = share(px.row);
  // The painted height: consecutive rows through y that are red in the slow steps.
  let lo = y - px.nearFrom;
  let hi = lo;
  while (lo > 0 && share(px.near[lo - 1]) > 0.9) lo--;
  while (hi + 1 < px.near.length && share(px.near[hi + 1]) > 0.9) hi++;
  const painted = redShare > 0.9 ? hi - lo + 1 : 0;
  check(painted >= MIN_MARKED_ROW_PX,
    `heatmap at ${ranks} ranks: rank ${STRAGGLER}'s marked row is painted ${painted} px tall (>= ${MIN_MARKED_ROW_PX})`);
  const paleAround = [...px.above, ...px.below].filter(red).length;
  check(px.h <= 400 && redShare > 0.9 && paleAround === 0,
    `heatmap pixels at ${ranks} ranks: rank ${STRAGGLER}'s row is red in ${(100 * redShare).toFixed(0)}% of the slow steps, ${paleAround} red pixels in rows 20 px away (canvas ${px.w}x${px.h})`);
}

async function bigJobRest(page) {
  // The per-rank table fits a 1,400 px window.
  const widths = await page.evaluate(() => ({ page: document.documentElement.scrollWidth, view: window.innerWidth,
    table: document.querySelector('table.breakdown').getBoundingClientRect().right }));
  check(widths.page <= widths.view && widths.table <= widths.view,
    `the job page does not overflow ${widths.view} px (page ${widths.page} px, table's right edge ${Math.round(widths.table)} px)`);
  await page.screenshot({ path: path.join(ARTIFACTS, 'job-1000-ranks.png'), fullPage: true });
  await page.locator('#heatmap').screenshot({ path: path.join(ARTIFACTS, 'heatmap-1000-ranks.png') });

  // The heatmap says which span its steps are of (by default the latest 10 minutes) and offers earlier ones.
  const spanText = await page.$eval('#span', (e) => e.textContent ?? '');
  const earlier = await page.$eval('#span-earlier', (a) => a.getAttribute('href') ?? '');
  check(/Steps of .* UTC/.test(spanText) && /at=\d+/.test(earlier), `job page: the heatmap's span is said ("${spanText.slice(0, 70)}…") and an earlier one is a link`);

  // The cross-rank timeline from the straggler's "timeline beside peers".
  await page.click(`#standout .standout[data-rank="${STRAGGLER}"] a.button`);
  await waitReady(page, 'timeline');
  const tl = await page.evaluate(() => {
    const c = document.querySelector('#timeline-canvas');
    return { ranks: c.dataset.ranks, ticks: Number(c.dataset.ticks), from: Number(c.dataset.fromUs), to: Number(c.dataset.toUs),
      lanes: [...document.querySelectorAll('#timeline-ranks li')].map((l) => l.getAttribute('data-kinds')) };
  });
  const shownRanks = (tl.ranks ?? '').split(',');
  check(shownRanks.includes(String(STRAGGLER)) && shownRanks.length >= 3 && tl.lanes.every((k) => /step/.test(k ?? '')),
    `cross-rank timeline: rank ${STRAGGLER} beside peers (${tl.ranks}), each with its steps in the window`);
  check(tl.ticks >= 4 && tl.to > tl.from, `cross-rank timeline: one axis labelled along its length (${tl.ticks} ticks over ${((tl.to - tl.from) / 1000).toFixed(0)} ms)`);
  check(/step=\d+/.test(page.url()) && /ranks=/.test(page.url()) && /at=\d+/.test(page.url()),
    `cross-rank timeline URL carries ranks, step and the job page's span (${new URL(page.url()).hash})`);
  await page.screenshot({ path: path.join(ARTIFACTS, 'timeline-1000-ranks.png'), fullPage: true });
  // A span before the job began: no steps, said so, with the way to another span.
  await page.goto(`${new URL(page.url()).origin}/#/job?job=bench-1k&at=1000`);
  await waitReady(page, 'heatmap');
  const empty = await page.$eval('#span', (e) => e.textContent ?? '');
  check(/No steps of this job in this span/.test(empty) && (await page.$('#span-latest')) !== null,
    `job page: a span without the job's steps says so and links the latest ("${empty.slice(0, 60)}…")`);
  await page.close();
}

// 10,000 ranks in 400 pixel rows (25 ranks a row): the straggler's row keeps its colour and its label.
async function hugeJob(browser) {
  const db = path.join(work, 'bench-10k.db');
  const made = spawnSync(path.join(BIN, 'strata-web-bench-store'), [db, '10000', '20'], { encoding: 'utf8', timeout: 240_000 });
  if (made.status !== 0) throw new Error(`strata-web-bench-store failed: ${made.stderr}`);
  const url = await serve(db);
  const page = await browser.newPage();
  page.on('pageerror', (e) => check(false, `no page error at 10,000 ranks (${e.message})`));
  await page.goto(`${url}/#/job?job=bench-1k`);
  await page.waitForFunction(() => (document.body.dataset.ready ?? '').split(' ').includes('heatmap'), null, { timeout: 480_000 });
  const marks = await page.$$eval('.heatmap-mark', (ms) => ms.map((m) => ({ rank: m.getAttribute('data-rank'), y: Number(m.getAttribute('data-y')) })));
  const rows = await page.getAttribute('canvas.heatmap', 'data-rows');
  check(rows === '10000' && marks.length >= 1 && marks[0].rank === String(STRAGGLER),
    `heatmap at 10,000 ranks: rank ${STRAGGLER}'s row is marked without a click (marks: ${marks.map((m) => m.rank).join(', ') || 'none'})`);
  await stragglerPixels(page, marks[0]?.y ?? 0, '10,000');
  await page.locator('#heatmap').screenshot({ path: path.join(ARTIFACTS, 'heatmap-10000-ranks.png') });
  await page.close();
  await stopServer(url);
}

async function main() {
  // A fresh profile each run (playwright passes it as --user-data-dir).
  const browser = await chromium.launchPersistentContext(path.join(work, 'chromium-profile'), {
    executablePath: CHROMIUM,
    headless: true,
    viewport: { width: 1400, height: 1000 },
    args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
      '--disable-background-networking', '--disable-component-update', '--disable-sync'],
  });
  try {
    // `e2e.mjs --10k` (CTest web_e2e_10k): only the 10,000-rank heatmap, a test of its own (the
    // collector takes minutes on a 10,000-rank store on a loaded machine).
    if (HUGE_ONLY) return await hugeJob(browser);
    // ---- a slow GPU on rank 2
    // Short windows (2 s): a step's window then holds a part of the run's stacks, not all of them.
    const gpuDb = record('gpu-slow', 'gpu-slow:rank=2', 2, /gpu-slow/, ['--window', '2']);
    const url = await serve(gpuDb);
    const page = await browser.newPage();
    page.on('pageerror', (e) => check(false, `no page error (${e.message})`));
    await page.goto(`${url}/`);
    await page.waitForSelector('table.jobs tbody tr');
    await page.waitForSelector('table.jobs .finding-line, table.jobs .findings-cell .badge', { timeout: 60_000 });
    const jobRow = await page.textContent('table.jobs tbody tr');
    check(/gpu-slow/.test(jobRow) && /rank 2/.test(jobRow), `jobs page lists the finding (${jobRow.replace(/\s+/g, ' ').trim()})`);
    await page.screenshot({ path: path.join(ARTIFACTS, 'jobs.png'), fullPage: true });

    await page.click('table.jobs tbody tr a');
    await waitReady(page, 'findings');
    await waitReady(page, 'heatmap');
    const shown = await page.$$eval('.finding', (fs) => fs.map((f) => `${f.getAttribute('data-rank')}:${f.getAttribute('data-cause')}`));
    check(shown.includes('2:gpu-slow'), `job page: a finding names rank 2, gpu-slow (shown: ${shown.join(', ')})`);
    const heat = await page.$('canvas.heatmap');
    check(!!heat && (await heat.getAttribute('data-rows')) === '4', 'job page: heatmap canvas with 4 rank rows');
    check((await page.$$('table.breakdown tbody tr')).length === 4, 'job page: per-rank breakdown of 4 ranks');
    const topRank = await page.getAttribute('table.breakdown tbody tr', 'data-rank');
    check(topRank === '2', `breakdown: the busiest rank is rank 2 (got ${topRank})`);
    // Its OS columns come from the heatmap's span (summed per rank by the server; all-zero columns are left out).
    const heads = await page.$$eval('table.breakdown thead th', (ths) => ths.map((t) => t.textContent ?? ''));
    check(heads.some((t) => t.startsWith('on-CPU/step')), `breakdown: OS columns from the span's metrics (${heads.filter((t) => t.includes('/step')).join(', ')})`);
    const marks4 = await page.$$eval('.heatmap-mark', (ms) => ms.map((m) => m.getAttribute('data-rank')));
    check(marks4[0] === '2', `heatmap: rank 2's row is marked, unclicked (marks: ${marks4.join(', ') || 'none'})`);
    const status4 = await (await fetch(`${url}/api/v1/jobs`)).json();
    check(status4.jobs[0].status === 'recorded' && status4.jobs[0].silent_nodes.length === 0,
      `a finished strata record store is not degraded (status ${status4.jobs[0].status}, silent: ${status4.jobs[0].silent_nodes.join(', ') || 'none'})`);
    // The per-rank table (with the OS columns of a real recording) fits the 1,400 px window.
    const fit4 = await page.evaluate(() => ({ view: window.innerWidth, page: document.documentElement.scrollWidth,
      table: document.querySelector('table.breakdown').getBoundingClientRect().right }));
    check(fit4.page <= fit4.view && fit4.table <= fit4.view,
      `job page at 4 ranks: the breakdown fits ${fit4.view} px (table's right edge ${Math.round(fit4.table)} px)`);
    await page.screenshot({ path: path.join(ARTIFACTS, 'job-gpu-slow.png'), fullPage: true });
    const jobHash = await page.evaluate(() => location.hash);

    // The heatmap alone, with rank 2 picked (a click on its cell in the middle step), shareable by URL.
    // The step-time chart above it is drawn in the next frame: measure the heatmap once it is there.
    await page.waitForSelector('#trend .uplot');
    // In view first: a notice above it (reduced fidelity) can put the heatmap below the fold, where
    // the mouse cannot reach it.
    await page.locator('canvas.heatmap').scrollIntoViewIfNeeded();
    const box = await page.locator('canvas.heatmap').boundingBox();
    await page.mouse.click(box.x + box.width / 2, box.y + box.height * (2.5 / 4));
    await page.waitForFunction(() => /rank=2/.test(location.hash) && /step=\d+/.test(location.hash), null, { timeout: 60_000 });
    await waitReady(page, 'heatmap');
    // The pick is marked in the gutters and leaves the row's cells as they were: rank 2's picked cell
    // is still its own (red) colour, with nothing drawn over it.
    const picked = await page.evaluate(() => {
      const c = document.querySelector('canvas.heatmap');
      const step = Number(new URLSearchParams(location.hash.split('?')[1]).get('step'));
      const x = Math.floor(((step - 0.5) / Number(c.dataset.cols)) * c.width);
      const rowH = c.height / Number(c.dataset.rows);
      const d = c.getContext('2d').getImageData(x, Math.floor(2.5 * rowH), 1, 1).data;
      const edge = c.getContext('2d').getImageData(x, Math.floor(2 * rowH), 1, 1).data;
      return { gutter: !!document.querySelector('.heatmap-sel-row') && !!document.querySelector('.heatmap-sel-col'),
        mid: [d[0], d[1], d[2]], edge: [edge[0], edge[1], edge[2]] };
    });
    check(picked.gutter && picked.mid[0] > 150 && picked.mid[1] < 140 && picked.mid.join() === picked.edge.join(),
      `heatmap: the picked row and step are marked in the gutters; rank 2's cell keeps its colour to its edge (rgb ${picked.mid.join(',')})`);
    // A locator, not an element handle: the heatmap may re-render after the click.
    await page.locator('#heatmap').screenshot({ path: path.join(ARTIFACTS, 'heatmap.png') });

    // ---- the picked cell's flame graph: rank 2 in that step's time window. Off-CPU first: the rank
    // blocks on its slow GPU in every step, where its on-CPU samples (a few a second) may miss one.
    await page.click('#cell-offcpu');
    await waitReady(page, 'flame');
    const winUrl = new URL(page.url());
    const winState = new URLSearchParams(winUrl.hash.replace(/^#\/flame\?/, ''));
    check(winState.get('rank') === '2' && winState.get('kind') === 'offcpu' && /^\d+$/.test(winState.get('from') ?? '') && /^\d+$/.test(winState.get('to') ?? ''),
      `windowed flame graph: the URL carries rank and time window (${winUrl.hash})`);
    const winTotal = Number(await page.getAttribute('#flame', 'data-total'));
    const winSpan = await page.textContent('#window-span');
    const winFrames = (await page.$$('#flame g[name]')).length;
    await page.screenshot({ path: path.join(ARTIFACTS, 'flame-window.png'), fullPage: true });
    // The same rank over the whole run ("whole run" link), then compare.
    await page.evaluate(() => { document.body.dataset.ready = ''; });
    await page.click('#whole-run');
    await waitReady(page, 'flame');
    check(!/from=|to=/.test(page.url()), `"whole run" drops the window from the URL (${new URL(page.url()).hash})`);
    const allTotal = Number(await page.getAttribute('#flame', 'data-total'));
    check(winTotal > 0 && winTotal <= allTotal && winFrames > 0,
      `windowed off-CPU flame graph: ${winTotal} µs blocked in the window, > 0 and <= the whole run's ${allTotal} (${winSpan.trim()})`);
    console.log(`${winTotal < allTotal ? 'ok  ' : 'INFO'} the window holds a part of the run (${winTotal} of ${allTotal} µs)`);
    // The API agrees with the page, and the windows of the run add up to the whole.
    // (ns from the raw text: JSON numbers past 2^53 lose their last digits in JS.)
    const api = async (q) => {
      const text = await (await fetch(`${url}/api/v1/diff?${q}`)).text();
      return { ...JSON.parse(text), span: [text.match(/"start_ns":(\d+)/)?.[1], text.match(/"end_ns":(\d+)/)?.[1]] };
    };
    const q0 = `job=${encodeURIComponent(winState.get('job') ?? '')}&rank=2&kind=offcpu`;
    const sum = (d) => d.stacks.reduce((n, [, r]) => n + r, 0);
    const apiWin = await api(`${q0}&from=${winState.get('from')}&to=${winState.get('to')}`);
    const before = await api(`${q0}&to=${apiWin.span[0]}`);
    const after = await api(`${q0}&from=${apiWin.span[1]}`);
    check(sum(apiWin) === winTotal && sum(before) + sum(apiWin) + sum(after) === allTotal,
      `diff API: window ${sum(apiWin)} + before ${sum(before)} + after ${sum(after)} = whole run ${allTotal}`);
    // On-CPU and differential keep the window (back to it through history).
    await page.evaluate(() => { document.body.dataset.ready = ''; });
    await page.goBack();
    await waitReady(page, 'flame');
    await page.evaluate(() => { document.body.dataset.ready = ''; });
    await page.selectOption('#kind', 'oncpu');
    await waitReady(page, 'flame');
    const onTotal = Number(await page.getAttribute('#flame', 'data-total'));
    check(/kind=oncpu/.test(page.url()) && page.url().includes(`from=${winState.get('from')}`) && page.url().includes(`to=${winState.get('to')}`),
      `on-CPU flame graph keeps the window (${onTotal} samples on rank 2 in it)`);
    await page.evaluate(() => { document.body.dataset.ready = ''; });
    await page.selectOption('#kind', 'offcpu');
    await waitReady(page, 'flame');
    await page.evaluate(() => { document.body.dataset.ready = ''; });
    await page.check('#diff');
    await waitReady(page, 'flame');
    const diffTotal = Number(await page.getAttribute('#flame', 'data-total'));
    check(/diff=1/.test(page.url()) && page.url().includes(`from=${winState.get('from')}`) && diffTotal === winTotal,
      `differential off-CPU flame graph keeps the window (${diffTotal} µs on rank 2 in it, as without peers)`);
    await page.screenshot({ path: path.join(ARTIFACTS, 'diff-flame-window-offcpu.png'), fullPage: true });
    // The same rank against itself: the first half of the steps as the baseline, the rest as the window.
    await page.evaluate(() => { document.body.dataset.ready = ''; });
    await page.waitForFunction(() => document.querySelectorAll('#window select').length === 2, null, { timeout: 60_000 });
    await page.selectOption('#vs', 'self');
    await waitReady(page, 'flame');
    const selfUrl = new URLSearchParams(new URL(page.url()).hash.replace(/^#\/flame\?/, ''));
    const selfHead = await page.textContent('#deltas h2');
    const selfSpan = await page.textContent('#window-span');
    // The baseline is the steps before the window (its end may pass the window's start by the ranks' skew).
    check(/^\d+$/.test(selfUrl.get('bfrom') ?? '') && BigInt(selfUrl.get('bfrom')) < BigInt(selfUrl.get('from')) &&
      BigInt(selfUrl.get('bto')) < BigInt(selfUrl.get('to')) &&
      /baseline steps/.test(selfHead) && /Baseline: /.test(selfSpan) && (await page.$$('#flame g[name]')).length > 0,
      `differential against its own baseline steps: the URL carries both ranges, the page draws it ("${selfHead}"; ${selfSpan.trim().slice(-120)})`);

    await page.goto(`${url}/${jobHash}`);
    await waitReady(page, 'findings');
    await page.click('.finding[data-rank="2"] a:has-text("differential flame graph")');
    await waitReady(page, 'flame');
    check(/view=|#\/flame\?/.test(page.url()) && /rank=2/.test(page.url()) && /diff=1/.test(page.url()), `flame URL carries the state (${page.url()})`);
    const frames = await page.$$eval('#flame g[name]', (gs) => gs.map((g) => g.getAttribute('name')));
    check(frames.length > 5, `differential flame graph of rank 2 drawn (${frames.length} frames)`);
    // The host mostly sleeps while it waits for a slow GPU: the waits are off-CPU time; on-CPU
    // samples in them are incidental. Look in both differential graphs.
    const flameUrl = page.url();
    await page.evaluate(() => { document.body.dataset.ready = ''; });  // wait for the new render
    await page.goto(flameUrl.replace('kind=oncpu', 'kind=offcpu'));
    await waitReady(page, 'flame');
    const offFrames = await page.$$eval('#flame g[name]', (gs) => gs.map((g) => g.getAttribute('name')));
    // Off-CPU stacks are unwound with CFI from a stack copy (glibc's futex wait keeps no frame
    // pointer), so the waits show with their callers: the CUDA sync the host blocks in.
    const waits = offFrames.some((n) => /cudaStreamSynchronize|cudaDeviceSynchronize|wait_stream|cudaEventSynchronize/.test(n));
    check(waits, "gpu-slow: the rank's host waits on its (slow) GPU in its off-CPU differential flame graph");
    await page.screenshot({ path: path.join(ARTIFACTS, 'diff-flame-gpu-slow.png'), fullPage: true });

    const jobName = (await (await fetch(`${url}/api/v1/jobs`)).json()).jobs[0].job;
    await page.goto(`${url}/#/timeline?job=${encodeURIComponent(jobName)}&rank=2`);
    await waitReady(page, 'timeline');
    const lanes4 = await page.$$eval('#timeline-ranks li', (ls) => ls.map((l) => ({ rank: l.getAttribute('data-rank'), kinds: l.getAttribute('data-kinds') })));
    check(lanes4.length === 4 && lanes4.some((l) => l.rank === '2') && lanes4.every((l) => /step/.test(l.kinds ?? '')),
      `timeline: rank 2 beside its peers, each with its steps in the window (${lanes4.map((l) => `${l.rank}:${l.kinds}`).join(' ')})`);
    const saved = await downloadTrace(page);
    const trace = parseJson(saved.text);
    const tracePids = new Set((trace?.traceEvents ?? []).filter((e) => e.cat === 'step').map((e) => e.pid));
    check(Array.isArray(trace?.traceEvents) && tracePids.size === 4,
      `timeline: the chrome-trace download (${saved.name}) has the shown ranks' steps (${tracePids.size} processes)`);
    // Only the span of the shown steps (3, a step more each side) was read, not the rank's history.
    const heat4 = await (await fetch(`${url}/api/v1/heatmap?job=${encodeURIComponent(jobName)}&series=step_ms`)).json();
    const stepsPerPid = new Map();
    for (const e of trace?.traceEvents ?? []) if (e.cat === 'step') stepsPerPid.set(e.pid, (stepsPerPid.get(e.pid) ?? 0) + 1);
    const most = Math.max(0, ...stepsPerPid.values());
    const asked = await page.evaluate(() => {
      const c = document.querySelector('#timeline-canvas');
      return { from: c.dataset.spanFromNs, to: c.dataset.spanToNs };
    });
    check(heat4.steps > 8 && most >= 2 && most <= 7 && /^\d+$/.test(asked.from ?? '') && /^\d+$/.test(asked.to ?? ''),
      `timeline: the page reads the span of its steps (${asked.from}..${asked.to}): at most ${most} of the rank's ${heat4.steps} steps`);
    // Their on-CPU thread tracks too, and no other process's.
    const cpuPids = new Set((trace?.traceEvents ?? []).filter((e) => e.ph === 'C' && String(e.name).startsWith('on-CPU ')).map((e) => e.pid));
    check(cpuPids.size === 4 && [...cpuPids].every((p) => tracePids.has(p)),
      `timeline: the download's on-CPU thread tracks are the shown ranks' (${cpuPids.size} processes)`);
    await page.screenshot({ path: path.join(ARTIFACTS, 'timeline.png'), fullPage: true });

    await page.goto(`${url}/#/nodes`);
    await waitReady(page, 'nodes');
    await page.screenshot({ path: path.join(ARTIFACTS, 'nodes.png'), fullPage: true });

    // Dark mode: same job page, prefers-color-scheme: dark.
    const dark = await browser.newPage();
    await dark.emulateMedia({ colorScheme: 'dark' });
    await dark.goto(`${url}/${jobHash}`);
    await waitReady(dark, 'heatmap');
    await waitReady(dark, 'findings');
    const bg = await dark.evaluate(() => getComputedStyle(document.body).backgroundColor);
    check(bg === 'rgb(13, 17, 23)', `dark mode follows prefers-color-scheme (body ${bg})`);
    await dark.screenshot({ path: path.join(ARTIFACTS, 'job-dark.png'), fullPage: true });
    await dark.close();

    // ---- the same store behind a bearer token: the UI asks for it once (a prompt), every API call
    // sends it as a header, and the chrome-trace download works without the token in any URL.
    await stopServer(url);  // one server on the file at a time (each keeps its diagnoses in it)
    const token = `e2e-${Math.random().toString(36).slice(2)}-token`;
    const turl = await serve(gpuDb, token);
    check((await fetch(`${turl}/api/v1/timeline?rank=2`)).status === 401, 'token server: an API call without the token gets 401');
    const tpage = await browser.newPage();
    const prompts = [];
    tpage.on('dialog', (d) => { prompts.push(d.type()); void d.accept(token); });
    const urls = [];
    tpage.on('request', (r) => urls.push(r.url()));
    tpage.on('pageerror', (e) => check(false, `no page error behind the token (${e.message})`));
    await tpage.goto(`${turl}/#/timeline?job=${encodeURIComponent(jobName)}&rank=2`);
    await waitReady(tpage, 'timeline');
    check(prompts.length === 1 && prompts[0] === 'prompt', `token server: the UI asked for the token once (${prompts.join(', ') || 'never'})`);
    const tsaved = await downloadTrace(tpage);
    const ttrace = parseJson(tsaved.text);
    check(Array.isArray(ttrace?.traceEvents) && ttrace.traceEvents.some((e) => e.cat === 'step'),
      `token server: the chrome-trace download has the rank's steps (${tsaved.name}, ${tsaved.text.length} bytes, from ${tsaved.url.slice(0, 5)}…)`);
    const leaked = urls.concat([tsaved.url]).filter((u) => u.includes(token));
    check(leaked.length === 0, `token server: the token is in no URL (${urls.length} requests)`);
    const tlog = fs.readFileSync(serve.procs.get(turl).logPath, 'utf8');
    check(!tlog.includes(token), 'token server: the token is not in the server\'s log');
    await tpage.screenshot({ path: path.join(ARTIFACTS, 'timeline-token.png'), fullPage: true });
    await tpage.close();

    // ---- a CPU hotspot on rank 2: the culprit function tops the differential flame graph
    const hotDb = record('host-hotspot', 'host-hotspot:rank=2', 2, /host-hotspot|cpu_work|slow_augment/);
    const hurl = await serve(hotDb);
    const hot = await browser.newPage();
    await hot.goto(`${hurl}/`);
    await hot.click('table.jobs tbody tr a');
    await waitReady(hot, 'findings');
    const hshown = await hot.$$eval('.finding', (fs) => fs.map((f) => `${f.getAttribute('data-rank')}:${f.getAttribute('data-cause')}`));
    check(hshown.some((x) => x.startsWith('2:')), `host-hotspot: a finding names rank 2 (shown: ${hshown.join(', ')})`);
    await hot.screenshot({ path: path.join(ARTIFACTS, 'job-host-hotspot.png'), fullPage: true });
    await hot.click('.finding[data-rank="2"] a:has-text("differential flame graph")');
    await waitReady(hot, 'flame');
    const top = await hot.getAttribute('#deltas tbody tr', 'data-function');
    // slow_augment() tail-calls cpu_work(): its own frame is gone from the stacks, cpu_work carries it.
    check(/slow_augment|cpu_work/.test(top ?? ''), `host-hotspot: the top function of rank 2 vs its peers is the hotspot (got ${top})`);
    const hotFrames = await hot.$$eval('#flame g[name]', (gs) => gs.map((g) => g.getAttribute('name')));
    check(hotFrames.some((n) => /cpu_work|slow_augment/.test(n)), 'host-hotspot: the hotspot function is a frame of the differential flame graph');
    // The function table beside the graph: the hotspot by total, sortable by self.
    const fnRows = await hot.$$eval('#functions tbody tr', (rs) => rs.map((r) => r.getAttribute('data-function')));
    check(fnRows.length > 3 && /slow_augment|cpu_work/.test(fnRows[0] ?? ''), `function table: the hotspot tops it, sorted by Δ self vs the average peer (${fnRows.slice(0, 3).join(', ')})`);
    await hot.click('#functions th[data-sort="self"]');
    const selfs = await hot.$$eval('#functions tbody tr td:nth-child(2)', (ts) => ts.map((t) => t.textContent));
    check(selfs.length > 1, `function table sorts by self (first ${selfs.slice(0, 3).join(', ')})`);
    // Downloads of the rank's profile: folded text and gzipped pprof.
    const save = async (id) => {
      const [dl] = await Promise.all([hot.waitForEvent('download', { timeout: 60_000 }), hot.click(id)]);
      return { name: dl.suggestedFilename(), bytes: fs.readFileSync(await dl.path()) };
    };
    const folded = await save('#download-folded');
    check(/\.folded\.txt$/.test(folded.name) && /cpu_work[^;\n]* \d+$/m.test(folded.bytes.toString('utf8')),
      `flame page: folded download (${folded.name}, ${folded.bytes.length} bytes) has the hotspot`);
    const pprof = await save('#download-pprof');
    check(/\.pb\.gz$/.test(pprof.name) && pprof.bytes[0] === 0x1f && pprof.bytes[1] === 0x8b && pprof.bytes.length > 100,
      `flame page: pprof download (${pprof.name}, ${pprof.bytes.length} bytes, gzip)`);
    await hot.fill('#search', 'cpu_work');
    await hot.screenshot({ path: path.join(ARTIFACTS, 'diff-flame-host-hotspot.png'), fullPage: true });
    await hot.close();

    await bigJob(browser);
  } finally {
    await browser.close();
  }
}

try {
  await main();
} catch (e) {
  console.error(`e2e: ${e.stack ?? e}`);
  failures++;
} finally {
  for (const c of children) c.kill('SIGTERM');
}
console.log(`e2e: ${failures ? failures + ' check(s) failed' : 'all checks passed'}; screenshots in ${ARTIFACTS}`);
if (!failures) fs.rmSync(work, { recursive: true, force: true });
process.exit(failures ? 1 : 0);

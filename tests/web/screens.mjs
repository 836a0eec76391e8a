// Screenshots of the web UI for a person to look at (not a test): serves each store given with
// `strata serve` and saves the job list, the job page, its heatmap (also with the pointer on the
// marked rank's row), the cross-rank timeline and the differential flame graph of the rank that
// stands out, in headless Chromium (playwright-core).
//   node tests/web/screens.mjs OUT_DIR NAME=STORE.db [NAME=STORE.db ...]
// Environment: STRATA_BIN (default build/bin), STRATA_CHROMIUM (default /usr/bin/chromium).
import { spawn } from 'node:child_process';
import { createRequire } from 'node:module';
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { freePort } from './ports.mjs';

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..', '..');
const BIN = process.env.STRATA_BIN || path.join(ROOT, 'build', 'bin');
const CHROMIUM = process.env.STRATA_CHROMIUM || '/usr/bin/chromium';
const [out, ...stores] = process.argv.slice(2);
if (!out || stores.length === 0 || stores.some((s) => !/^[\w.-]+=.+/.test(s))) {
  console.error('usage: node tests/web/screens.mjs OUT_DIR NAME=STORE.db [NAME=STORE.db ...]');
  process.exit(1);
}
const { chromium } = createRequire(path.join(ROOT, 'web', 'package.json'))('playwright-core');
fs.mkdirSync(out, { recursive: true });


const ready = (page, what) =>
  page.waitForFunction((w) => (document.body.dataset.ready ?? '').split(' ').includes(w), what, { timeout: 120_000 });

const browser = await chromium.launch({ executablePath: CHROMIUM, headless: true, args: ['--no-sandbox', '--disable-gpu'] });
const servers = [];
try {
  for (const spec of stores) {
    const [name, db] = [spec.slice(0, spec.indexOf('=')), spec.slice(spec.indexOf('=') + 1)];
    const port = await freePort();
    const srv = spawn(path.join(BIN, 'strata'), ['serve', '--store', `sqlite:${db}`, '--listen', `127.0.0.1:${port}`], { stdio: 'ignore' });
    servers.push(srv);
    const url = `http://127.0.0.1:${port}`;
    for (let i = 0; i < 100; i++) {
      try {
        if ((await fetch(`${url}/api/v1/jobs`)).ok) break;
      } catch { /* not up yet */ }
      await new Promise((r) => setTimeout(r, 100));
    }
    const page = await browser.newPage({ viewport: { width: 1400, height: 1000 } });
    await page.goto(`${url}/`);
    await page.waitForSelector('table.jobs .step-ms', { timeout: 120_000 });
    await page.waitForSelector('table.jobs .finding-line, table.jobs .findings-cell .badge', { timeout: 120_000 });
    await page.screenshot({ path: path.join(out, `${name}-jobs.png`), fullPage: true });
    await page.click('table.jobs tbody tr a');
    await ready(page, 'heatmap');
    await ready(page, 'findings');
    await page.waitForTimeout(300);  // the step-time chart draws in the next frame
    await page.screenshot({ path: path.join(out, `${name}-job.png`), fullPage: true });
    await page.locator('#heatmap').screenshot({ path: path.join(out, `${name}-heatmap.png`) });
    const mark = await page.getAttribute('.heatmap-mark', 'data-rank').catch(() => null);
    if (mark !== null) {
      // The pointer on the marked rank's pixel row, in its last step: the line under the heatmap
      // names the rank, its node and the cell's deviation.
      const y = Number(await page.getAttribute('.heatmap-mark', 'data-y'));
      const canvas = page.locator('canvas.heatmap');
      await canvas.scrollIntoViewIfNeeded();
      const box = await canvas.boundingBox();
      await page.mouse.move(box.x + box.width * 0.97, box.y + 1 + y + 0.5);
      await page.locator('#heatmap').screenshot({ path: path.join(out, `${name}-heatmap-hover.png`) });
      await page.mouse.move(0, 0);
    }
    const standout = await page.$('#standout .standout a.button');
    if (standout) {
      await standout.click();
      await ready(page, 'timeline');
      await page.screenshot({ path: path.join(out, `${name}-timeline.png`), fullPage: true });
    }
    if (mark !== null) {
      const job = (await (await fetch(`${url}/api/v1/jobs`)).json()).jobs[0].job;
      await page.goto(`${url}/#/flame?job=${encodeURIComponent(job)}&rank=${mark}&kind=oncpu&diff=1`);
      await ready(page, 'flame');
      await page.screenshot({ path: path.join(out, `${name}-flame-diff.png`), fullPage: true });
    }
    await page.close();
    console.log(`${name}: screenshots in ${out} (marked rank: ${mark ?? 'none'})`);
  }
} finally {
  await browser.close();
  for (const s of servers) s.kill('SIGTERM');
}

// One job: findings with evidence, step-time trend, rank x step heatmap, per-rank breakdown.
import { api } from '../api';
import { lineChart } from '../chart';
import { errorBox, h } from '../dom';
import { heatmapCanvas } from '../heatmap';
import {
  cellRange, fmtMs, fmtNum, OS_METRICS, osTotalsByPid, rankBreakdown, robustZ, stepTrend,
  type Diagnosis, type Finding, type Heatmap, type RankBreakdown,
} from '../shape';
import { formatHash, type UiState } from '../state';

const METRICS: Record<string, string> = {
  step_ms: 'step time',
  collective_ms: 'collective wait',
  gpu_compute_ms: 'GPU compute',
  gpu_idle_ms: 'GPU idle',
};

function markReady(section: string): void {
  const r = new Set((document.body.dataset.ready ?? '').split(' ').filter(Boolean));
  r.add(section);
  document.body.dataset.ready = [...r].join(' ');
}

function findingCard(job: string, f: Finding): HTMLElement {
  return h('div', { class: 'finding', 'data-rank': f.rank, 'data-cause': f.cause },
    h('div', { class: 'finding-head' },
      h('span', { class: 'badge bad' }, f.cause),
      h('strong', {}, ` rank ${f.rank}`), f.node ? ` on ${f.node}` : '', ` · ${f.layer} layer · culprit `,
      h('code', {}, f.culprit),
      ` · ${fmtMs(f.lost_ms_per_step)} lost per step`,
      f.confidence !== null ? ` · confidence ${Math.round((f.confidence ?? 0) * 100)}%` : ''),
    h('ul', { class: 'evidence' }, f.evidence.map((e) => h('li', {}, e))),
    f.advice ? h('p', { class: 'advice' }, '→ ', f.advice) : null,
    h('div', { class: 'actions' },
      h('a', { class: 'button', href: formatHash({ view: 'flame', job, rank: f.rank, diff: true, kind: 'oncpu' }) }, 'differential flame graph'),
      h('a', { class: 'button', href: formatHash({ view: 'flame', job, rank: f.rank, diff: true, kind: 'offcpu' }) }, 'off-CPU differential'),
      h('a', { class: 'button', href: formatHash({ view: 'timeline', job, rank: f.rank }) }, 'timeline'),
      h('a', { class: 'button', href: formatHash({ view: 'job', job, rank: f.rank }) }, 'select rank')));
}

function findingsSection(job: string, d: Diagnosis): HTMLElement {
  const sec = h('section', { id: 'findings' }, h('h2', {}, 'Findings'));
  if (d.error) sec.append(h('p', { class: 'muted' }, `no diagnosis: ${d.error}`));
  else if (d.findings.length === 0) sec.append(h('p', {}, h('span', { class: 'badge ok' }, 'healthy'), ' no finding: the job runs at its own baseline and its ranks behave alike.'));
  if (typeof d.step_ms === 'number')
    sec.append(h('p', { class: 'muted' }, `step time ${fmtMs(d.step_ms)} vs baseline ${fmtMs(d.baseline_step_ms)}` +
      (d.second_opinion?.summary ? ` · second opinion: ${d.second_opinion.summary}` : '')));
  for (const f of d.findings) sec.append(findingCard(job, f));
  return sec;
}

function breakdownTable(job: string, rows: RankBreakdown[], selected: number | undefined, limit: number): HTMLElement {
  // Ranks that compute longest (and so wait least) first: the straggler tops the table.
  const z = robustZ(rows.map((r) => r.compute_ms));
  const order = rows.map((r, i) => ({ r, z: z[i] })).sort((a, b) => b.r.compute_ms - a.r.compute_ms);
  const shown = order.slice(0, limit);
  if (selected !== undefined && !shown.some((x) => x.r.rank === selected)) {
    const s = order.find((x) => x.r.rank === selected);
    if (s) shown.push(s);
  }
  const maxStep = Math.max(...rows.map((r) => r.step_ms).filter(Number.isFinite), 1);
  const osCols = OS_METRICS.filter((m) => rows.some((r) => Number.isFinite(r.os[m.name])));
  const tbody = h('tbody');
  for (const { r, z: zi } of shown) {
    const cw = Number.isFinite(r.collective_ms) ? r.collective_ms : 0;
    tbody.append(h('tr', { 'data-rank': r.rank, class: r.rank === selected ? 'selected' : zi > 3.5 ? 'outlier' : '' },
      h('td', {}, h('a', { href: formatHash({ view: 'job', job, rank: r.rank }) }, String(r.rank))),
      h('td', {}, r.node),
      h('td', { class: 'bar-cell' },
        h('div', { class: 'bar' },
          h('span', { class: 'compute', style: `width:${(100 * Math.max(0, r.compute_ms)) / maxStep}%`, title: `compute ${fmtMs(r.compute_ms)}` }),
          h('span', { class: 'wait', style: `width:${(100 * cw) / maxStep}%`, title: `collective wait ${fmtMs(cw)}` }))),
      h('td', {}, fmtMs(r.step_ms)), h('td', {}, fmtMs(r.compute_ms)), h('td', {}, fmtMs(r.collective_ms)),
      h('td', {}, fmtMs(r.gpu_compute_ms)), h('td', {}, fmtMs(r.gpu_idle_ms)),
      osCols.map((m) => h('td', {}, m.unit === 'ms' ? fmtMs(r.os[m.name]) : fmtNum(r.os[m.name]))),
      h('td', {},
        h('a', { href: formatHash({ view: 'flame', job, rank: r.rank, kind: 'oncpu' }) }, 'flame'), ' ',
        h('a', { href: formatHash({ view: 'flame', job, rank: r.rank, kind: 'oncpu', diff: true }) }, 'diff'), ' ',
        h('a', { href: formatHash({ view: 'timeline', job, rank: r.rank }) }, 'timeline'))));
  }
  return h('table', { class: 'breakdown' },
    h('thead', {}, h('tr', {}, h('th', {}, 'rank'), h('th', {}, 'node'), h('th', {}, 'compute | wait'), h('th', {}, 'step'),
      h('th', {}, 'compute'), h('th', {}, 'collective wait'), h('th', {}, 'GPU compute'), h('th', {}, 'GPU idle'),
      osCols.map((m) => h('th', { title: m.name }, `${m.label}/step`)), h('th', {}, ''))),
    tbody);
}

export async function jobView(main: HTMLElement, s: UiState, go: (s: UiState) => void): Promise<void> {
  const job = s.job ?? '';
  const metric = s.metric && METRICS[s.metric] ? s.metric : 'step_ms';
  main.append(h('nav', { class: 'crumbs' }, h('a', { href: '#/' }, 'jobs'), ' / ', job || '(unnamed)'),
    h('h1', {}, `Job ${job || '(unnamed)'}`));
  const findingsSlot = h('div', {}, h('p', { class: 'muted' }, 'diagnosing…'));
  const trendSlot = h('section', { id: 'trend' });
  const heatSlot = h('section', { id: 'heatmap' }, h('p', { class: 'muted' }, 'loading steps…'));
  const tableSlot = h('section', { id: 'breakdown' });
  main.append(findingsSlot, trendSlot, heatSlot, tableSlot);

  const findings = api.findings(job).then((d) => {
    findingsSlot.replaceChildren(findingsSection(job, d));
    markReady('findings');
  }).catch((e) => findingsSlot.replaceChildren(errorBox(e)));

  let hm: Heatmap;
  try {
    hm = await api.heatmap(job, false, [...new Set(['step_ms', metric])]);
  } catch (e) {
    heatSlot.replaceChildren(errorBox(e));
    return;
  }
  const rowOf = new Map(hm.ranks.map((r, i) => [r.rank, i]));
  const selRow = s.rank !== undefined ? rowOf.get(s.rank) : undefined;
  const matrix = hm.series[metric] ?? [];
  const trend = stepTrend(hm.series.step_ms ?? []);
  const lines = [{ label: 'median over ranks', values: trend, color: '#3b82f6' }];
  if (selRow !== undefined) lines.push({ label: `rank ${s.rank}`, values: (hm.series.step_ms[selRow] ?? []).map((v) => v ?? NaN), color: '#ff2d55' });
  trendSlot.append(h('h2', {}, 'Step time'), trend.length ? lineChart(trend.map((_, i) => i + 1), lines, { width: Math.min(900, main.clientWidth || 900), height: 180 }) : h('p', { class: 'muted' }, 'no steps recorded'));

  const select = h('select', { id: 'metric', onchange: () => go({ ...s, metric: select.value }) },
    Object.entries(METRICS).map(([k, v]) => h('option', { value: k, selected: k === metric }, v)));
  // A picked cell (rank, step) opens that rank's flame graphs for that step's time window.
  const selCol = s.step !== undefined && s.step >= 1 && s.step <= hm.steps ? s.step - 1 : undefined;
  const flameOf = (row: number, col: number, extra: Partial<UiState>): UiState =>
    ({ view: 'flame', job, rank: hm.ranks[row].rank, kind: 'oncpu', ...(cellRange(hm, row, col) ?? {}), ...extra });
  const cellBar = h('div', { class: 'controls cell-actions', id: 'cell-actions' });
  if (selRow !== undefined && selCol !== undefined) {
    const v = matrix[selRow]?.[selCol];
    cellBar.append(h('strong', {}, `rank ${s.rank}, step ${selCol + 1}`),
      typeof v === 'number' ? ` ${fmtMs(v)} ${METRICS[metric]}` : '',
      h('a', { class: 'button', id: 'cell-flame', href: formatHash(flameOf(selRow, selCol, {})) }, 'flame graph of this step'),
      h('a', { class: 'button', id: 'cell-diff', href: formatHash(flameOf(selRow, selCol, { diff: true })) }, 'differential'),
      h('a', { class: 'button', id: 'cell-offcpu', href: formatHash(flameOf(selRow, selCol, { kind: 'offcpu' })) }, 'off-CPU'),
      h('a', { class: 'button', href: formatHash({ view: 'timeline', job, rank: s.rank, step: selCol + 1 }) }, 'timeline of this step'));
  } else {
    cellBar.append(h('span', { class: 'muted' }, 'Pick a cell for its rank\'s flame graphs in that step\'s time window.'));
  }
  heatSlot.replaceChildren(h('h2', {}, `Ranks × steps: `, select),
    heatmapCanvas({
      matrix, rankLabels: hm.ranks.map((r) => r.rank), unit: 'ms', selected: selRow, selectedCol: selCol,
      onPick: (row, col) => go({ ...s, rank: hm.ranks[row].rank, step: col + 1 }),
      onOpen: (row, col) => go(flameOf(row, col, {})),
    }), cellBar);
  markReady('heatmap');

  const rows = rankBreakdown(hm);
  const limit = 50;
  const draw = (os?: Map<number, Record<string, number>>) => {
    const r = os ? rankBreakdown(hm, os) : rows;
    tableSlot.replaceChildren(h('h2', {}, 'Per-rank breakdown'),
      h('p', { class: 'muted' }, `${r.length} ranks; ${Math.min(limit, r.length)} busiest shown (mean per step)`),
      breakdownTable(job, r, s.rank, limit));
  };
  draw();
  markReady('breakdown');
  api.metrics('os.').then((m) => draw(osTotalsByPid(m))).catch(() => undefined);
  await findings;
}

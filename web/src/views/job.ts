// One job: findings with evidence, step-time trend, rank x step heatmap, per-rank breakdown.
import { api } from '../api';
import { lineChart } from '../chart';
import { errorBox, h } from '../dom';
import { heatmapCanvas } from '../heatmap';
import {
  cellRange, computeMatrix, defaultTimelineRanks, deviationMatrix, fmtMs, fmtNum, fmtRange, jobStepMs, nsString, OS_METRICS, osTotalsOf,
  diagnosisVerdict, rankBreakdown, robustZ, stepTrend, worstStep,
  type Diagnosis, type Finding, type Heatmap, type RankBreakdown, type Unexplained,
} from '../shape';
import { formatHash, type UiState } from '../state';
import { fidelitySlot } from './fidelity';

// compute_ms is step time minus collective wait (shape.ts computeMatrix): in synchronous training the
// straggler is the rank that computes longest and waits least; step time is alike on every rank.
const METRICS: Record<string, string> = {
  compute_ms: 'compute (step − wait)',
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

// Where to look next at a rank a card names: its differential profiles, its timeline, its row.
function rankActions(job: string, rank: number): HTMLElement {
  return h('div', { class: 'actions' },
    h('a', { class: 'button', href: formatHash({ view: 'flame', job, rank, diff: true, kind: 'oncpu' }) }, 'differential flame graph'),
    h('a', { class: 'button', href: formatHash({ view: 'flame', job, rank, diff: true, kind: 'offcpu' }) }, 'off-CPU differential'),
    h('a', { class: 'button', href: formatHash({ view: 'timeline', job, rank }) }, 'timeline'),
    h('a', { class: 'button', href: formatHash({ view: 'job', job, rank }) }, 'select rank'));
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
    rankActions(job, f.rank));
}

// A straggler no layer explains: where the time goes, without a cause or culprit to name.
function unexplainedCard(job: string, u: Unexplained): HTMLElement {
  return h('div', { class: 'finding unexplained', 'data-rank': u.rank },
    h('div', { class: 'finding-head' },
      h('span', { class: 'badge warn' }, 'straggler, cause unknown'),
      h('strong', {}, ` rank ${u.rank}`), u.node ? ` on ${u.node}` : '', ` · ${fmtMs(u.lost_ms_per_step)} lost per step`),
    h('p', {}, u.text),
    rankActions(job, u.rank));
}

function findingsSection(job: string, d: Diagnosis): HTMLElement {
  const sec = h('section', { id: 'findings' }, h('h2', {}, 'Findings'));
  if (d.error) sec.append(h('p', { class: 'muted' }, `no diagnosis: ${d.error}`));
  const verdict = diagnosisVerdict(d);
  if (verdict.badge) {
    const cls = verdict.badge === 'healthy' ? 'badge ok' : 'badge warn';
    sec.append(h('p', { id: 'diagnosis-verdict' }, h('span', { class: cls }, verdict.badge), ' ', verdict.text));
  }
  for (const u of d.unexplained ?? []) sec.append(unexplainedCard(job, u));
  if (typeof d.step_ms === 'number')
    sec.append(h('p', { class: 'muted', id: 'diagnosis-step' }, `The diagnosis compares the recent steps (median step ${fmtMs(d.step_ms)}) with the job's baseline (${fmtMs(d.baseline_step_ms)})` +
      (d.second_opinion?.summary ? ` · second opinion: ${d.second_opinion.summary}` : '')));
  for (const f of d.findings) sec.append(findingCard(job, f));
  return sec;
}

// `at`: the span the rows are of (the job page's), carried by the links.
function breakdownTable(job: string, rows: RankBreakdown[], selected: number | undefined, limit: number, at?: string): HTMLElement {
  // Ranks that compute longest (and so wait least) first: the straggler tops the table.
  const z = robustZ(rows.map((r) => r.compute_ms));
  const order = rows.map((r, i) => ({ r, z: z[i] })).sort((a, b) => b.r.compute_ms - a.r.compute_ms);
  const shown = order.slice(0, limit);
  if (selected !== undefined && !shown.some((x) => x.r.rank === selected)) {
    const s = order.find((x) => x.r.rank === selected);
    if (s) shown.push(s);
  }
  const maxStep = Math.max(...rows.map((r) => r.step_ms).filter(Number.isFinite), 1);
  // OS columns that are zero on every rank say nothing and would push the table past the window.
  const osCols = OS_METRICS.filter((m) => rows.some((r) => Number.isFinite(r.os[m.name]) && r.os[m.name] !== 0));
  const tbody = h('tbody');
  for (const { r, z: zi } of shown) {
    const cw = Number.isFinite(r.collective_ms) ? r.collective_ms : 0;
    tbody.append(h('tr', { 'data-rank': r.rank, class: r.rank === selected ? 'selected' : zi > 3.5 ? 'outlier' : '' },
      h('td', {}, h('a', { href: formatHash({ view: 'job', job, rank: r.rank, at }) }, String(r.rank))),
      h('td', {}, r.node),
      h('td', { class: 'bar-cell' },
        h('div', { class: 'bar' },
          h('span', { class: 'compute', style: `width:${(100 * Math.max(0, r.compute_ms)) / maxStep}%`, title: `compute ${fmtMs(r.compute_ms)}` }),
          h('span', { class: 'wait', style: `width:${(100 * cw) / maxStep}%`, title: `collective wait ${fmtMs(cw)}` }))),
      h('td', {}, fmtMs(r.step_ms)), h('td', {}, fmtMs(r.compute_ms)), h('td', {}, fmtMs(r.collective_ms)),
      h('td', {}, fmtMs(r.gpu_compute_ms)), h('td', {}, fmtMs(r.gpu_idle_ms)),
      osCols.map((m) => h('td', {}, m.unit === 'ms' ? fmtMs(r.os[m.name]) : fmtNum(r.os[m.name]))),
      h('td', { class: 'links' },
        h('a', { href: formatHash({ view: 'flame', job, rank: r.rank, kind: 'oncpu', at }) }, 'flame'), ' ',
        h('a', { href: formatHash({ view: 'flame', job, rank: r.rank, kind: 'oncpu', diff: true, at }) }, 'diff'), ' ',
        h('a', { href: formatHash({ view: 'timeline', job, rank: r.rank, at }) }, 'timeline'))));
  }
  // OS columns are per step but summed over all the rank's threads (a data loader's blocked
  // threads add up), so they can exceed the step time: the header says so.
  const th = (label: string, title: string) => h('th', { title }, label);
  return h('div', { class: 'table-wrap' }, h('table', { class: 'breakdown' },
    h('thead', {}, h('tr', {}, th('rank', 'rank'), th('node', 'node'), th('compute | wait', 'median compute (blue) and collective wait (orange) per step'),
      th('step', 'median step time of the rank'), th('compute', 'median of step time minus collective wait'),
      th('collective wait', 'median time in collectives per step'), th('GPU compute', 'median GPU compute per step'),
      th('GPU idle', 'median GPU idle per step'),
      osCols.map((m) => th(`${m.label}/step${m.unit === 'ms' ? ' *' : ''}`, `${m.name}: per step, summed over the rank's threads`)), h('th', {}, ''))),
    tbody));
}

export async function jobView(main: HTMLElement, s: UiState, go: (s: UiState) => void): Promise<void> {
  const job = s.job ?? '';
  const metric = s.metric && METRICS[s.metric] ? s.metric : 'compute_ms';
  const mode: 'abs' | 'peer' | 'dev' = s.heat === 'abs' ? 'abs' : s.heat === 'peer' ? 'peer' : 'dev';
  const summary = h('p', { class: 'muted', id: 'job-summary' });
  main.append(h('nav', { class: 'crumbs' }, h('a', { href: '#/' }, 'jobs'), ' / ', job || '(unnamed)'),
    h('h1', {}, `Job ${job || '(unnamed)'}`), summary);
  const findingsSlot = h('div', {}, h('p', { class: 'muted' }, 'diagnosing…'));
  const trendSlot = h('section', { id: 'trend' });
  const heatSlot = h('section', { id: 'heatmap' }, h('p', { class: 'muted' }, 'loading steps…'));
  const tableSlot = h('section', { id: 'breakdown' });
  const fidelity = fidelitySlot(job, { span: { to: s.at } });
  main.append(fidelity.el, findingsSlot, trendSlot, heatSlot, tableSlot);

  const findings = api.findings(job).then((d) => {
    findingsSlot.replaceChildren(findingsSection(job, d));
    markReady('findings');
  }).catch((e) => findingsSlot.replaceChildren(errorBox(e)));

  let hm: Heatmap;
  try {
    [hm] = await Promise.all([api.heatmap(job, false, undefined, s.at, OS_METRICS.map((m) => m.name)), fidelity.ready]);
  } catch (e) {
    heatSlot.replaceChildren(errorBox(e));
    return;
  }
  // The span the steps are of, pinned in the links out of this page (and on a pick): a live job's
  // latest 10 minutes move on, and step N of the next page must be this page's step N.
  const at = s.at ?? (hm.to_ns !== undefined ? nsString(hm.to_ns) : undefined);
  const spanLine = h('p', { class: 'muted', id: 'span' });
  if (hm.from_ns !== undefined && hm.to_ns !== undefined) {
    const tenMin = 600e9;
    // A span with no steps of the job (one pinned before it began, or after it ended) says so, with
    // the way back. Unpinned, the span is the job's latest: one that ended opens on its last steps.
    if (hm.steps === 0) spanLine.append(h('strong', {}, 'No steps of this job in this span: it may have ended earlier. '));
    spanLine.append(`Steps of ${fmtRange(hm.from_ns, hm.to_ns)}${s.at === undefined ? ', the job\'s latest' : ''}. `,
      h('a', { id: 'span-earlier', href: formatHash({ ...s, at: nsString(hm.from_ns), step: undefined }) }, '← 10 minutes earlier'));
    if (s.at !== undefined) {
      spanLine.append(' · ', h('a', { id: 'span-later', href: formatHash({ ...s, at: nsString(hm.to_ns + tenMin), step: undefined }) }, 'later →'),
        ' · ', h('a', { id: 'span-latest', href: formatHash({ ...s, at: undefined, step: undefined }) }, 'latest'));
    }
  }
  const rowOf = new Map(hm.ranks.map((r, i) => [r.rank, i]));
  const selRow = s.rank !== undefined ? rowOf.get(s.rank) : undefined;
  const step = hm.series.step_ms ?? [];
  const matrix = metric === 'compute_ms' ? computeMatrix(step, hm.series.collective_ms) : hm.series[metric] ?? [];
  const stepMs = jobStepMs(step);
  const nodes = new Set(hm.ranks.map((r) => r.node)).size;
  summary.textContent = `Step time ${fmtMs(stepMs)} (median over ranks of each rank's median step in the span) · ` +
    `${hm.ranks.length} ranks on ${nodes} node${nodes === 1 ? '' : 's'} · ${hm.steps} steps`;
  summary.dataset.stepMs = String(stepMs);
  const trend = stepTrend(step);
  const lines = [{ label: 'median over ranks', values: trend, color: '#3b82f6' }];
  if (selRow !== undefined) lines.push({ label: `rank ${s.rank}`, values: (step[selRow] ?? []).map((v) => v ?? NaN), color: '#ff2d55' });
  trendSlot.append(h('h2', {}, 'Step time per step'), trend.length ? lineChart(trend.map((_, i) => i + 1), lines, { width: Math.min(900, main.clientWidth || 900), height: 180 }) : h('p', { class: 'muted' }, 'no steps recorded'));

  const select = h('select', { id: 'metric', onchange: () => go({ ...s, metric: select.value }) },
    Object.entries(METRICS).map(([k, v]) => h('option', { value: k, selected: k === metric }, v)));
  // Peer groups (ranks of one parallel role) where the collector knows them: a pipeline stage whose
  // steps differ from the others' by design is then compared with its own stage.
  const groups = hm.ranks.map((r) => r.group);
  const hasGroups = groups.some((g) => g !== undefined);
  const modeSel = h('select', { id: 'heat-mode', onchange: () => go({ ...s, heat: modeSel.value === 'abs' || modeSel.value === 'peer' ? modeSel.value : undefined }) },
    h('option', { value: 'dev', selected: mode === 'dev' }, 'against each step\'s median across ranks'),
    hasGroups ? h('option', { value: 'peer', selected: mode === 'peer' }, 'against each step\'s median across its peer group') : null,
    h('option', { value: 'abs', selected: mode === 'abs' }, 'absolute'));
  // A picked cell (rank, step) opens that rank's flame graphs for that step's time window.
  const selCol = s.step !== undefined && s.step >= 1 && s.step <= hm.steps ? s.step - 1 : undefined;
  const flameOf = (row: number, col: number, extra: Partial<UiState>): UiState =>
    ({ view: 'flame', job, rank: hm.ranks[row].rank, kind: 'oncpu', ...(cellRange(hm, row, col) ?? {}), at, ...extra });
  const cellBar = h('div', { class: 'controls cell-actions', id: 'cell-actions' });
  if (selRow !== undefined && selCol !== undefined) {
    const v = matrix[selRow]?.[selCol];
    cellBar.append(h('strong', {}, `rank ${s.rank} on ${hm.ranks[selRow].node}, step ${selCol + 1}`),
      typeof v === 'number' ? ` ${METRICS[metric]} ${fmtMs(v)}` : '',
      h('a', { class: 'button', id: 'cell-flame', href: formatHash(flameOf(selRow, selCol, {})) }, 'flame graph of this step'),
      h('a', { class: 'button', id: 'cell-diff', href: formatHash(flameOf(selRow, selCol, { diff: true })) }, 'differential'),
      h('a', { class: 'button', id: 'cell-offcpu', href: formatHash(flameOf(selRow, selCol, { kind: 'offcpu' })) }, 'off-CPU'),
      h('a', { class: 'button', href: formatHash({ view: 'timeline', job, rank: s.rank, step: selCol + 1, at }) }, 'timeline of this step beside peers'));
  } else {
    cellBar.append(h('span', { class: 'muted' }, 'Pick a cell for its rank\'s flame graphs in that step\'s time window.'));
  }
  const view = heatmapCanvas({
    matrix, ranks: hm.ranks, unit: 'ms', metricLabel: METRICS[metric], mode: mode === 'peer' && !hasGroups ? 'dev' : mode, groups, stepMs,
    selected: selRow, selectedCol: selCol,
    onPick: (row, col) => go({ ...s, rank: hm.ranks[row].rank, step: col + 1, at }),
    onOpen: (row, col) => go(flameOf(row, col, {})),
  });
  // The ranks that stand out, named under the heatmap with their cross-rank timeline.
  const dev = deviationMatrix(metric === 'compute_ms' ? matrix : computeMatrix(step, hm.series.collective_ms)).dev;
  const standout = view.marks.length
    ? h('p', { id: 'standout' }, 'Stands out: ', view.marks.map((m, i) => {
      const rk = hm.ranks[m.row];
      const worst = worstStep(dev[m.row] ?? []);
      return h('span', { class: 'standout', 'data-rank': rk.rank }, i ? ' · ' : '',
        h('a', { href: formatHash({ view: 'job', job, rank: rk.rank, metric: s.metric, heat: s.heat, at: s.at }) }, `rank ${rk.rank}`), ` on ${rk.node}, ${fmtMs(m.score)} ${m.sign > 0 ? 'above' : 'below'} its steps' medians (${METRICS[metric]}) `,
        h('a', { class: 'button', href: formatHash({ view: 'timeline', job, ranks: defaultTimelineRanks(hm, rk.rank), step: worst, at }) }, 'timeline beside peers'));
    }))
    : h('p', { class: 'muted', id: 'standout' }, 'No rank stands out of its steps.');
  heatSlot.replaceChildren(h('h2', {}, 'Ranks × steps: ', select, ' ', modeSel), spanLine, view.el, standout, cellBar);
  markReady('heatmap');

  const limit = 50;
  const draw = (os?: Map<number, Record<string, number>>) => {
    const r = rankBreakdown(hm, os);
    tableSlot.replaceChildren(h('h2', {}, 'Per-rank breakdown'),
      h('p', { class: 'muted' }, `${r.length} ranks; ${Math.min(limit, r.length)} that compute longest shown. Each column is the rank's median per step; ` +
        '* OS times are per step summed over all the rank\'s threads, so they can exceed the step time; OS columns that are zero on every rank are left out.'),
      breakdownTable(job, r, s.rank, limit, at));
  };
  // OS columns from the heatmap's own span (summed per rank by the server).
  draw(osTotalsOf(hm));
  markReady('breakdown');
  await findings;
}

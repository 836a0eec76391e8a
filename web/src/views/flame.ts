// Flame graphs: one rank's on-CPU or off-CPU profile, or the differential flame graph of a rank
// against its average peer (red: more time on this rank, blue: less).
import flamegraph from 'd3-flame-graph/src/flamegraph.js';
import { offCpuColorMapper } from 'd3-flame-graph/src/colorMapper.js';
import 'd3-flame-graph/src/flamegraph.css';
import { select } from 'd3-selection';
import { api, download } from '../api';
import { errorBox, h } from '../dom';
import {
  buildFlameTree, diffColor, diffTree, fmtNum, fmtRange, functionDeltas, functionTable, maxAbsDelta, rangeSteps, rankTotal,
  selfDiff, shortName, sortFunctions, stepsRange, type FlameNode, type FunctionRow, type FunctionSort, type Heatmap,
} from '../shape';
import { formatHash, type UiState } from '../state';
import { fidelitySlot } from './fidelity';

function drawFlame(slot: HTMLElement, tree: FlameNode, opts: { diff: boolean; offcpu: boolean; unit: string; other: string }): void {
  const width = Math.max(500, Math.min(1400, slot.clientWidth || 900));
  const maxAbs = opts.diff ? maxAbsDelta(tree) : 0;
  type D = { data: FlameNode; value: number; highlight?: boolean };
  const chart = flamegraph()
    .width(width)
    .cellHeight(18)
    .transitionDuration(0)
    .minFrameSize(1)
    .sort(true)
    .selfValue(false)
    .title('')
    .setLabelHandler((d: D) =>
      `${d.data.name} — ${fmtNum(d.value)} ${opts.unit}` + (opts.diff ? ` (Δ ${(d.data.deltaTotal ?? 0) >= 0 ? '+' : ''}${fmtNum(d.data.deltaTotal ?? 0)} vs ${opts.other})` : ''));
  // Diff colour by the frame's inclusive delta against the graph's largest (shape.ts diffColor): a
  // function only this rank runs is red by its size, not grey.
  if (opts.diff) chart.setColorMapper((d: D, original: string) => (d.highlight ? original : diffColor(d.data.deltaTotal ?? 0, maxAbs)));
  else if (opts.offcpu) chart.setColorMapper(offCpuColorMapper);
  select(slot).datum(tree).call(chart);
}

// Rows of the function table at most (the rest are the long tail; the search box finds them).
const TABLE_ROWS = 200;

// The sortable self/total table beside the graph; with peers, the average peer's total and Δ too.
function functionsTable(rows: FunctionRow[], diff: boolean, unit: string, other: string, filter: () => string): HTMLElement {
  let by: FunctionSort = diff ? 'selfDelta' : 'self';
  let desc = true;
  const tbody = h('tbody');
  const cols: [FunctionSort, string, string][] = [['name', 'function', 'function name'], ['self', 'self', `${unit} with the function as the leaf`],
    ['total', 'total', `${unit} with the function anywhere in the stack (once per stack)`]];
  if (diff) cols.push(['selfDelta', 'Δ self', `self minus the ${other}'s self`], ['delta', 'Δ total', `total minus the ${other}'s total`]);
  const heads = cols.map(([k, label, title]) => h('th', { class: 'sortable', 'data-sort': k, title: `${title}; click to sort` }, label));
  const fill = () => {
    const q = filter();
    const sorted = sortFunctions(q ? rows.filter((r) => r.name.includes(q)) : rows, by, desc).slice(0, TABLE_ROWS);
    tbody.replaceChildren(...sorted.map((r) => {
      const delta = (d: number) => h('td', { class: d > 0 ? 'up' : d < 0 ? 'down' : '' }, `${d > 0 ? '+' : ''}${fmtNum(d)}`);
      return h('tr', { 'data-function': r.name },
        h('td', { class: 'fn' }, h('code', { title: r.name }, shortName(r.name))), h('td', {}, fmtNum(r.self)), h('td', {}, fmtNum(r.total)),
        diff ? delta(r.self - r.peerSelf) : null, diff ? delta(r.total - r.peerTotal) : null);
    }));
    heads.forEach((th, i) => th.classList.toggle('sorted', cols[i][0] === by));
    heads.forEach((th, i) => th.setAttribute('aria-sort', cols[i][0] === by ? (desc ? 'descending' : 'ascending') : 'none'));
  };
  heads.forEach((th, i) => th.addEventListener('click', () => {
    const k = cols[i][0];
    desc = k === by ? !desc : k !== 'name';
    by = k;
    fill();
  }));
  fill();
  const table = h('table', { class: 'functions', id: 'functions' }, h('thead', {}, h('tr', {}, heads)), tbody);
  (table as HTMLTableElement & { refill?: () => void }).refill = fill;
  return table;
}

export async function flameView(main: HTMLElement, s: UiState, go: (s: UiState) => void): Promise<void> {
  const job = s.job ?? '';
  const rank = s.rank ?? 0;
  const kind = s.kind ?? 'oncpu';
  const diff = !!s.diff;
  const range = { from: s.from, to: s.to };
  const windowed = range.from !== undefined || range.to !== undefined;
  // Against itself: a baseline range of the same rank (bfrom/bto) instead of its peers.
  const baseline = diff && (s.bfrom !== undefined || s.bto !== undefined) ? { from: s.bfrom, to: s.bto } : null;
  const other = baseline ? 'baseline' : 'average peer';
  main.append(h('nav', { class: 'crumbs' }, h('a', { href: '#/' }, 'jobs'), ' / ',
    h('a', { href: formatHash({ view: 'job', job, rank, at: s.at }) }, job || '(unnamed)'), ' / ', `rank ${rank}`));
  main.append(h('h1', {}, (diff ? `Differential flame graph: rank ${rank} vs ${baseline ? 'its own baseline steps' : 'its peers'}` : `Flame graph: rank ${rank}`) +
    (windowed ? ' (time window)' : '')));
  const rankIn = h('input', { type: 'number', min: 0, value: rank, id: 'rank', onchange: () => go({ ...s, rank: Number(rankIn.value) }) });
  const kindSel = h('select', { id: 'kind', onchange: () => go({ ...s, kind: kindSel.value as 'oncpu' | 'offcpu' }) },
    h('option', { value: 'oncpu', selected: kind === 'oncpu' }, 'on-CPU'),
    h('option', { value: 'offcpu', selected: kind === 'offcpu' }, 'off-CPU (blocked time)'));
  const diffBox = h('input', { type: 'checkbox', id: 'diff', checked: diff, onchange: () => go({ ...s, diff: diffBox.checked, bfrom: undefined, bto: undefined }) });
  // Compare with: its peers in the same window, or itself in baseline steps (picked once steps load).
  const vsSel = h('select', { id: 'vs' },
    h('option', { value: 'peers', selected: !baseline }, 'vs its peers'),
    h('option', { value: 'self', selected: !!baseline }, 'vs itself in baseline steps'));
  const basePick = h('span', { class: 'window-pick', id: 'baseline' });
  const search = h('input', { type: 'search', id: 'search', placeholder: 'search frames' });
  // The window: the whole span (the job page's 10 minutes), or steps A..B (the job's step starts), kept in the URL as from/to ns.
  const win = h('span', { class: 'window-pick', id: 'window' }, h('span', { class: 'muted' }, 'window: …'));
  main.append(h('div', { class: 'controls' }, h('label', {}, 'rank ', rankIn), h('label', {}, kindSel),
    h('label', {}, diffBox, ' differential'), diff ? vsSel : null, win, baseline ? basePick : null, search,
    h('a', { href: formatHash({ view: 'timeline', job, rank }) }, 'timeline of this rank')));
  const legend = diff
    ? h('p', { class: 'muted' }, 'Widths: this rank\'s ', kind === 'oncpu' ? 'samples' : 'blocked µs',
      `. Colour: how much more (red) or less (blue) time this rank spends in a frame, with its callees, than ${baseline ? 'in its baseline steps (scaled to the same span)' : 'its average peer'}; grey where they match.`)
    : null;
  const span = h('p', { class: 'muted', id: 'window-span' });
  // Downloads of the rank's profile (this window): folded for flamegraph.pl, pprof for go tool pprof,
  // Pyroscope, Parca. Fetched with the bearer token and saved from a blob (api.ts download).
  const base = `strata-${(job || 'job').replace(/[^A-Za-z0-9._-]/g, '_')}-rank${rank}-${kind}`;
  const dlNote = h('span', { class: 'muted', id: 'profile-download-status' });
  const dl = (id: string, label: string, format: string, file: string) => {
    const b = h('button', { class: 'button', id, type: 'button' }, label);
    b.addEventListener('click', () => {
      b.disabled = true;
      // The span the graph shows: the window, else the job page's (`at`), else the job's latest.
      const dlSpan = windowed ? range : { from: undefined, to: s.at };
      download('profile', { job, rank, kind, from: dlSpan.from, to: dlSpan.to, format }, file)
        .then(() => { dlNote.textContent = ` saved ${file}`; })
        .catch((e) => { dlNote.textContent = ` ${e instanceof Error ? e.message : e}`; })
        .finally(() => { b.disabled = false; });
    });
    return b;
  };
  const downloads = h('div', { class: 'controls' }, 'download this rank\'s profile: ',
    dl('download-folded', 'folded', 'folded', `${base}.folded.txt`), dl('download-pprof', 'pprof', 'pprof', `${base}.pb.gz`), dlNote);
  const slot = h('div', { id: 'flame', class: 'flame' });
  const tableSlot = h('div', { id: 'function-table', class: 'function-table' });
  const side = h('div', { id: 'deltas' });
  // Reduced fidelity in what this graph shows: the rank's windows (and its peers', against them).
  // Read for the span the graph covers: its window (with a baseline, from the earlier start to the
  // later end of the two), else the job page's span.
  const ns = (v?: string) => (v === undefined ? undefined : BigInt(v));
  const lo = [ns(range.from), ns(baseline?.from)].filter((v): v is bigint => v !== undefined);
  const hi = [ns(range.to), ns(baseline?.to)].filter((v): v is bigint => v !== undefined);
  const fidelitySpan = windowed && range.from !== undefined && range.to !== undefined
    ? { from: String(lo.reduce((a, b) => (b < a ? b : a))), to: String(hi.reduce((a, b) => (b > a ? b : a))) }
    : { to: s.at };
  const fidelity = fidelitySlot(job, {
    rank: diff && !baseline ? undefined : rank,
    fromNs: range.from !== undefined ? Number(range.from) : undefined,
    toNs: range.to !== undefined ? Number(range.to) : undefined,
    span: fidelitySpan,
  });
  main.append(fidelity.el, ...(legend ? [legend] : []), span, downloads, h('div', { class: 'flame-layout' }, slot, tableSlot), side);
  // Steps for the picker; the flame graph does not wait for them.
  void api.heatmap(job, false, ['none'], s.at).then((hm) => {
    windowPicker(win, hm, s, go);
    const n = hm.step_start_ns.length;
    // Against itself by default: the steps before the window as the baseline; without a window (or
    // one from step 1), the first half of the steps against the rest.
    vsSel.addEventListener('change', () => {
      if (vsSel.value === 'peers') return go({ ...s, bfrom: undefined, bto: undefined });
      const cur = windowed ? rangeSteps(hm, range) : null;
      if (cur && cur[0] > 1) {
        const b = stepsRange(hm, 0, cur[0] - 2);
        if (b) go({ ...s, bfrom: b.from, bto: b.to });
        return;
      }
      const half = Math.max(1, Math.floor(n / 2));
      const b = stepsRange(hm, 0, half - 1);
      const w = stepsRange(hm, half, n - 1);
      if (b && w) go({ ...s, ...w, bfrom: b.from, bto: b.to });
    });
    if (baseline) basePicker(basePick, hm, s, go);
  })
    .catch(() => win.replaceChildren(windowed ? h('a', { href: formatHash({ ...s, from: undefined, to: undefined }) }, 'whole span') : ''));
  try {
    const unit = kind === 'oncpu' ? 'samples' : 'µs';
    // Without a window: the span of the job page's steps (`at`), or the server's latest 10 minutes.
    const [d0] = await Promise.all([api.diff(job, rank, kind, windowed ? range : { to: s.at }), fidelity.ready]);
    const b = baseline ? await api.diff(job, rank, kind, baseline) : null;
    const d = b ? selfDiff(d0, b) : d0;
    const total = rankTotal(d);
    slot.dataset.total = String(total);
    slot.dataset.windowed = windowed ? '1' : '0';
    if (d.window) {
      span.textContent = d.window.end_ns > d.window.start_ns
        ? `Window ${fmtRange(d.window.from_ns, d.window.to_ns ?? d.window.end_ns)}; stacks are kept per store window, ` +
          `so this shows ${fmtRange(d.window.start_ns, d.window.end_ns)}: ${fmtNum(total)} ${unit} on rank ${rank}.`
        : `No stacks recorded in ${fmtRange(d.window.from_ns, d.window.to_ns ?? d.window.from_ns)}.`;
    } else {
      span.textContent = `Whole run: ${fmtNum(total)} ${unit} on rank ${rank}.`;
    }
    if (b?.window) {
      span.textContent += ` Baseline: ${fmtRange(b.window.start_ns, b.window.end_ns)}, ${fmtNum(rankTotal(b))} ${unit}` +
        (d0.window && b.window.end_ns > b.window.start_ns ? `, scaled ×${((d0.window.end_ns - d0.window.start_ns) / (b.window.end_ns - b.window.start_ns)).toFixed(2)} to the window's span.` : '.');
    }
    if (diff) {
      const tree = diffTree(d);
      if (tree.value === 0) slot.append(h('p', { class: 'muted' }, `no ${kind} samples for rank ${rank}`));
      else drawFlame(slot, tree, { diff: true, offcpu: kind === 'offcpu', unit, other });
      const top = functionDeltas(d, 12);
      side.append(h('h2', {}, `Where rank ${rank} spends more than ${baseline ? 'in its baseline steps' : 'its average peer'}`),
        h('table', { class: 'deltas' },
          h('thead', {}, h('tr', {}, h('th', {}, 'function'), h('th', {}, `rank ${rank}`), h('th', {}, other), h('th', {}, 'Δ'))),
          h('tbody', {}, top.map((f) => h('tr', { 'data-function': f.name },
            h('td', {}, h('code', {}, f.name)), h('td', {}, fmtNum(f.rank)), h('td', {}, fmtNum(f.peer)),
            h('td', { class: f.delta > 0 ? 'up' : f.delta < 0 ? 'down' : '' }, `${f.delta > 0 ? '+' : ''}${fmtNum(f.delta)}`))))));
    } else {
      // The diff endpoint is scoped to the job; its first column is the rank's own profile.
      const tree = buildFlameTree(d.stacks.map(([stack, value]) => ({ stack, value })), `rank ${rank}`);
      if (tree.value === 0) slot.append(h('p', { class: 'muted' }, `no ${kind} samples for rank ${rank}`));
      else drawFlame(slot, tree, { diff: false, offcpu: kind === 'offcpu', unit, other });
    }
    const unitShort = kind === 'oncpu' ? 'samples' : 'µs';
    const fnTable = functionsTable(functionTable(d), diff, unitShort, other, () => search.value) as HTMLTableElement & { refill?: () => void };
    tableSlot.append(h('h2', {}, 'Functions ', h('span', { class: 'muted' }, `(${unitShort}${diff ? `; Δ vs the ${other}` : ''})`)), fnTable);
    search.addEventListener('input', () => fnTable.refill?.());
    search.addEventListener('input', () => {
      slot.querySelectorAll('g').forEach((g) => {
        const name = g.getAttribute('name') ?? '';
        g.classList.toggle('match', !!search.value && name.includes(search.value));
      });
    });
    // d3-flame-graph lays frames out in a (zero-length) transition: ready after it has run.
    await new Promise((r) => setTimeout(r, 100));
    document.body.dataset.ready = 'flame';
  } catch (e) {
    slot.append(errorBox(e));
  }
}

// "window: step [A] to [B] | whole span": picking steps sets from/to (ns) in the URL.
function windowPicker(slot: HTMLElement, hm: Heatmap, s: UiState, go: (s: UiState) => void): void {
  const n = hm.step_start_ns.length;
  if (n === 0) {
    slot.replaceChildren(h('span', { class: 'muted' }, 'window: whole span (no steps in it)'));
    return;
  }
  const cur = s.from !== undefined || s.to !== undefined ? rangeSteps(hm, { from: s.from, to: s.to }) : null;
  const stepSel = (id: string, value: number) => h('select', { id }, Array.from({ length: n }, (_, i) =>
    h('option', { value: i + 1, selected: i + 1 === value }, `step ${i + 1}`)));
  const a = stepSel('window-from', cur?.[0] ?? 1);
  const b = stepSel('window-to', cur?.[1] ?? n);
  const apply = () => {
    const first = Math.min(Number(a.value), Number(b.value)) - 1;
    const last = Math.max(Number(a.value), Number(b.value)) - 1;
    if (first === 0 && last === n - 1) return go({ ...s, from: undefined, to: undefined });
    const r = stepsRange(hm, first, last);
    if (r) go({ ...s, ...r });
  };
  a.addEventListener('change', apply);
  b.addEventListener('change', apply);
  slot.replaceChildren('window: ', a, ' to ', b, ' ',
    cur ? h('a', { href: formatHash({ ...s, from: undefined, to: undefined }), id: 'whole-run' }, 'whole span') : h('span', { class: 'muted' }, '(whole span)'));
}

// "baseline: step [A] to [B]": the baseline range of the rank against itself (bfrom/bto in the URL).
function basePicker(slot: HTMLElement, hm: Heatmap, s: UiState, go: (s: UiState) => void): void {
  const n = hm.step_start_ns.length;
  const cur = rangeSteps(hm, { from: s.bfrom, to: s.bto });
  if (n === 0 || !cur) return;
  const stepSel = (id: string, value: number) => h('select', { id }, Array.from({ length: n }, (_, i) =>
    h('option', { value: i + 1, selected: i + 1 === value }, `step ${i + 1}`)));
  const a = stepSel('baseline-from', cur[0]);
  const b = stepSel('baseline-to', cur[1]);
  const apply = () => {
    const r = stepsRange(hm, Math.min(Number(a.value), Number(b.value)) - 1, Math.max(Number(a.value), Number(b.value)) - 1);
    if (r) go({ ...s, bfrom: r.from, bto: r.to });
  };
  a.addEventListener('change', apply);
  b.addEventListener('change', apply);
  slot.replaceChildren('baseline: ', a, ' to ', b);
}

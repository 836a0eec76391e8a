// The cross-rank timeline: chosen ranks (by default the rank it is opened for, or the one that stands
// out, beside a few typical peers) one above the other for a window of steps, their steps,
// communicators, CPU threads (collective calls, on-CPU share) and GPU streams on one time axis, from
// the same chrome-trace the download link gives Perfetto. Drawn on a canvas.
import { api, download } from '../api';
import { cssVar, errorBox, h } from '../dom';
import {
  computeMatrix, defaultTimelineRanks, deviationMatrix, fmtMs, jobStepMs, markedRows, niceTicks, rankLanes,
  stepsRange, stepWindow, worstStep, type RankLane, type TimeRange,
} from '../shape';
import { formatHash, type UiState } from '../state';
import { fidelitySlot } from './fidelity';

const COLORS: Record<string, string> = {
  step: '#8b5cf6', collective: '#f59e0b', kernel: '#10b981', memcpy: '#3b82f6', memset: '#60a5fa', api: '#ef4444', cpu: '#64748b',
};
// Steps shown by default from the chosen one: a slow step between its neighbours.
const WINDOW_STEPS = 3;
const LABEL_W = 230;
const ROW_H = 18;
const HEAD_H = 20;
const AXIS_H = 34;

interface Row {
  lane: RankLane;
  kind: 'head' | 'track' | 'cpu';
  index: number;
}

function layout(lanes: RankLane[]): Row[] {
  const rows: Row[] = [];
  for (const lane of lanes) {
    rows.push({ lane, kind: 'head', index: 0 });
    lane.tl.tracks.forEach((_, i) => rows.push({ lane, kind: 'track', index: i }));
    lane.cpu.forEach((_, i) => rows.push({ lane, kind: 'cpu', index: i }));
  }
  return rows;
}

function draw(canvas: HTMLCanvasElement, lanes: RankLane[], nodes: Map<number, string>, from: number, to: number): number[] {
  const ctx = canvas.getContext('2d');
  if (!ctx) return [];
  const rows = layout(lanes);
  const dpr = window.devicePixelRatio || 1;
  const width = canvas.clientWidth || 1000;
  const plotH = rows.reduce((n, r) => n + (r.kind === 'head' ? HEAD_H : ROW_H), 0);
  const height = AXIS_H + plotH + 4;
  canvas.width = width * dpr;
  canvas.height = height * dpr;
  canvas.style.height = `${height}px`;
  ctx.scale(dpr, dpr);
  const fg = cssVar('--fg') || '#222';
  const muted = cssVar('--muted') || '#666';
  const grid = cssVar('--grid') || '#ddd';
  const card = cssVar('--card') || '#f6f8fa';
  ctx.font = '12px system-ui, sans-serif';
  const plotW = width - LABEL_W - 8;
  const x = (t: number) => LABEL_W + ((t - from) / Math.max(1, to - from)) * plotW;
  // The axis on top, labelled along its length (ms from the window's start), grid lines through every track.
  const ticks = niceTicks(0, to - from, Math.max(4, Math.floor(plotW / 110)));
  ctx.fillStyle = muted;
  ctx.fillText('ms from the window start →', 4, 14);
  for (const t of ticks) {
    const xt = x(from + t);
    const label = `${(t / 1000).toFixed(t % 1000 === 0 ? 0 : 1)}`;
    ctx.fillStyle = fg;
    ctx.fillText(label, Math.min(width - 8 - ctx.measureText(label).width, xt - ctx.measureText(label).width / 2), 26);
    ctx.strokeStyle = grid;
    ctx.beginPath();
    ctx.moveTo(xt + 0.5, AXIS_H - 4);
    ctx.lineTo(xt + 0.5, height);
    ctx.stroke();
  }
  let y = AXIS_H;
  for (const r of rows) {
    if (r.kind === 'head') {
      ctx.fillStyle = card;
      ctx.fillRect(0, y, width, HEAD_H);
      ctx.fillStyle = fg;
      ctx.font = '600 12px system-ui, sans-serif';
      const node = nodes.get(r.lane.rank);
      ctx.fillText(`${r.lane.name}${node ? ' · ' + node : ''}`, 4, y + 14);
      ctx.font = '12px system-ui, sans-serif';
      y += HEAD_H;
      continue;
    }
    const name = r.kind === 'track' ? r.lane.tl.tracks[r.index].name : r.lane.cpu[r.index].name;
    ctx.fillStyle = fg;
    ctx.fillText(name.length > 30 ? name.slice(0, 29) + '…' : name, 14, y + 13);
    ctx.strokeStyle = grid;
    ctx.beginPath();
    ctx.moveTo(LABEL_W, y + ROW_H - 0.5);
    ctx.lineTo(width, y + ROW_H - 0.5);
    ctx.stroke();
    if (r.kind === 'track') {
      for (const e of r.lane.tl.tracks[r.index].events) {
        if (e.end < from || e.start > to) continue;
        const x0 = Math.max(LABEL_W, x(e.start));
        const x1 = Math.min(width - 8, x(e.end));
        ctx.fillStyle = COLORS[e.cat] ?? '#94a3b8';
        ctx.fillRect(x0, y + 3, Math.max(1, x1 - x0), ROW_H - 6);
        if (x1 - x0 > 60) {
          ctx.fillStyle = '#fff';
          ctx.fillText(e.name.slice(0, Math.floor((x1 - x0) / 7)), x0 + 2, y + 13);
        }
      }
    } else {
      // On-CPU share of the thread per window: the bar's height, held until the next window.
      const pts = r.lane.cpu[r.index].points;
      pts.forEach((p, i) => {
        const end = i + 1 < pts.length ? pts[i + 1].ts : to;
        if (end < from || p.ts > to) return;
        const x0 = Math.max(LABEL_W, x(p.ts));
        const x1 = Math.min(width - 8, x(end));
        const hgt = Math.max(1, Math.min(1, p.value) * (ROW_H - 4));
        ctx.fillStyle = COLORS.cpu;
        ctx.fillRect(x0, y + ROW_H - 2 - hgt, Math.max(1, x1 - x0), hgt);
      });
    }
    y += ROW_H;
  }
  return ticks;
}

export async function timelineView(main: HTMLElement, s: UiState, go: (s: UiState) => void): Promise<void> {
  const job = s.job ?? '';
  main.append(h('nav', { class: 'crumbs' }, h('a', { href: '#/' }, 'jobs'), ' / ',
    h('a', { href: formatHash({ view: 'job', job, rank: s.rank, at: s.at }) }, job || '(unnamed)'), ' / ', 'timeline'));
  const title = h('h1', {}, 'Timeline');
  main.append(title);
  // Its CPU tracks come from samples: where the rate was lowered or CFI turned off, it says so.
  const fidelity = fidelitySlot(job, { span: { to: s.at } });
  main.append(fidelity.el);
  const slot = h('div', { class: 'timeline' });
  main.append(slot);
  // The ranks and the step: from the URL, else the rank it was opened for (or the one that stands out)
  // beside typical peers, at its slowest step.
  let ranks = s.ranks ?? [];
  let step = s.step;
  const nodes = new Map<number, string>();
  // The time the shown steps take, a step more on each side: the only rows the page asks for (a
  // rank's whole history in a collector that has run for weeks would be millions of events).
  let span: TimeRange | null = null;
  try {
    const [hm] = await Promise.all([api.heatmap(job, false, ['step_ms', 'collective_ms'], s.at), fidelity.ready]);
    for (const r of hm.ranks) nodes.set(r.rank, r.node);
    const compute = computeMatrix(hm.series.step_ms ?? [], hm.series.collective_ms);
    const dev = deviationMatrix(compute).dev;
    let rank = s.rank;
    if (rank === undefined) {
      const top = markedRows(dev, jobStepMs(hm.series.step_ms ?? []))[0];
      rank = hm.ranks[top?.row ?? 0]?.rank ?? 0;
    }
    if (ranks.length === 0) ranks = defaultTimelineRanks(hm, rank);
    if (step === undefined) {
      const row = hm.ranks.findIndex((r) => r.rank === rank);
      step = Math.max(1, worstStep(dev[row] ?? []) - Math.floor(WINDOW_STEPS / 2));
    }
    const columns = hm.step_start_ns.length;
    if (columns > 0) span = stepsRange(hm, Math.min(columns - 1, Math.max(0, step - 2)), Math.min(columns - 1, step + WINDOW_STEPS - 1));
  } catch (e) {
    slot.append(errorBox(e));
    return;
  }
  const first = step ?? 1;
  const last = first + WINDOW_STEPS - 1;
  title.textContent = `Timeline: rank${ranks.length > 1 ? 's' : ''} ${ranks.join(', ')} · steps ${first}–${last}`;

  // Fetched with the bearer token (a plain link could not send it), saved from a blob.
  const save = h('button', { class: 'button', id: 'download-trace', type: 'button' }, 'download chrome-trace (open in Perfetto)');
  const saveNote = h('span', { class: 'muted', id: 'download-status' });
  save.addEventListener('click', () => {
    save.disabled = true;
    saveNote.textContent = ' preparing…';
    const file = `strata-${(job || 'job').replace(/[^A-Za-z0-9._-]/g, '_')}-ranks${ranks.join('_')}.json`;
    download('timeline', { job, ranks: ranks.join(','), from: span?.from, to: span?.to, download: 1 }, file)
      .then(() => { saveNote.textContent = ` saved ${file}`; })
      .catch((e) => { saveNote.textContent = ` ${e instanceof Error ? e.message : e}`; })
      .finally(() => { save.disabled = false; });
  });
  const ranksIn = h('input', { type: 'text', id: 'ranks', value: ranks.join(','), size: 18, title: 'ranks, comma-separated',
    onchange: () => {
      const list = ranksIn.value.split(/[\s,]+/).filter((x) => /^\d{1,7}$/.test(x)).map(Number);
      if (list.length) go({ ...s, ranks: [...new Set(list)].slice(0, 32), step: first });
    } });
  const stepIn = h('input', { type: 'number', id: 'step', min: 1, value: first, onchange: () => go({ ...s, ranks, step: Math.max(1, Number(stepIn.value)) }) });
  const shift = (d: number) => h('button', { class: 'button', type: 'button', onclick: () => go({ ...s, ranks, step: Math.max(1, first + d) }) }, d < 0 ? '← earlier' : 'later →');
  main.insertBefore(h('div', { class: 'controls' }, h('label', {}, 'ranks ', ranksIn), h('label', {}, `steps from `, stepIn, ` (${WINDOW_STEPS})`),
    shift(-WINDOW_STEPS), shift(WINDOW_STEPS), save, saveNote,
    h('a', { href: formatHash({ view: 'flame', job, rank: ranks[0], diff: true, kind: 'oncpu' }) }, `differential flame graph of rank ${ranks[0]}`)), slot);

  let lanes: RankLane[];
  try {
    lanes = rankLanes(await api.timeline(job, ranks, span));
  } catch (e) {
    slot.append(errorBox(e));
    return;
  }
  const win = stepWindow(lanes, first, last);
  const all: [number, number] = [Math.min(...lanes.map((l) => l.tl.start)), Math.max(...lanes.map((l) => l.tl.end))];
  const [from, to] = win ?? all;
  const canvas = h('canvas', { class: 'timeline-canvas', id: 'timeline-canvas' });
  canvas.dataset.ranks = lanes.map((l) => l.rank).join(',');
  canvas.dataset.fromUs = String(from);
  canvas.dataset.toUs = String(to);
  // The span asked of the server (unix ns), empty where the page asked for its default.
  canvas.dataset.spanFromNs = span?.from ?? '';
  canvas.dataset.spanToNs = span?.to ?? '';
  // What is drawn, for the reader of the DOM (and the end-to-end test): per rank, its tracks.
  const list = h('ul', { class: 'timeline-ranks', id: 'timeline-ranks' }, lanes.map((l) => h('li', {
    'data-rank': l.rank, 'data-tracks': l.tl.tracks.length + l.cpu.length,
    'data-kinds': [...new Set(l.tl.tracks.flatMap((t) => t.events.filter((e) => e.end >= from && e.start <= to).map((e) => e.cat)))].sort().join(','),
  }, `${l.name}${nodes.get(l.rank) ? ' on ' + nodes.get(l.rank) : ''}: ${l.tl.tracks.length} track${l.tl.tracks.length === 1 ? '' : 's'}` +
    (l.cpu.length ? `, ${l.cpu.length} on-CPU` : '') +
    `; steps ${first}–${last} ${fmtMs((Math.max(...l.tl.steps.filter((x) => x.step === last).map((x) => x.end)) - Math.min(...l.tl.steps.filter((x) => x.step === first).map((x) => x.start))) / 1000)}`)));
  slot.append(
    win ? h('p', { class: 'muted' }, `Window: steps ${first}–${last}, ${fmtMs((to - from) / 1000)} on one time axis for every rank.`)
      : h('p', { class: 'muted' }, `Steps ${first}–${last} are not in what was read: all of it is shown.`),
    canvas,
    h('p', { class: 'muted' }, 'Colours: ', Object.entries(COLORS).map(([k, c]) => h('span', { class: 'swatch', style: `background:${c}` }, k === 'cpu' ? 'on-CPU share' : k))),
    list);
  await new Promise((r) => requestAnimationFrame(r));
  const ticks = draw(canvas, lanes, nodes, from, to);
  canvas.dataset.ticks = String(ticks.length);
  document.body.dataset.ready = 'timeline';
}

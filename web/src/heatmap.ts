// Rank x step heatmap on a canvas, one ImageData write. By default each cell is drawn against its
// step's median across ranks (a diverging scale: red above, blue below), so a job-wide slowdown
// cancels out and the straggler stands out. The canvas has at most HEATMAP_MAX_PX pixel rows, drawn
// 1:1 on screen (no browser scaling that would drop rows); where a pixel row covers several ranks it
// shows the most extreme one (shape.ts downsampleExtreme), so one rank in 10,000 keeps its colour.
// Ranks that stand out are labelled in the gutter (DOM: .heatmap-mark[data-rank]); the picked row and
// step are marked in the gutters, never drawn over the cells. A marked or picked rank's pixel row is
// drawn MARK_ROW_PX tall (shape.ts heatmapRowLayout), and the hovered row gets a notch of that height
// in the gutter, so neither is a hairline at 1,000 ranks.
import {
  colorDomain, deviationDomain, deviationMatrix, divergingTable, downsampleExtreme, fmtMs, heatmapRowLayout, markedRows,
  rampTable, MARK_ROW_PX, type RankMark,
} from './shape';
import { cssVar, h } from './dom';

// Pixel rows (and CSS px) of the heatmap at most: 1,000 ranks then share 400 rows, 2-3 a row.
export const HEATMAP_MAX_PX = 400;
// Pixel columns at most (the canvas is scaled to its box's width, up or down a little).
const HEATMAP_MAX_COLS = 800;
// Gutter labels closer than this (px) to a marked rank's label are left out.
const LABEL_GAP_PX = 14;

export interface HeatmapOptions {
  matrix: (number | null)[][];
  ranks: { rank: number; node: string }[];
  unit: string;
  metricLabel: string;
  mode: 'dev' | 'peer' | 'abs';  // against the step's median across ranks, across the rank's peer group, or absolute
  groups?: (string | undefined)[];  // each row's peer group (mode 'peer')
  stepMs: number;       // the job's step time (deviation scale floor, mark threshold)
  selected?: number;    // row index
  selectedCol?: number; // column index of the picked cell
  onPick?: (row: number, col: number) => void;
  onOpen?: (row: number, col: number) => void;  // double click
}

export interface HeatmapView {
  el: HTMLElement;
  marks: RankMark[];
}

export function heatmapCanvas(o: HeatmapOptions): HeatmapView {
  const rows = o.matrix.length;
  const cols = o.matrix.reduce((m, r) => Math.max(m, r.length), 0);
  const deviation = o.mode !== 'abs';
  const { dev, medians } = deviationMatrix(o.matrix, o.mode === 'peer' ? o.groups : undefined);
  const shown = deviation ? dev : o.matrix;
  const marks = markedRows(dev, o.stepMs);
  // Rows: ranks share pixel rows only past HEATMAP_MAX_PX (less the marked rows' extra pixels); up
  // to it, each gets whole pixels; a marked or picked rank's pixel row is at least MARK_ROW_PX tall.
  const special = marks.map((m) => m.row).concat(o.selected !== undefined ? [o.selected] : []);
  const layout = heatmapRowLayout(rows, special, HEATMAP_MAX_PX);
  const ds = downsampleExtreme(shown, layout.outRows, HEATMAP_MAX_COLS, deviation ? undefined : medians);
  const top = layout.top;
  const height = top[ds.rows];
  const canvas = h('canvas', { class: 'heatmap', width: Math.max(1, ds.cols), height: Math.max(1, height), style: `height:${Math.max(1, height)}px` });
  canvas.dataset.rows = String(rows);
  canvas.dataset.cols = String(cols);
  canvas.dataset.pixelRows = String(ds.rows);
  // Pixel row of a matrix row.
  const dsRow = (row: number): number => {
    let lo = 0;
    let hi = ds.rows - 1;
    while (lo < hi) {
      const mid = (lo + hi + 1) >> 1;
      if (ds.rowStart[mid] <= row) lo = mid;
      else hi = mid - 1;
    }
    return lo;
  };
  // Pixel row at a CSS px from the canvas top.
  const dsRowAt = (py: number): number => {
    let lo = 0;
    let hi = ds.rows - 1;
    while (lo < hi) {
      const mid = (lo + hi + 1) >> 1;
      if (top[mid] <= py) lo = mid;
      else hi = mid - 1;
    }
    return lo;
  };
  const rowH = (y: number): number => top[y + 1] - top[y];
  canvas.dataset.mode = o.mode;
  // Pixel row (CSS px from the canvas top) of a matrix row, its first pixel.
  const yOf = (row: number): number => top[dsRow(row)];
  const midOf = (row: number): number => top[dsRow(row)] + rowH(dsRow(row)) / 2;
  const dark = cssVar('--empty-cell') === 'dark';
  let lo = 0;
  let hi = 1;
  let span = 1;
  if (deviation) {
    span = deviationDomain(dev, o.stepMs);
    lo = -span;
    hi = span;
  } else {
    [lo, hi] = colorDomain(o.matrix);
  }
  const ctx = canvas.getContext('2d');
  if (ctx && ds.rows && ds.cols) {
    const img = ctx.createImageData(canvas.width, canvas.height);
    // One 32-bit word per pixel from a colour table (little-endian RGBA, as every browser's
    // platform is): no colour maths or array per cell.
    const px = new Uint32Array(img.data.buffer);
    const table = deviation ? divergingTable(257, dark ? [40, 40, 40] : [240, 240, 240]) : rampTable(256);
    const topIdx = table.length - 1;
    const empty = dark ? 0xff181818 : 0xffd0d0d0;
    const scale = topIdx / (hi - lo);
    const w = canvas.width;
    for (let y = 0; y < ds.rows; y++) {
      for (let x = 0; x < ds.cols; x++) {
        const v = ds.values[y * ds.cols + x];
        const word = Number.isFinite(v) ? table[Math.min(topIdx, Math.max(0, Math.round((v - lo) * scale)))] : empty;
        for (let k = top[y]; k < top[y + 1]; k++) px[k * w + x] = word;
      }
    }
    ctx.putImageData(img, 0, 0);
  }

  // The gutter: rank ticks, the marked ranks (labelled with rank and node), the picked row.
  const gutter = h('div', { class: 'heatmap-gutter', style: `height:${height}px` });
  const markYs = marks.map((m) => yOf(m.row));
  const tickEvery = Math.max(1, Math.ceil(rows / Math.max(1, Math.floor(height / 40))));
  for (let r = 0; r < rows; r += tickEvery) {
    const y = yOf(r);
    if (markYs.some((my) => Math.abs(my - y) < LABEL_GAP_PX)) continue;
    gutter.append(h('span', { class: 'heatmap-tick', style: `top:${midOf(r)}px` }, String(o.ranks[r]?.rank ?? r)));
  }
  marks.forEach((m, i) => {
    const rk = o.ranks[m.row];
    const dir = m.sign > 0 ? 'above' : 'below';
    gutter.append(h('span', {
      class: `heatmap-mark ${m.sign > 0 ? 'up' : 'down'}`, 'data-rank': rk?.rank, 'data-node': rk?.node ?? '', 'data-y': markYs[i],
      'data-h': rowH(dsRow(m.row)), style: `top:${midOf(m.row)}px`,
      title: `rank ${rk?.rank} on ${rk?.node}: ${fmtMs(m.score)} ${dir} its steps' medians on average (${o.metricLabel})`,
    }, `rank ${rk?.rank} ▸`));
  });
  if (o.selected !== undefined && o.selected < rows) {
    gutter.append(h('span', { class: 'heatmap-sel-row', style: `top:${midOf(o.selected)}px`, title: `picked: rank ${o.ranks[o.selected]?.rank}` }, '▶'));
  }
  // The hovered pixel row: a notch in the gutter beside it, at least MARK_ROW_PX tall.
  const hoverNotch = h('span', { class: 'heatmap-hover-row', hidden: true });
  gutter.append(hoverNotch);
  const colBar = h('div', { class: 'heatmap-colbar' });
  if (o.selectedCol !== undefined && o.selectedCol < cols) {
    colBar.append(h('span', { class: 'heatmap-sel-col', style: `left:${(100 * (o.selectedCol + 0.5)) / Math.max(1, cols)}%`, title: `picked: step ${o.selectedCol + 1}` }, '▼'));
  }

  const tip = h('div', { class: 'heatmap-tip', id: 'heatmap-tip' }, 'hover a cell for its rank, node and step; click to pick it, double-click for its flame graph');
  // The matrix cell under the mouse: the rank the pixel row shows (its most extreme), and the step.
  const cell = (ev: MouseEvent): [number, number, number] | null => {
    const b = canvas.getBoundingClientRect();
    const py = ((ev.clientY - b.top) / Math.max(1, b.height)) * height;
    const y = py >= 0 && py < height ? dsRowAt(py) : -1;
    const x = Math.floor(((ev.clientX - b.left) / b.width) * ds.cols);
    if (!(y >= 0 && y < ds.rows && x >= 0 && x < ds.cols)) return null;
    const src = ds.source[y * ds.cols + x];
    const row = src >= 0 ? src : ds.rowStart[y];
    const c = ds.colStart[x];
    return [row, c, y];
  };
  canvas.addEventListener('mousemove', (ev) => {
    const rc = cell(ev);
    if (!rc) return;
    const [row, c, y] = rc;
    const v = o.matrix[row]?.[c];
    const rk = o.ranks[row];
    const d = dev[row]?.[c];
    const covers = ds.rowStart[y + 1] - ds.rowStart[y] > 1
      ? ` · this pixel row covers ranks ${o.ranks[ds.rowStart[y]]?.rank}–${o.ranks[ds.rowStart[y + 1] - 1]?.rank} and shows the most extreme`
      : '';
    tip.textContent = `rank ${rk?.rank} on ${rk?.node}, step ${c + 1}: ` +
      (typeof v === 'number' ? `${o.metricLabel} ${fmtMs(v)}` + (typeof d === 'number' ? ` (${d >= 0 ? '+' : '−'}${fmtMs(Math.abs(d))} vs the step's median ${fmtMs(medians[c])})` : '') : 'no data') +
      covers;
    tip.dataset.rank = String(rk?.rank ?? '');
    tip.dataset.node = rk?.node ?? '';
    const nh = Math.max(MARK_ROW_PX, rowH(y));
    hoverNotch.hidden = false;
    hoverNotch.style.top = `${top[y] + rowH(y) / 2 - nh / 2}px`;
    hoverNotch.style.height = `${nh}px`;
  });
  canvas.addEventListener('mouseleave', () => { hoverNotch.hidden = true; });
  canvas.addEventListener('click', (ev) => {
    const rc = cell(ev);
    if (rc && o.onPick) o.onPick(rc[0], rc[1]);
  });
  canvas.addEventListener('dblclick', (ev) => {
    const rc = cell(ev);
    if (rc && o.onOpen) o.onOpen(rc[0], rc[1]);
  });
  const legend = deviation
    ? h('div', { class: 'legend' },
      h('span', {}, `−${fmtMs(span)}`), h('span', { class: 'ramp diverging' }), h('span', {}, `+${fmtMs(span)}`),
      h('span', {}, ` ${o.metricLabel} against the step's median across ${o.mode === 'peer' ? 'the rank\'s peer group' : 'ranks'} (red: more, blue: less)`))
    : h('div', { class: 'legend' },
      h('span', {}, fmtMs(lo)), h('span', { class: 'ramp' }), h('span', {}, fmtMs(hi)), h('span', {}, ` ${o.metricLabel}`));
  const note = rows > ds.rows ? h('span', {}, ` · ${rows} ranks in ${ds.rows} pixel rows: each shows the most extreme rank it covers`) : '';
  return {
    marks,
    el: h('div', { class: 'heatmap-wrap' },
      h('div', { class: 'heatmap-axes' }, h('span', {}, `ranks ${o.ranks[0]?.rank ?? ''}–${o.ranks[rows - 1]?.rank ?? ''} ↓`, note), h('span', {}, `steps 1–${cols} →`)),
      h('div', { class: 'heatmap-body' }, gutter, h('div', { class: 'heatmap-plot' }, colBar, canvas)),
      legend, tip),
  };
}

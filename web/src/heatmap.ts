// Rank x step heatmap on a canvas: one pixel row per rank at 1,000 ranks, one ImageData write, so it
// stays fast where a DOM/SVG cell per value would not.
import { colorDomain, rampTable } from './shape';
import { cssVar, h } from './dom';

export interface HeatmapOptions {
  matrix: (number | null)[][];
  rankLabels: number[];
  unit: string;
  selected?: number;  // row index
  selectedCol?: number;  // column index of the picked cell
  onPick?: (row: number, col: number) => void;
  onOpen?: (row: number, col: number) => void;  // double click
}

export function heatmapCanvas(o: HeatmapOptions): HTMLElement {
  const rows = o.matrix.length;
  const cols = o.matrix.reduce((m, r) => Math.max(m, r.length), 0);
  const [lo, hi] = colorDomain(o.matrix);
  // Rows and columns at least 1 px; the canvas is scaled up by CSS (pixelated) to its box.
  const rowPx = rows <= 100 ? Math.ceil(300 / Math.max(1, rows)) : 1;
  const colPx = cols <= 200 ? Math.ceil(600 / Math.max(1, cols)) : 1;
  const canvas = h('canvas', { class: 'heatmap', width: Math.max(1, cols * colPx), height: Math.max(1, rows * rowPx) });
  canvas.dataset.rows = String(rows);
  canvas.dataset.cols = String(cols);
  const ctx = canvas.getContext('2d');
  if (ctx && rows && cols) {
    const img = ctx.createImageData(canvas.width, canvas.height);
    // One 32-bit word per pixel from a 256-colour table (little-endian RGBA, as every browser's
    // platform is): no colour maths or array per cell.
    const px = new Uint32Array(img.data.buffer);
    const ramp = rampTable(256);
    const empty = cssVar('--empty-cell') === 'dark' ? 0xff282828 : 0xffe6e6e6;
    const scale = 255 / (hi - lo);
    const w = canvas.width;
    for (let r = 0; r < rows; r++) {
      const row = o.matrix[r];
      for (let c = 0; c < cols; c++) {
        const v = row[c];
        let word = empty;
        if (typeof v === 'number' && Number.isFinite(v)) word = ramp[Math.min(255, Math.max(0, Math.round((v - lo) * scale)))];
        for (let y = r * rowPx; y < (r + 1) * rowPx; y++) px.fill(word, y * w + c * colPx, y * w + (c + 1) * colPx);
      }
    }
    ctx.putImageData(img, 0, 0);
    if (o.selected !== undefined && o.selected < rows) {
      ctx.strokeStyle = '#ff2d55';
      ctx.lineWidth = Math.max(1, rowPx / 3);
      ctx.strokeRect(0.5, o.selected * rowPx + 0.5, canvas.width - 1, Math.max(1, rowPx - 1));
      if (o.selectedCol !== undefined && o.selectedCol < cols) {
        // The picked cell: a thin white frame inside the row's, its colour still showing.
        const lw = Math.max(1, Math.floor(Math.min(colPx, rowPx) / 8));
        ctx.strokeStyle = '#ffffff';
        ctx.lineWidth = lw;
        ctx.strokeRect(o.selectedCol * colPx + lw / 2, o.selected * rowPx + lw / 2, Math.max(1, colPx - lw), Math.max(1, rowPx - lw));
      }
    }
  }
  const tip = h('div', { class: 'heatmap-tip' }, 'hover a cell; click to pick it (rank and step), double-click for its flame graph');
  const cell = (ev: MouseEvent) => {
    const b = canvas.getBoundingClientRect();
    const r = Math.floor(((ev.clientY - b.top) / b.height) * rows);
    const c = Math.floor(((ev.clientX - b.left) / b.width) * cols);
    return r >= 0 && r < rows && c >= 0 && c < cols ? [r, c] : null;
  };
  canvas.addEventListener('mousemove', (ev) => {
    const rc = cell(ev);
    if (!rc) return;
    const v = o.matrix[rc[0]][rc[1]];
    tip.textContent = `rank ${o.rankLabels[rc[0]]}, step ${rc[1] + 1}: ${typeof v === 'number' ? v.toFixed(1) + ' ' + o.unit : 'no data'}`;
  });
  canvas.addEventListener('click', (ev) => {
    const rc = cell(ev);
    if (rc && o.onPick) o.onPick(rc[0], rc[1]);
  });
  canvas.addEventListener('dblclick', (ev) => {
    const rc = cell(ev);
    if (rc && o.onOpen) o.onOpen(rc[0], rc[1]);
  });
  const legend = h('div', { class: 'legend' },
    h('span', {}, `${lo.toFixed(1)} ${o.unit}`),
    h('span', { class: 'ramp' }),
    h('span', {}, `${hi.toFixed(1)} ${o.unit}`),
  );
  return h('div', { class: 'heatmap-wrap' },
    h('div', { class: 'heatmap-axes' }, h('span', { class: 'y-label' }, `ranks ${o.rankLabels[0] ?? ''}–${o.rankLabels[rows - 1] ?? ''} ↓`), h('span', {}, `steps 1–${cols} →`)),
    canvas, legend, tip);
}

// Step-time line charts (uPlot: canvas, fast at thousands of points).
import uPlot from 'uplot';
import 'uplot/dist/uPlot.min.css';
import { cssVar, h } from './dom';

export interface Line {
  label: string;
  values: number[];
  color: string;
  dash?: number[];
}

export function lineChart(xs: number[], lines: Line[], opts: { width: number; height: number; sparkline?: boolean }): HTMLElement {
  // Its height is kept from the start: the chart draws a frame later and must not push the page down.
  const el = h('div', { class: opts.sparkline ? 'spark' : 'chart', style: `min-height:${opts.height + (opts.sparkline ? 0 : 40)}px` });
  const fg = cssVar('--fg') || '#222';
  const grid = cssVar('--grid') || '#ddd';
  const axis = { stroke: fg, grid: { stroke: grid, width: 1 }, ticks: { stroke: grid } };
  const data = [xs, ...lines.map((l) => l.values.map((v) => (Number.isFinite(v) ? v : null)))] as uPlot.AlignedData;
  const o: uPlot.Options = {
    width: opts.width,
    height: opts.height,
    legend: { show: !opts.sparkline },
    cursor: { show: !opts.sparkline },
    scales: { x: { time: false } },
    // Steps are whole numbers: ticks at 1, 2, 5, 10, ... steps apart, never at step 2.5.
    axes: opts.sparkline ? [{ show: false }, { show: false }]
      : [{ ...axis, label: 'step', incrs: [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000] }, { ...axis, label: 'ms' }],
    series: [{ label: 'step' }, ...lines.map((l) => ({ label: l.label, stroke: l.color, width: 1.5, dash: l.dash, spanGaps: true }))],
  };
  // uPlot measures its parent: build once attached.
  requestAnimationFrame(() => new uPlot(o, data, el));
  return el;
}

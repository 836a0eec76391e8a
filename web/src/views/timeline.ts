// One rank's timeline: steps, communicators, CPU threads, GPU streams (from the same chrome-trace
// the download link gives Perfetto), drawn on a canvas; pick a step to zoom.
import { api, download } from '../api';
import { cssVar, errorBox, h } from '../dom';
import { fmtMs, traceTracks, type Timeline } from '../shape';
import { formatHash, type UiState } from '../state';

const COLORS: Record<string, string> = {
  step: '#8b5cf6', collective: '#f59e0b', kernel: '#10b981', memcpy: '#3b82f6', memset: '#60a5fa', api: '#ef4444',
};

function draw(canvas: HTMLCanvasElement, tl: Timeline, from: number, to: number): void {
  const ctx = canvas.getContext('2d');
  if (!ctx) return;
  const labelW = 220;
  const rowH = 20;
  const dpr = window.devicePixelRatio || 1;
  const width = canvas.clientWidth || 1000;
  canvas.width = width * dpr;
  canvas.height = (tl.tracks.length * rowH + 24) * dpr;
  canvas.style.height = `${tl.tracks.length * rowH + 24}px`;
  ctx.scale(dpr, dpr);
  const fg = cssVar('--fg') || '#222';
  const grid = cssVar('--grid') || '#ddd';
  ctx.font = '12px system-ui, sans-serif';
  const x = (t: number) => labelW + ((t - from) / Math.max(1, to - from)) * (width - labelW - 8);
  tl.tracks.forEach((tr, i) => {
    const y = i * rowH;
    ctx.fillStyle = fg;
    ctx.fillText(tr.name.length > 32 ? tr.name.slice(0, 31) + '…' : tr.name, 4, y + 14);
    ctx.strokeStyle = grid;
    ctx.beginPath();
    ctx.moveTo(labelW, y + rowH - 0.5);
    ctx.lineTo(width, y + rowH - 0.5);
    ctx.stroke();
    for (const e of tr.events) {
      if (e.end < from || e.start > to) continue;
      const x0 = Math.max(labelW, x(e.start));
      const x1 = Math.min(width - 8, x(e.end));
      ctx.fillStyle = COLORS[e.cat] ?? '#94a3b8';
      ctx.fillRect(x0, y + 3, Math.max(1, x1 - x0), rowH - 6);
      if (x1 - x0 > 60) {
        ctx.fillStyle = '#fff';
        ctx.fillText(e.name.slice(0, Math.floor((x1 - x0) / 7)), x0 + 2, y + 14);
      }
    }
  });
  ctx.fillStyle = fg;
  const yAxis = tl.tracks.length * rowH + 16;
  ctx.fillText(`${fmtMs((from - tl.start) / 1000)}`, labelW, yAxis);
  const endLabel = fmtMs((to - tl.start) / 1000);
  ctx.fillText(endLabel, width - 8 - ctx.measureText(endLabel).width, yAxis);
}

export async function timelineView(main: HTMLElement, s: UiState, go: (s: UiState) => void): Promise<void> {
  const job = s.job ?? '';
  const rank = s.rank ?? 0;
  main.append(h('nav', { class: 'crumbs' }, h('a', { href: '#/' }, 'jobs'), ' / ',
    h('a', { href: formatHash({ view: 'job', job, rank }) }, job || '(unnamed)'), ' / ', `rank ${rank}`),
    h('h1', {}, `Timeline: rank ${rank}`));
  // Fetched with the bearer token (a plain link could not send it), saved from a blob.
  const save = h('button', { class: 'button', id: 'download-trace', type: 'button' }, 'download chrome-trace (open in Perfetto)');
  const saveNote = h('span', { class: 'muted', id: 'download-status' });
  save.addEventListener('click', () => {
    save.disabled = true;
    saveNote.textContent = ' preparing…';
    const file = `strata-${(job || 'job').replace(/[^A-Za-z0-9._-]/g, '_')}-rank${rank}.json`;
    download('timeline', { job, rank, download: 1 }, file)
      .then(() => { saveNote.textContent = ` saved ${file}`; })
      .catch((e) => { saveNote.textContent = ` ${e instanceof Error ? e.message : e}`; })
      .finally(() => { save.disabled = false; });
  });
  const slot = h('div', { class: 'timeline' });
  main.append(slot);
  let tl: Timeline;
  try {
    tl = traceTracks(await api.timeline(job, rank));
  } catch (e) {
    slot.append(errorBox(e));
    return;
  }
  const stepSel = h('select', { id: 'step', onchange: () => go({ ...s, step: stepSel.value ? Number(stepSel.value) : undefined }) },
    h('option', { value: '' }, 'whole recording'),
    tl.steps.map((st) => h('option', { value: st.step, selected: st.step === s.step }, `step ${st.step} (${fmtMs((st.end - st.start) / 1000)})`)));
  const rankIn = h('input', { type: 'number', min: 0, value: rank, onchange: () => go({ ...s, rank: Number(rankIn.value), step: undefined }) });
  main.insertBefore(h('div', { class: 'controls' }, h('label', {}, 'rank ', rankIn), h('label', {}, 'zoom ', stepSel), save, saveNote,
    h('a', { href: formatHash({ view: 'flame', job, rank, diff: true, kind: 'oncpu' }) }, 'differential flame graph')), slot);
  const st = tl.steps.find((x) => x.step === s.step);
  const [from, to] = st ? [st.start, st.end] : [tl.start, tl.end];
  const canvas = h('canvas', { class: 'timeline-canvas' });
  slot.append(canvas, h('p', { class: 'muted' }, `${tl.tracks.length} tracks, ${tl.steps.length} steps. Colours: `,
    Object.entries(COLORS).map(([k, c]) => h('span', { class: 'swatch', style: `background:${c}` }, k))));
  requestAnimationFrame(() => draw(canvas, tl, from, to));
  document.body.dataset.ready = 'timeline';
}

// Data shaping: the REST API's answers turned into what the views draw. Pure functions, no DOM,
// so they are unit-tested (tests/web/shape.test.ts).

// ---- API shapes (server/server.cpp, server/web_api.cpp)

export interface Job {
  job: string;
  world_size: number;
  ranks: number;
  processes: number;
  nodes: string[];
  silent_nodes: string[];
  status: string;
}

// Silent nodes are named up to this many; more become a count (1,000 ranks on 125 nodes).
export const MAX_NAMED_NODES = 3;

// The jobs page's words after the status badge: the silent nodes by name when few, else
// "125 nodes, 3 silent" (the badge says healthy, degraded, or recorded: a store `strata record`
// wrote, which no agent sends to).
export function jobStatusText(j: Pick<Job, 'nodes' | 'silent_nodes' | 'status'>): string {
  const n = j.nodes.length;
  const nodes = `${n} node${n === 1 ? '' : 's'}`;
  if (j.silent_nodes.length === 0) return '';
  if (j.silent_nodes.length <= MAX_NAMED_NODES && n <= MAX_NAMED_NODES) return `silent: ${j.silent_nodes.join(', ')}`;
  return `${nodes}, ${j.silent_nodes.length} silent`;
}

export interface Finding {
  rank: number;
  node: string;
  layer: string;
  cause: string;
  culprit: string;
  lost_ms_per_step: number | null;
  confidence: number | null;
  evidence: string[];
  advice?: string;
}

export interface Diagnosis {
  job: string;
  ranks?: number;
  step_ms?: number | null;
  baseline_step_ms?: number | null;
  healthy?: boolean;
  note?: string;               // the job slowed and nothing explains it, or it waits for late ranks' data
  waiting_for_data?: boolean;
  unexplained?: Unexplained[]; // stragglers no layer explains: no finding, but not healthy either
  findings: Finding[];
  error?: string;
  second_opinion?: { outlier_ranks: number[]; notes: string[]; disagrees: boolean; summary: string };
}

export interface Unexplained {
  rank: number;
  node: string;
  lost_ms_per_step: number;
  text: string;
}

// What the diagnosis says before its findings: 'healthy' only when the engine says so (no finding,
// no note, no unexplained straggler, no wait for late data); else the note, when there is one.
export function diagnosisVerdict(d: Diagnosis): { badge: 'healthy' | 'slowed' | 'waiting' | null; text: string } {
  if (d.error) return { badge: null, text: '' };
  if (d.waiting_for_data) return { badge: 'waiting', text: d.note ?? "waiting for late ranks' data" };
  if (d.note) return { badge: 'slowed', text: d.note };
  const healthy = d.healthy ?? (d.findings.length === 0 && !(d.unexplained?.length));
  if (healthy) return { badge: 'healthy', text: 'no finding: the job runs at its own baseline and its ranks behave alike.' };
  return { badge: null, text: '' };
}

export interface HeatmapRank {
  rank: number;
  pid: number;
  node: string;
  group?: string;  // its peer group (ranks of one parallel role, e.g. a pipeline stage), when known
}

export interface Heatmap {
  job: string;
  // The span whose steps the columns are (unix ns; step 1 is its first): by default the latest 10
  // minutes the store holds. Absent from servers before it.
  from_ns?: number;
  to_ns?: number;
  steps: number;
  step_start_ns: number[];
  step_end_ns?: number[];  // per column, the latest rank's end (servers before it: absent)
  ranks: HeatmapRank[];
  summary?: {
    means: Record<string, (number | null)[]>;  // per-rank means of every series
    os?: Record<string, (number | null)[]>;     // per rank, the OS metrics asked (os=) summed over the span
  };
  series: Record<string, (number | null)[][]>;              // the matrices asked for
}

export type DiffStack = [stack: string, rank: number, peersSum: number];

export interface DiffProfile {
  job: string;
  rank: number;
  kind: string;
  unit: string;
  peers: number;
  stacks: DiffStack[];
  // With a time range: the range asked and the span of the store's windows that cover it (unix ns).
  window?: { from_ns: number; to_ns: number | null; start_ns: number; end_ns: number };
}

export interface MetricRow {
  start_ns: number;
  end_ns: number;
  pid: number;
  name: string;
  label: string;
  value: number;
}

// ---- statistics

export function median(values: readonly number[]): number {
  const v = values.filter((x) => Number.isFinite(x)).sort((a, b) => a - b);
  if (v.length === 0) return NaN;
  const m = v.length >> 1;
  return v.length % 2 ? v[m] : (v[m - 1] + v[m]) / 2;
}

// Linear-interpolated quantile (q in 0..1) of the finite values.
export function quantile(values: readonly number[], q: number): number {
  const v = values.filter((x) => Number.isFinite(x)).sort((a, b) => a - b);
  if (v.length === 0) return NaN;
  const pos = Math.min(1, Math.max(0, q)) * (v.length - 1);
  const lo = Math.floor(pos);
  const hi = Math.ceil(pos);
  return v[lo] + (v[hi] - v[lo]) * (pos - lo);
}

export function mean(values: readonly (number | null | undefined)[]): number {
  let s = 0;
  let n = 0;
  for (const x of values) {
    if (typeof x === 'number' && Number.isFinite(x)) {
      s += x;
      n++;
    }
  }
  return n ? s / n : NaN;
}

// ---- heatmap and step-time trend

// The job's step time per step: the median over ranks of each column.
export function stepTrend(matrix: readonly (number | null)[][]): number[] {
  const columns = matrix.reduce((m, row) => Math.max(m, row.length), 0);
  const out: number[] = [];
  // One typed buffer for every column: typed arrays sort numerically, without a comparator call per
  // pair (1,000 ranks x 60 steps is most of the job page's own work otherwise).
  const col = new Float64Array(matrix.length);
  for (let c = 0; c < columns; c++) {
    let n = 0;
    for (const row of matrix) {
      const v = row[c];
      if (typeof v === 'number' && Number.isFinite(v)) col[n++] = v;
    }
    out.push(sortedQuantile(col.subarray(0, n).sort(), 0.5));
  }
  return out;
}

// Linear-interpolated quantile of values sorted ascending (NaN when empty).
function sortedQuantile(v: ArrayLike<number>, q: number): number {
  if (v.length === 0) return NaN;
  const pos = Math.min(1, Math.max(0, q)) * (v.length - 1);
  const lo = Math.floor(pos);
  const hi = Math.ceil(pos);
  return v[lo] + (v[hi] - v[lo]) * (pos - lo);
}

// The colour range of a heatmap: robust to one wild cell (p1..p99), never empty.
// The first `skipColumns` steps (start-up: the first steps of a job are slow) are left out when
// there are enough others, so they do not wash out the rest.
export function colorDomain(matrix: readonly (number | null)[][], skipColumns = 2): [number, number] {
  const cols = matrix.reduce((m, r) => Math.max(m, r.length), 0);
  const skip = cols > 3 * skipColumns ? skipColumns : 0;
  let n = 0;
  for (const row of matrix) n += Math.max(0, row.length - skip);
  const all = new Float64Array(n);
  n = 0;
  for (const row of matrix)
    for (let c = skip; c < row.length; c++) {
      const v = row[c];
      if (typeof v === 'number' && Number.isFinite(v)) all[n++] = v;
    }
  if (n === 0) return [0, 1];
  const sorted = all.subarray(0, n).sort();  // once, for both quantiles
  let lo = sortedQuantile(sorted, 0.01);
  let hi = sortedQuantile(sorted, 0.99);
  if (!(hi > lo)) {
    lo = sorted[0];
    hi = sorted[n - 1];
  }
  if (!(hi > lo)) hi = lo + 1;
  return [lo, hi];
}

// Sequential colour ramp (viridis-like, readable on light and dark), t in 0..1, as [r, g, b].
const RAMP: [number, number, number][] = [
  [68, 1, 84],
  [59, 82, 139],
  [33, 145, 140],
  [94, 201, 98],
  [253, 231, 37],
];
// The ramp in `steps` colours, as little-endian RGBA words for a Uint32Array over ImageData.
export function rampTable(steps = 256): Uint32Array {
  const out = new Uint32Array(steps);
  for (let i = 0; i < steps; i++) {
    const [r, g, b] = rampColor(i / (steps - 1));
    out[i] = (255 << 24) | (b << 16) | (g << 8) | r;
  }
  return out;
}

export function rampColor(t: number): [number, number, number] {
  if (!Number.isFinite(t)) return [128, 128, 128];
  const x = Math.min(1, Math.max(0, t)) * (RAMP.length - 1);
  const i = Math.min(RAMP.length - 2, Math.floor(x));
  const f = x - i;
  const a = RAMP[i];
  const b = RAMP[i + 1];
  return [0, 1, 2].map((k) => Math.round(a[k] + (b[k] - a[k]) * f)) as [number, number, number];
}

// ---- straggler view: each cell against its step's median across ranks

// In synchronous training every rank's step takes as long as the slowest one's, so the step time
// shows no straggler; what differs is how the step is spent. The straggler computes longest and so
// waits least in the collectives: `compute` = step time minus collective wait is the default metric.
export function computeMatrix(step: readonly (number | null)[][], wait: readonly (number | null)[][] | undefined): (number | null)[][] {
  return step.map((row, r) => row.map((v, c) => {
    if (typeof v !== 'number' || !Number.isFinite(v)) return null;
    const w = wait?.[r]?.[c];
    return v - (typeof w === 'number' && Number.isFinite(w) ? w : 0);
  }));
}

// A peer group smaller than this is compared with every rank instead: a rank alone in its group
// would be its own median (0 in every step), hiding whatever it does.
export const MIN_PEER_GROUP = 2;

// Each cell minus its column's (step's) median over ranks: 0 = a typical rank in that step, so a
// job-wide slowdown (every rank slower from step N) cancels out and only the rank that differs shows.
// With `groups` (a peer group per row, e.g. pipeline stages whose steps differ by design), each
// cell is against that step's median over its own group; rows without a group, or in a group of
// fewer than MIN_PEER_GROUP, against every rank. `medians` stays the job-wide one.
export function deviationMatrix(matrix: readonly (number | null)[][], groups?: readonly (string | undefined)[]):
{ dev: (number | null)[][]; medians: number[] } {
  const medians = stepTrend(matrix);
  const rowMedians: (readonly number[])[] = matrix.map(() => medians);
  if (groups) {
    const members = new Map<string, number[]>();
    groups.forEach((g, i) => {
      if (g === undefined || i >= matrix.length) return;
      let m = members.get(g);
      if (!m) members.set(g, (m = []));
      m.push(i);
    });
    for (const rows of members.values()) {
      if (rows.length < MIN_PEER_GROUP) continue;
      const groupMedians = stepTrend(rows.map((i) => matrix[i]));
      for (const i of rows) rowMedians[i] = groupMedians;
    }
  }
  const dev = matrix.map((row, r) => row.map((v, c) => {
    const m = rowMedians[r][c];
    return typeof v === 'number' && Number.isFinite(v) && Number.isFinite(m) ? v - m : null;
  }));
  return { dev, medians };
}

// The deviation colour scale never spans less than this share of the job's step time either side of
// 0: on a healthy job the scale would otherwise stretch to its noise and paint noise as strongly as a
// real straggler.
export const MIN_DEVIATION_SHARE = 0.05;
// A rank is marked (labelled beside the heatmap) when its mean |deviation| is this many robust
// standard deviations (MAD) from the other ranks' — the breakdown's outlier threshold...
export const MARK_Z = 3.5;
// ...and at least this share of the job's step time (robust z alone marks noise on a quiet job).
export const MIN_MARK_SHARE = 0.02;
// At most this many marked ranks are labelled: the worst ones; more labels would cover each other.
export const MAX_MARKS = 8;

// The symmetric colour range [-d, d] of a deviation matrix: its 99th percentile |deviation| (one
// straggler among many ranks then saturates) but at least MIN_DEVIATION_SHARE of the step time.
export function deviationDomain(dev: readonly (number | null)[][], stepMs: number): number {
  const abs: number[] = [];
  for (const row of dev) for (const v of row) if (typeof v === 'number' && Number.isFinite(v)) abs.push(Math.abs(v));
  const floor = Number.isFinite(stepMs) && stepMs > 0 ? MIN_DEVIATION_SHARE * stepMs : 1;
  return Math.max(quantile(abs, 0.99) || 0, floor);
}

// The job's step time, one number everywhere (jobs page, job page, breakdown): the median over ranks
// of each rank's median step time over the whole recording.
export function jobStepMs(step: readonly (number | null)[][]): number {
  return median(step.map((row) => median(row.filter((v): v is number => typeof v === 'number'))));
}

export interface RankMark {
  row: number;
  score: number;  // mean |deviation| over the rank's steps
  sign: number;   // +1 above its steps' medians on average, -1 below
}

// The ranks that stand out of a deviation matrix, worst first (see MARK_Z, MIN_MARK_SHARE).
export function markedRows(dev: readonly (number | null)[][], stepMs: number): RankMark[] {
  const score = dev.map((row) => mean(row.map((v) => (typeof v === 'number' ? Math.abs(v) : null))));
  const signed = dev.map((row) => mean(row));
  const z = robustZ(score);
  const floor = Number.isFinite(stepMs) ? MIN_MARK_SHARE * stepMs : 0;
  const out: RankMark[] = [];
  score.forEach((s, row) => {
    if (z[row] > MARK_Z && s >= floor) out.push({ row, score: s, sign: signed[row] < 0 ? -1 : 1 });
  });
  return out.sort((a, b) => b.score - a.score).slice(0, MAX_MARKS);
}

// `outRows` pixel rows over the matrix's rows (ranks) and `outCols` over its columns: a pixel that
// covers several cells shows the most extreme one (farthest from its column's `center`: 0 for a
// deviation matrix), never an average or a skipped row, so one straggler among 10,000 ranks keeps
// its colour. `source` holds the matrix row each pixel shows (-1: no value), for the hover.
export interface Downsampled {
  rows: number;
  cols: number;
  values: Float64Array;  // rows x cols, NaN = no value
  source: Int32Array;
  rowStart: Int32Array;  // pixel row y covers matrix rows [rowStart[y], rowStart[y + 1])
  colStart: Int32Array;
}

function spans(n: number, out: number): Int32Array {
  const s = new Int32Array(out + 1);
  for (let i = 0; i <= out; i++) s[i] = Math.floor((i * n) / out);
  return s;
}

export function downsampleExtreme(
  matrix: readonly (number | null)[][], outRows: number, outCols: number, center?: readonly number[],
): Downsampled {
  const rows = matrix.length;
  const cols = matrix.reduce((m, r) => Math.max(m, r.length), 0);
  const R = Math.max(0, Math.min(rows, outRows));
  const C = Math.max(0, Math.min(cols, outCols));
  const rowStart = spans(rows, R);
  const colStart = spans(cols, C);
  const values = new Float64Array(R * C).fill(NaN);
  const source = new Int32Array(R * C).fill(-1);
  for (let y = 0; y < R; y++) {
    for (let x = 0; x < C; x++) {
      let best = -1;
      let bestV = NaN;
      let bestRow = -1;
      for (let r = rowStart[y]; r < rowStart[y + 1]; r++) {
        const row = matrix[r];
        for (let c = colStart[x]; c < colStart[x + 1]; c++) {
          const v = row[c];
          if (typeof v !== 'number' || !Number.isFinite(v)) continue;
          const d = Math.abs(v - (center?.[c] ?? 0));
          if (d > best) {
            best = d;
            bestV = v;
            bestRow = r;
          }
        }
      }
      values[y * C + x] = bestV;
      source[y * C + x] = bestRow;
    }
  }
  return { rows: R, cols: C, values, source, rowStart, colStart };
}

// A marked or picked rank's pixel row is drawn at least this tall (CSS px): past 200 ranks a row is
// 1 px, a hairline a person misses beside its label (issue 19: rank 137 of 1,000 was one red pixel row).
export const MARK_ROW_PX = 3;

// The heatmap's pixel rows: `outRows` rows over `rows` ranks (downsampleExtreme's spans), each
// `rowPx` tall except the ones holding a `special` rank (marked or picked), which are MARK_ROW_PX
// tall; all of them fit `maxPx`. The extra pixels come out of the downsampling (a few more ranks
// share a pixel row), never out of a neighbour's row: nothing is drawn over another rank's data.
// `top[y]` is pixel row y's first CSS px, `top[outRows]` the height.
export interface RowLayout {
  outRows: number;
  rowPx: number;
  rowStart: Int32Array;
  top: Int32Array;
}

export function heatmapRowLayout(rows: number, special: readonly number[], maxPx: number): RowLayout {
  let rowPx = rows > 0 && rows <= maxPx ? Math.max(1, Math.floor(Math.min(maxPx, Math.max(160, rows * 24)) / rows)) : 1;
  const inRange = [...new Set(special.filter((r) => r >= 0 && r < rows))];
  let outRows = Math.min(rows, maxPx);
  if (rowPx < MARK_ROW_PX && outRows * rowPx + inRange.length * (MARK_ROW_PX - rowPx) > maxPx) {
    rowPx = 1;
    outRows = Math.max(1, Math.min(rows, maxPx - inRange.length * (MARK_ROW_PX - 1)));
  }
  if (rows === 0) outRows = 0;
  const rowStart = spans(rows, outRows);
  const tall = new Set<number>();
  for (const r of inRange) {
    let lo = 0;
    let hi = outRows - 1;
    while (lo < hi) {
      const mid = (lo + hi + 1) >> 1;
      if (rowStart[mid] <= r) lo = mid;
      else hi = mid - 1;
    }
    tall.add(lo);
  }
  const top = new Int32Array(outRows + 1);
  for (let y = 0; y < outRows; y++) top[y + 1] = top[y] + (tall.has(y) ? Math.max(rowPx, MARK_ROW_PX) : rowPx);
  return { outRows, rowPx, rowStart, top };
}

// Diverging ramp for deviations, t in -1..1: blue (below the step's median), a neutral middle, red
// (above), as little-endian RGBA words. `neutral` is the page's background tone (light or dark).
export function divergingTable(steps = 257, neutral: [number, number, number] = [240, 240, 240]): Uint32Array {
  const out = new Uint32Array(steps);
  const blue: [number, number, number] = [33, 102, 172];
  const red: [number, number, number] = [214, 39, 40];
  for (let i = 0; i < steps; i++) {
    const t = (2 * i) / (steps - 1) - 1;
    const [r, g, b] = divergingColor(t, neutral, blue, red);
    out[i] = (255 << 24) | (b << 16) | (g << 8) | r;
  }
  return out;
}

export function divergingColor(
  t: number, neutral: [number, number, number] = [240, 240, 240],
  blue: [number, number, number] = [33, 102, 172], red: [number, number, number] = [214, 39, 40],
): [number, number, number] {
  if (!Number.isFinite(t)) return [128, 128, 128];
  const x = Math.min(1, Math.max(-1, t));
  const to = x < 0 ? blue : red;
  const f = Math.abs(x);
  return [0, 1, 2].map((k) => Math.round(neutral[k] + (to[k] - neutral[k]) * f)) as [number, number, number];
}

// The step (1-based) where a rank's deviation is largest; 1 without values.
export function worstStep(devRow: readonly (number | null)[]): number {
  let best = -1;
  let at = 0;
  devRow.forEach((v, c) => {
    if (typeof v === 'number' && Math.abs(v) > best) {
      best = Math.abs(v);
      at = c;
    }
  });
  return at + 1;
}

// How many typical peers the cross-rank timeline shows beside the rank it is opened for.
export const TIMELINE_PEERS = 3;

// The cross-rank timeline's default ranks: `rank` first, then the TIMELINE_PEERS ranks whose median
// compute is closest to the job's (typical peers, not other outliers), in rank order.
export function defaultTimelineRanks(h: Heatmap, rank: number): number[] {
  const step = h.series.step_ms ?? [];
  const compute = computeMatrix(step, h.series.collective_ms);
  const per = compute.map((row) => median(row.filter((v): v is number => typeof v === 'number')));
  const mid = median(per);
  const peers = h.ranks
    .map((r, i) => ({ rank: r.rank, d: Math.abs(per[i] - mid) }))
    .filter((x) => x.rank !== rank && Number.isFinite(x.d))
    .sort((a, b) => a.d - b.d || a.rank - b.rank)
    .slice(0, TIMELINE_PEERS)
    .map((x) => x.rank)
    .sort((a, b) => a - b);
  return [rank, ...peers];
}

// ---- time windows (the flame graph of a rank in a window of the run)

// Unix ns as the decimal string the API and the URL carry (JS numbers print 1e21 and up in
// exponent form; below, String() is exact for the integer the number holds).
export function nsString(ns: number): string {
  return BigInt(Math.max(0, Math.round(ns))).toString();
}

export interface TimeRange {
  from: string;  // unix ns, inclusive
  to: string;    // unix ns, exclusive
}

// Steps `first`..`last` (column indexes) as a time range: from the first's start (the earliest
// rank's) to the last's end (the latest rank's), so every rank's steps are inside. Without ends (an
// older server), the next step's start, or for the last step its start plus `lastMs`.
export function stepsRange(
  h: Pick<Heatmap, 'step_start_ns' | 'step_end_ns'>, first: number, last: number, lastMs = 0,
): TimeRange | null {
  const starts = h.step_start_ns;
  if (!(first >= 0 && last >= first && last < starts.length) || !(starts[first] > 0)) return null;
  const from = starts[first];
  let to = h.step_end_ns?.[last] ?? 0;
  if (!(to > from)) to = last + 1 < starts.length ? starts[last + 1] : starts[last] + Math.max(0, lastMs) * 1e6;
  if (!(to > from)) to = from + 1e6;
  return { from: nsString(Math.floor(from)), to: nsString(Math.ceil(to)) };
}

// The time range of one heatmap cell: its step (column), every rank's run of it.
export function cellRange(h: Pick<Heatmap, 'step_start_ns' | 'step_end_ns' | 'series'>, row: number, col: number): TimeRange | null {
  const v = h.series.step_ms?.[row]?.[col];
  return stepsRange(h, col, col, typeof v === 'number' ? v : 0);
}

// The steps (1-based, first..last) a time range covers, for the window picker; null without steps.
// It undoes stepsRange: the first step starts at or before `from`; the last is the latest that has
// ended by `to` (every rank), or without ends, the latest that starts before `to`.
export function rangeSteps(h: Pick<Heatmap, 'step_start_ns' | 'step_end_ns'>, r: Partial<TimeRange>): [number, number] | null {
  const starts = h.step_start_ns;
  if (starts.length === 0) return null;
  const from = r.from !== undefined ? Number(r.from) : -Infinity;
  const to = r.to !== undefined ? Number(r.to) : Infinity;
  let first = 0;
  while (first + 1 < starts.length && starts[first + 1] <= from) first++;
  let last = first;
  const ends = h.step_end_ns;
  if (ends && ends.length === starts.length) {
    for (let i = first + 1; i < starts.length && starts[i] < to; i++) if (ends[i] <= to) last = i;
  } else {
    while (last + 1 < starts.length && starts[last + 1] < to) last++;
  }
  return [first + 1, last + 1];
}

// "12:00:05.120–12:00:05.320 UTC (0.20 s)": a range of unix ns, readable.
export function fmtRange(fromNs: number, toNs: number): string {
  const t = (ns: number) => new Date(ns / 1e6).toISOString().slice(11, 23);
  return `${t(fromNs)}–${t(toNs)} UTC (${((toNs - fromNs) / 1e9).toFixed(2)} s)`;
}

// The rank's own total in a diff profile (samples or µs): the first column.
export function rankTotal(d: Pick<DiffProfile, 'stacks'>): number {
  let t = 0;
  for (const [, r] of d.stacks) t += r;
  return t;
}

// ---- per-rank breakdown

export interface RankBreakdown {
  rank: number;
  pid: number;
  node: string;
  steps: number;
  step_ms: number;        // median step time (or the server's mean without the matrices)
  collective_ms: number;  // median time inside collectives (waiting for peers, or moving data)
  compute_ms: number;     // step time not in collectives: compute, data loading, the host's own work
  gpu_compute_ms: number; // device compute per step (NaN when no GPU timing source)
  gpu_idle_ms: number;    // GPU idle per step (NaN when unknown)
  os: Record<string, number>;  // OS metrics per step (see OS_METRICS)
}

// OS metrics shown per rank, summed over windows and labels and divided by the rank's steps.
export const OS_METRICS: { name: string; label: string; scale: number; unit: string }[] = [
  { name: 'os.cpu_time_us', label: 'on-CPU', scale: 1e-3, unit: 'ms' },
  { name: 'os.runq_wait_us', label: 'run-queue wait', scale: 1e-3, unit: 'ms' },
  { name: 'os.cgroup_throttled_us', label: 'throttled', scale: 1e-3, unit: 'ms' },
  { name: 'os.blocked_us', label: 'blocked', scale: 1e-3, unit: 'ms' },
  { name: 'os.irq_time_us', label: 'IRQ', scale: 1e-3, unit: 'ms' },
  { name: 'os.softirq_time_us', label: 'softirq', scale: 1e-3, unit: 'ms' },
  { name: 'os.direct_reclaim_us', label: 'reclaim', scale: 1e-3, unit: 'ms' },
  { name: 'os.major_faults', label: 'major faults', scale: 1, unit: '' },
  { name: 'os.involuntary_switches', label: 'invol. switches', scale: 1, unit: '' },
];

// The OS metrics of each heatmap row (by row index: pids repeat across nodes), in the units of
// OS_METRICS, from the sums over the heatmap's span the server added (`os=`).
export function osTotalsOf(h: Pick<Heatmap, 'summary'>): Map<number, Record<string, number>> {
  const out = new Map<number, Record<string, number>>();
  for (const m of OS_METRICS) {
    const row = h.summary?.os?.[m.name];
    if (!row) continue;
    row.forEach((v, i) => {
      if (typeof v !== 'number' || !Number.isFinite(v)) return;
      let o = out.get(i);
      if (!o) out.set(i, (o = {}));
      o[m.name] = v * m.scale;
    });
  }
  return out;
}

export function rankBreakdown(h: Heatmap, os?: Map<number, Record<string, number>>): RankBreakdown[] {
  // Per rank, the median over its steps (the job's step time is a median of these, jobStepMs): from
  // the matrices when the page asked for them, else the server's per-rank means.
  const rowMedian = (row: readonly (number | null)[] | undefined): number =>
    median((row ?? []).filter((v): v is number => typeof v === 'number'));
  const typical = (name: string, i: number): number => {
    const m = h.series[name];
    if (m) return rowMedian(m[i]);
    const s = h.summary?.means?.[name];
    return s && typeof s[i] === 'number' ? (s[i] as number) : NaN;
  };
  const step = h.series.step_ms;
  const compute = step ? computeMatrix(step, h.series.collective_ms) : undefined;
  return h.ranks.map((r, i) => {
    const steps = step ? (step[i] ?? []).filter((x) => typeof x === 'number').length : h.steps;
    const step_ms = typical('step_ms', i);
    const collective_ms = typical('collective_ms', i);
    const totals = os?.get(i) ?? {};
    const perStep: Record<string, number> = {};
    for (const [k, v] of Object.entries(totals)) perStep[k] = steps ? v / steps : NaN;
    return {
      rank: r.rank,
      pid: r.pid,
      node: r.node,
      steps,
      step_ms,
      collective_ms,
      compute_ms: compute ? rowMedian(compute[i]) : step_ms - (Number.isFinite(collective_ms) ? collective_ms : 0),
      gpu_compute_ms: typical('gpu_compute_ms', i),
      gpu_idle_ms: typical('gpu_idle_ms', i),
      os: perStep,
    };
  });
}

// How far each rank's value sits from the job's median, in robust z (MAD) units.
export function robustZ(values: readonly number[]): number[] {
  const m = median(values);
  const mad = median(values.map((v) => Math.abs(v - m)));
  const scale = mad > 0 ? 1.4826 * mad : Math.max(Math.abs(m) * 0.01, 1e-9);
  return values.map((v) => (Number.isFinite(v) ? (v - m) / scale : NaN));
}

// ---- flame graphs

export interface FlameNode {
  name: string;
  value: number;      // inclusive (this frame and its callees), as d3-flame-graph reads it
  delta?: number;     // self delta (rank minus the average peer); d3-flame-graph sums it up
  deltaTotal?: number; // inclusive delta (this frame and its callees), set by diffTree
  children: FlameNode[];
}

// "a;b;c 12" lines (DESIGN §8 folded) -> [stack, count]; malformed lines are skipped.
export function parseFolded(text: string): [string, number][] {
  const out: [string, number][] = [];
  for (const line of text.split('\n')) {
    const t = line.trimEnd();
    const sp = t.lastIndexOf(' ');
    if (sp <= 0) continue;
    const n = Number(t.slice(sp + 1));
    if (!Number.isFinite(n) || n <= 0) continue;
    out.push([t.slice(0, sp), n]);
  }
  return out;
}

// Builds the call tree. With `deltas`, each stack carries the self delta of its leaf.
export function buildFlameTree(
  stacks: readonly { stack: string; value: number; delta?: number }[],
  rootName = 'all',
): FlameNode {
  const root: FlameNode = { name: rootName, value: 0, children: [] };
  const index = new Map<FlameNode, Map<string, FlameNode>>();
  const childOf = (parent: FlameNode, name: string): FlameNode => {
    let m = index.get(parent);
    if (!m) index.set(parent, (m = new Map()));
    let c = m.get(name);
    if (!c) {
      c = { name, value: 0, children: [] };
      parent.children.push(c);
      m.set(name, c);
    }
    return c;
  };
  for (const s of stacks) {
    if (!(s.value > 0) && !(s.delta && s.delta !== 0)) continue;
    let node = root;
    node.value += s.value;
    for (const frame of s.stack.split(';')) {
      node = childOf(node, frame);
      node.value += s.value;
    }
    if (s.delta !== undefined) node.delta = (node.delta ?? 0) + s.delta;
  }
  return root;
}

// The differential tree of one rank against its average peer: widths are the rank's samples,
// colour the difference (red: more on this rank, blue: less).
export function diffTree(d: DiffProfile): FlameNode {
  const peers = Math.max(1, d.peers);
  const stacks = d.stacks
    .filter(([, r]) => r > 0)
    .map(([stack, r, p]) => ({ stack, value: r, delta: r - p / peers }));
  const root = buildFlameTree(stacks, `rank ${d.rank} vs ${d.peers} peer${d.peers === 1 ? '' : 's'}`);
  root.delta = root.delta ?? 0;
  const total = (n: FlameNode): number => {
    n.deltaTotal = (n.delta ?? 0) + n.children.reduce((sum, c) => sum + total(c), 0);
    return n.deltaTotal;
  };
  total(root);
  return root;
}

// The largest |inclusive delta| of any frame below the root: the diff colour scale's full red/blue.
export function maxAbsDelta(root: FlameNode): number {
  let m = 0;
  const walk = (n: FlameNode) => {
    for (const c of n.children) {
      m = Math.max(m, Math.abs(c.deltaTotal ?? 0));
      walk(c);
    }
  };
  walk(root);
  return m;
}

// A diff frame's colour from its inclusive delta against the graph's largest: red where the rank
// spends more than its average peer, blue where less, grey only where they match. A function that
// only this rank runs has its whole width as delta, so it is as red as its size says.
export function diffColor(delta: number, maxAbs: number): string {
  const t = maxAbs > 0 ? Math.max(-1, Math.min(1, delta / maxAbs)) : 0;
  const [r, g, b] = divergingColor(t, [221, 221, 221], [33, 102, 172], [214, 39, 40]);
  return `rgb(${r},${g},${b})`;
}

// A function's name short enough for a table cell: no "(anonymous namespace)::", no argument list
// or clone suffix ("cpu_work(unsigned char const*, long) [clone .isra.0]" -> "cpu_work"). The full
// name stays in the cell's title.
export function shortName(name: string): string {
  const s = name.replace(/^\(anonymous namespace\)::/, '');
  const paren = s.indexOf('(');
  return paren > 0 ? s.slice(0, paren) : s;
}

export interface FunctionRow {
  name: string;
  self: number;       // samples (or µs) with the function as the leaf, on the rank
  total: number;      // inclusive, counted once per stack (recursion), on the rank
  peerSelf: number;   // the same on the average peer (0 without peers)
  peerTotal: number;
}

// Every function's self and total on the rank (and its average peer), for the flame page's table.
export function functionTable(d: Pick<DiffProfile, 'stacks' | 'peers'>): FunctionRow[] {
  const peers = Math.max(1, d.peers);
  const acc = new Map<string, FunctionRow>();
  const row = (f: string) => {
    let e = acc.get(f);
    if (!e) acc.set(f, (e = { name: f, self: 0, total: 0, peerSelf: 0, peerTotal: 0 }));
    return e;
  };
  for (const [stack, r, p] of d.stacks) {
    const frames = stack.split(';');
    const leaf = row(frames[frames.length - 1]);
    leaf.self += r;
    leaf.peerSelf += p / peers;
    for (const f of new Set(frames)) {
      const e = row(f);
      e.total += r;
      e.peerTotal += p / peers;
    }
  }
  return [...acc.values()].filter((e) => e.total > 0 || e.peerTotal > 0);
}

// Sort keys of the function table: Δ self (the rank's self time minus the average peer's) puts the
// function that does the extra work first; Δ total puts its callers first too (each contains it).
export type FunctionSort = 'name' | 'self' | 'total' | 'selfDelta' | 'delta';

export function sortFunctions(rows: FunctionRow[], by: FunctionSort, desc = true): FunctionRow[] {
  const key = (e: FunctionRow): number =>
    by === 'self' ? e.self : by === 'total' ? e.total : by === 'selfDelta' ? e.self - e.peerSelf : e.total - e.peerTotal;
  const out = [...rows];
  out.sort((a, b) => {
    if (by === 'name') return desc ? b.name.localeCompare(a.name) : a.name.localeCompare(b.name);
    const d = desc ? key(b) - key(a) : key(a) - key(b);
    // Ties: by self (the function that does the work), then by name, so the order is stable.
    return d || b.self - a.self || a.name.localeCompare(b.name);
  });
  return out;
}

// The differential profile of one rank against itself in a baseline range (slow steps vs baseline
// steps): the stacks of `now` beside those of `base` scaled by the ratio of the spans the two cover
// (stacks are kept per store window, so the spans are whole windows), as one "peer". The flame
// page then draws and ranks it as it does rank vs peers.
export function selfDiff(now: DiffProfile, base: DiffProfile): DiffProfile {
  const span = (d: DiffProfile) => (d.window && d.window.end_ns > d.window.start_ns ? d.window.end_ns - d.window.start_ns : NaN);
  const ratio = span(now) / span(base);
  const scale = Number.isFinite(ratio) && ratio > 0 ? ratio : 1;
  const acc = new Map<string, [number, number]>();
  for (const [stack, r] of now.stacks) acc.set(stack, [r, 0]);
  for (const [stack, r] of base.stacks) {
    const e = acc.get(stack) ?? [0, 0];
    e[1] += r * scale;
    acc.set(stack, e);
  }
  return { ...now, peers: 1, stacks: [...acc.entries()].map(([stack, [r, b]]) => [stack, r, b] as DiffStack) };
}

export interface FunctionDelta {
  name: string;
  rank: number;   // inclusive samples (or µs) on the rank
  peer: number;   // inclusive on the average peer
  delta: number;  // rank - peer
  selfDelta: number;  // the same for its self (leaf) time
  depth: number;  // its deepest position in a stack (0 = root frame)
}

// Functions ranked by how much more time the rank spends in them (inclusive, once per stack) than
// its average peer: the culprit function tops the list.
export function functionDeltas(d: DiffProfile, limit = 15): FunctionDelta[] {
  const peers = Math.max(1, d.peers);
  const acc = new Map<string, FunctionDelta>();
  const below = new Map<string, Set<string>>();  // function -> functions it calls (in any stack)
  for (const [stack, r, p] of d.stacks) {
    const frames = stack.split(';');
    const seen = new Set<string>();
    frames.forEach((f, i) => {
      let b = below.get(f);
      if (!b) below.set(f, (b = new Set()));
      for (let k = i + 1; k < frames.length; k++) if (frames[k] !== f) b.add(frames[k]);
      let e = acc.get(f);
      if (!e) acc.set(f, (e = { name: f, rank: 0, peer: 0, delta: 0, selfDelta: 0, depth: 0 }));
      e.depth = Math.max(e.depth, i);
      if (i === frames.length - 1) e.selfDelta += r - p / peers;
      if (seen.has(f)) return;
      seen.add(f);
      e.rank += r;
      e.peer += p / peers;
    });
  }
  const all = [...acc.values()];
  for (const e of all) e.delta = e.rank - e.peer;
  // Callers (main, start_thread) contain their callees' gain: a function whose gain is mostly one
  // of its callees' goes after the callee, so the function that does the work tops the list.
  const dominated = (e: FunctionDelta) =>
    e.delta > 0 && [...(below.get(e.name) ?? [])].some((c) => (acc.get(c)?.delta ?? 0) >= 0.9 * e.delta);
  const dom = new Map(all.map((e) => [e, dominated(e)]));
  const group = (e: FunctionDelta) => (e.delta > 0 ? (dom.get(e) ? 1 : 0) : 2);
  // Equal deltas (a call chain that gained as a whole): the one with more self gain first, then the
  // deeper one (nearer the work), then by name so the order never depends on the input's.
  all.sort((a, b) => group(a) - group(b) || b.delta - a.delta || b.selfDelta - a.selfDelta ||
    b.depth - a.depth || a.name.localeCompare(b.name));
  return all.slice(0, limit);
}

// ---- timeline (chrome-trace JSON from /api/v1/timeline)

export interface TraceEvent {
  ph: string;
  pid: number;
  tid: number;
  name: string;
  cat?: string;
  ts?: number;
  dur?: number;
  args?: Record<string, unknown>;
}

export interface Track {
  key: string;
  name: string;
  sort: number;
  events: { name: string; cat: string; start: number; end: number; args?: Record<string, unknown> }[];
}

export interface Timeline {
  tracks: Track[];
  start: number;  // µs
  end: number;
  steps: { step: number; start: number; end: number }[];
}

export function traceTracks(trace: { traceEvents: TraceEvent[] }): Timeline {
  const names = new Map<string, string>();
  const sorts = new Map<string, number>();
  const tracks = new Map<string, Track>();
  let start = Infinity;
  let end = -Infinity;
  const steps: Timeline['steps'] = [];
  for (const e of trace.traceEvents) {
    const key = `${e.pid}/${e.tid}`;
    if (e.ph === 'M') {
      if (e.name === 'thread_name') names.set(key, String(e.args?.name ?? key));
      if (e.name === 'thread_sort_index') sorts.set(key, Number(e.args?.sort_index ?? 0));
      continue;
    }
    if (e.ph !== 'X' || e.ts === undefined) continue;
    const s = e.ts;
    const t = e.ts + (e.dur ?? 0);
    start = Math.min(start, s);
    end = Math.max(end, t);
    let tr = tracks.get(key);
    if (!tr) tracks.set(key, (tr = { key, name: key, sort: 0, events: [] }));
    tr.events.push({ name: e.name, cat: e.cat ?? '', start: s, end: t, args: e.args });
    if (e.cat === 'step') steps.push({ step: Number(e.args?.step ?? steps.length + 1), start: s, end: t });
  }
  const list = [...tracks.values()];
  for (const t of list) {
    t.name = names.get(t.key) ?? t.key;
    // CPU threads have no sort index: after steps and communicators, before GPU streams.
    t.sort = sorts.get(t.key) ?? 7;
    t.events.sort((a, b) => a.start - b.start);
  }
  list.sort((a, b) => a.sort - b.sort || a.name.localeCompare(b.name));
  steps.sort((a, b) => a.start - b.start);
  return { tracks: list, start: Number.isFinite(start) ? start : 0, end: Number.isFinite(end) ? end : 0, steps };
}

// ---- cross-rank timeline: one trace of several ranks (/api/v1/timeline?ranks=...), one time axis

export interface RankLane {
  pid: number;
  name: string;       // "rank 137 (pid 4242, python3)"
  rank: number;       // -1 when the process is no rank
  tl: Timeline;       // its tracks: steps, communicators, CPU threads' calls, GPU streams
  cpu: { name: string; points: { ts: number; value: number }[] }[];  // on-CPU share per thread window
}

// A lane's tracks in one order for every rank: steps, communicators, CPU threads, GPU streams (the
// trace's sort indexes number communicators across processes, so they would differ by rank).
function laneOrder(tl: Timeline): Timeline {
  const cls = (t: Track): number => {
    const cats = new Set(t.events.map((e) => e.cat));
    if (cats.has('step')) return 0;
    if (cats.has('collective')) return 1;
    if (cats.has('kernel') || cats.has('memcpy') || cats.has('memset')) return 3;
    return 2;
  };
  const tracks = [...tl.tracks].sort((a, b) => cls(a) - cls(b) || a.name.localeCompare(b.name));
  return { ...tl, tracks };
}

// Splits a multi-process chrome trace into one lane per process, in rank order. Times stay on the
// trace's own axis (µs from its first event), which every process shares.
export function rankLanes(trace: { traceEvents: TraceEvent[] }): RankLane[] {
  const byPid = new Map<number, TraceEvent[]>();
  const names = new Map<number, string>();
  const sorts = new Map<number, number>();
  const cpu = new Map<number, Map<string, { ts: number; value: number }[]>>();
  for (const e of trace.traceEvents) {
    if (e.ph === 'M' && e.name === 'process_name') names.set(e.pid, String(e.args?.name ?? `pid ${e.pid}`));
    else if (e.ph === 'M' && e.name === 'process_sort_index') sorts.set(e.pid, Number(e.args?.sort_index ?? 0));
    else if (e.ph === 'C' && e.name.startsWith('on-CPU') && e.ts !== undefined) {
      let m = cpu.get(e.pid);
      if (!m) cpu.set(e.pid, (m = new Map()));
      let pts = m.get(e.name);
      if (!pts) m.set(e.name, (pts = []));
      pts.push({ ts: e.ts, value: Number(Object.values(e.args ?? {})[0] ?? 0) });
      if (!byPid.has(e.pid)) byPid.set(e.pid, []);
      continue;
    }
    let list = byPid.get(e.pid);
    if (!list) byPid.set(e.pid, (list = []));
    list.push(e);
  }
  const lanes: RankLane[] = [];
  for (const [pid, events] of byPid) {
    const name = names.get(pid) ?? `pid ${pid}`;
    const m = /^rank (\d+)/.exec(name);
    lanes.push({
      pid, name, rank: m ? Number(m[1]) : -1, tl: laneOrder(traceTracks({ traceEvents: events })),
      cpu: [...(cpu.get(pid) ?? new Map<string, { ts: number; value: number }[]>()).entries()].map(([n, points]) => ({ name: n, points: points.sort((a, b) => a.ts - b.ts) })),
    });
  }
  const order = (l: RankLane) => sorts.get(l.pid) ?? (l.rank >= 0 ? l.rank : 1e9 + l.pid);
  return lanes.sort((a, b) => order(a) - order(b));
}

// Steps first..last (1-based) across lanes: [earliest start, latest end] in trace µs; null when no
// lane has them.
export function stepWindow(lanes: readonly RankLane[], first: number, last: number): [number, number] | null {
  let from = Infinity;
  let to = -Infinity;
  for (const l of lanes) {
    for (const st of l.tl.steps) {
      if (st.step >= first && st.step <= last) {
        from = Math.min(from, st.start);
        to = Math.max(to, st.end);
      }
    }
  }
  return Number.isFinite(from) && to > from ? [from, to] : null;
}

// Axis ticks for a span of `spanUs` µs, about `target` of them at 1/2/5 x 10^k µs.
export function niceTicks(fromUs: number, toUs: number, target = 8): number[] {
  const span = toUs - fromUs;
  if (!(span > 0)) return [fromUs];
  const raw = span / Math.max(1, target);
  const p = 10 ** Math.floor(Math.log10(raw));
  const step = [1, 2, 5, 10].map((k) => k * p).find((x) => x >= raw) ?? 10 * p;
  const out: number[] = [];
  for (let t = Math.ceil(fromUs / step) * step; t <= toUs + 1e-9; t += step) out.push(t);
  return out;
}

// ---- formatting

export function fmtMs(v: number | null | undefined, digits = 1): string {
  if (typeof v !== 'number' || !Number.isFinite(v)) return '–';
  return v >= 1000 ? `${(v / 1000).toFixed(2)} s` : `${v.toFixed(digits)} ms`;
}

export function fmtNum(v: number | null | undefined): string {
  if (typeof v !== 'number' || !Number.isFinite(v)) return '–';
  if (Math.abs(v) >= 1e6) return `${(v / 1e6).toFixed(1)}M`;
  if (Math.abs(v) >= 1e3) return `${(v / 1e3).toFixed(1)}k`;
  // At most one decimal, and none where it would be ".0": samples weighed by their window's period
  // are fractions, and a column read "1", "4.0", "62.1" (4.0000001 printed as 4.0 beside a whole 1).
  const r = v.toFixed(1).replace(/\.0$/, '');
  return r === '-0' ? '0' : r;
}

export function fmtBytes(v: number | null | undefined): string {
  if (typeof v !== 'number' || !Number.isFinite(v)) return '–';
  const u = ['B', 'KiB', 'MiB', 'GiB'];
  let i = 0;
  while (v >= 1024 && i < u.length - 1) {
    v /= 1024;
    i++;
  }
  return `${v.toFixed(i ? 1 : 0)} ${u[i]}`;
}

// Where the agents' cost budget reduced fidelity (GET /api/v1/fidelity): a run of windows on one
// node at a lowered sampling rate, or unwound with frame pointers only ("fp": CFI off).
export interface ReducedFidelity {
  node: string;
  ranks: number[];
  start_ns: number;
  end_ns: number;
  windows: number;
  configured_hz: number;
  sample_hz: number;
  unwinding: string;
}

// Runs a notice lists before "and N more": it says where and when, not every stretch.
export const MAX_FIDELITY_LINES = 8;

// "ranks 0–3", "rank 5", "ranks 0, 2, 5": consecutive ranks as a range.
function ranksLabel(ranks: readonly number[]): string {
  const r = [...new Set(ranks)].sort((a, b) => a - b);
  if (!r.length) return '';
  const parts: string[] = [];
  for (let i = 0; i < r.length;) {
    let j = i;
    while (j + 1 < r.length && r[j + 1] === r[j] + 1) j++;
    parts.push(j > i ? `${r[i]}–${r[j]}` : `${r[i]}`);
    i = j + 1;
  }
  return `${r.length === 1 ? 'rank' : 'ranks'} ${parts.join(', ')}`;
}

// The notice's lines, one per run, for the runs that touch `rank` (when given) and overlap
// [fromNs, toNs) (when given); empty when nothing was reduced there. The pages show it beside the
// profiles and steps so a 24 Hz stretch or cut-short stacks are not read as the job's behaviour.
export function fidelityNotice(runs: readonly ReducedFidelity[], opts: { rank?: number; fromNs?: number; toNs?: number } = {}): string[] {
  const kept = runs.filter((r) =>
    (opts.rank === undefined || r.ranks.includes(opts.rank)) &&
    (opts.fromNs === undefined || r.end_ns > opts.fromNs) &&
    (opts.toNs === undefined || r.start_ns < opts.toNs));
  const t = (ns: number) => new Date(ns / 1e6).toISOString().slice(11, 19);
  const lines = kept.slice(0, MAX_FIDELITY_LINES).map((r) => {
    const what: string[] = [];
    if (r.sample_hz < r.configured_hz) what.push(`${r.sample_hz} Hz instead of ${r.configured_hz} Hz`);
    if (r.unwinding === 'fp') what.push('frame pointers only (CFI unwinding off)');
    const who = r.ranks.length ? `${r.node} (${ranksLabel(r.ranks)})` : r.node;
    return `${who}, ${t(r.start_ns)}–${t(r.end_ns)} UTC, ${r.windows} window${r.windows === 1 ? '' : 's'}: ${what.join('; ')}`;
  });
  if (kept.length > MAX_FIDELITY_LINES) lines.push(`… and ${kept.length - MAX_FIDELITY_LINES} more`);
  return lines;
}

// The notice's heading: what was reduced and what that means for what the page shows.
export const FIDELITY_HEADING =
  'Reduced fidelity: the agent\'s cost budget lowered the sampling rate or turned CFI unwinding off. ' +
  'Profiles weigh each sample by its window\'s period (time, not counts); frame-pointer stacks through code ' +
  'built without them are cut short, so one path can show as separate towers.';

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
  findings: Finding[];
  error?: string;
  second_opinion?: { outlier_ranks: number[]; notes: string[]; disagrees: boolean; summary: string };
}

export interface HeatmapRank {
  rank: number;
  pid: number;
  node: string;
}

export interface Heatmap {
  job: string;
  steps: number;
  step_start_ns: number[];
  step_end_ns?: number[];  // per column, the latest rank's end (servers before it: absent)
  ranks: HeatmapRank[];
  summary?: { means: Record<string, (number | null)[]> };  // per-rank means of every series
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
  step_ms: number;        // mean step time
  collective_ms: number;  // mean time inside collectives (waiting for peers, or moving data)
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

// Sums the OS metrics of each pid (over windows and labels).
export function osTotalsByPid(rows: readonly MetricRow[]): Map<number, Record<string, number>> {
  const wanted = new Map(OS_METRICS.map((m) => [m.name, m.scale]));
  const out = new Map<number, Record<string, number>>();
  for (const r of rows) {
    const scale = wanted.get(r.name);
    if (scale === undefined || !Number.isFinite(r.value)) continue;
    let o = out.get(r.pid);
    if (!o) out.set(r.pid, (o = {}));
    o[r.name] = (o[r.name] ?? 0) + r.value * scale;
  }
  return out;
}

export function rankBreakdown(h: Heatmap, os?: Map<number, Record<string, number>>): RankBreakdown[] {
  // The server's per-rank means when it sent them, else the means of the matrices.
  const meanOf = (name: string, i: number): number => {
    const m = h.summary?.means?.[name];
    if (m) return typeof m[i] === 'number' ? (m[i] as number) : NaN;
    return mean(h.series[name]?.[i] ?? []);
  };
  const step = h.series.step_ms;
  return h.ranks.map((r, i) => {
    const steps = step ? (step[i] ?? []).filter((x) => typeof x === 'number').length : h.steps;
    const step_ms = meanOf('step_ms', i);
    const collective_ms = meanOf('collective_ms', i);
    const totals = os?.get(r.pid) ?? {};
    const perStep: Record<string, number> = {};
    for (const [k, v] of Object.entries(totals)) perStep[k] = steps ? v / steps : NaN;
    return {
      rank: r.rank,
      pid: r.pid,
      node: r.node,
      steps,
      step_ms,
      collective_ms,
      compute_ms: step_ms - (Number.isFinite(collective_ms) ? collective_ms : 0),
      gpu_compute_ms: meanOf('gpu_compute_ms', i),
      gpu_idle_ms: meanOf('gpu_idle_ms', i),
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
  return root;
}

export interface FunctionDelta {
  name: string;
  rank: number;   // inclusive samples (or µs) on the rank
  peer: number;   // inclusive on the average peer
  delta: number;  // rank - peer
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
      if (seen.has(f)) return;
      seen.add(f);
      let e = acc.get(f);
      if (!e) acc.set(f, (e = { name: f, rank: 0, peer: 0, delta: 0 }));
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
  all.sort((a, b) => group(a) - group(b) || b.delta - a.delta || a.rank - b.rank);
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

// ---- formatting

export function fmtMs(v: number | null | undefined, digits = 1): string {
  if (typeof v !== 'number' || !Number.isFinite(v)) return '–';
  return v >= 1000 ? `${(v / 1000).toFixed(2)} s` : `${v.toFixed(digits)} ms`;
}

export function fmtNum(v: number | null | undefined): string {
  if (typeof v !== 'number' || !Number.isFinite(v)) return '–';
  if (Math.abs(v) >= 1e6) return `${(v / 1e6).toFixed(1)}M`;
  if (Math.abs(v) >= 1e3) return `${(v / 1e3).toFixed(1)}k`;
  return Number.isInteger(v) ? String(v) : v.toFixed(1);
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

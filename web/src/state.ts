// The UI's state lives in the URL hash, so any view can be shared by copying the address:
//   #/                                   jobs
//   #/job?job=J&metric=step_ms&rank=R    one job (heatmap metric, selected rank)
//   #/job?job=J&rank=R&step=N             ... with the heatmap cell (rank R, step N) picked
//   #/job?job=J&heat=abs                  ... the heatmap in absolute values (default: against each step's median)
//   #/flame?job=J&rank=R&kind=offcpu&diff=1
//   #/flame?job=J&rank=R&from=NS&to=NS   ... only the stacks of the time range [from, to) (unix ns)
//   #/flame?job=J&rank=R&diff=1&from=NS&to=NS&bfrom=NS&bto=NS   ... against itself in [bfrom, bto)
//   #/timeline?job=J&rank=R&step=N       one rank
//   #/timeline?job=J&ranks=137,0,1&step=N  ranks side by side on one time axis (steps N..N+span-1)
//   ...&at=NS                            the pages' span of steps ends at NS (unix ns): its 10 minutes
//                                        before; without it, the latest 10 minutes the store holds
//   #/nodes

export type View = 'jobs' | 'job' | 'flame' | 'timeline' | 'nodes';
export type ProfileKind = 'oncpu' | 'offcpu';

export interface UiState {
  view: View;
  job?: string;
  rank?: number;
  kind?: ProfileKind;
  diff?: boolean;
  metric?: string;
  heat?: 'abs' | 'peer';  // heatmap in absolute values, or against the peer group's median, instead of every rank's
  ranks?: number[];  // the cross-rank timeline's ranks
  step?: number;
  // A time range of the flame graphs, unix ns as decimal strings (beyond JS's exact integers).
  from?: string;
  to?: string;
  // The baseline range of a differential flame graph against the rank itself (unix ns strings).
  bfrom?: string;
  bto?: string;
  // The end of the span of steps the pages read (unix ns string; the server reads the 10 minutes
  // before it): step numbers count from the span's first step, so a link from one page to another
  // carries it, and a live job's steps do not shift under it. Absent: the latest 10 minutes.
  at?: string;
}

const VIEWS: View[] = ['jobs', 'job', 'flame', 'timeline', 'nodes'];

function intOf(v: string | null): number | undefined {
  if (v === null || !/^\d{1,9}$/.test(v)) return undefined;
  return Number(v);
}

export function parseHash(hash: string): UiState {
  const h = hash.replace(/^#/, '');
  const q = h.indexOf('?');
  const path = (q < 0 ? h : h.slice(0, q)).replace(/^\/+|\/+$/g, '');
  const params = new URLSearchParams(q < 0 ? '' : h.slice(q + 1));
  const view = (VIEWS as string[]).includes(path) ? (path as View) : 'jobs';
  const s: UiState = { view };
  if (params.has('job')) s.job = params.get('job') ?? '';
  const rank = intOf(params.get('rank'));
  if (rank !== undefined) s.rank = rank;
  const kind = params.get('kind');
  if (kind === 'oncpu' || kind === 'offcpu') s.kind = kind;
  if (params.get('diff') === '1') s.diff = true;
  const metric = params.get('metric');
  if (metric && /^[a-z_]{1,40}$/.test(metric)) s.metric = metric;
  const heat = params.get('heat');
  if (heat === 'abs' || heat === 'peer') s.heat = heat;
  const ranks = params.get('ranks');
  if (ranks && /^\d{1,9}(,\d{1,9}){0,31}$/.test(ranks)) s.ranks = ranks.split(',').map(Number);
  const step = intOf(params.get('step'));
  if (step !== undefined) s.step = step;
  for (const k of ['from', 'to', 'bfrom', 'bto', 'at'] as const) {
    const v = params.get(k);
    if (v !== null && /^\d{1,19}$/.test(v)) s[k] = v;
  }
  return s;
}

export function formatHash(s: UiState): string {
  const p = new URLSearchParams();
  if (s.job !== undefined) p.set('job', s.job);
  if (s.rank !== undefined) p.set('rank', String(s.rank));
  if (s.kind) p.set('kind', s.kind);
  if (s.diff) p.set('diff', '1');
  if (s.metric) p.set('metric', s.metric);
  if (s.heat) p.set('heat', s.heat);
  if (s.ranks?.length) p.set('ranks', s.ranks.join(','));
  if (s.step !== undefined) p.set('step', String(s.step));
  if (s.from !== undefined) p.set('from', s.from);
  if (s.to !== undefined) p.set('to', s.to);
  if (s.bfrom !== undefined) p.set('bfrom', s.bfrom);
  if (s.bto !== undefined) p.set('bto', s.bto);
  if (s.at !== undefined) p.set('at', s.at);
  const q = p.toString();
  return '#/' + (s.view === 'jobs' ? '' : s.view) + (q ? '?' + q : '');
}

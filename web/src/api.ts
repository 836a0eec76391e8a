// The REST API under /api/v1/ (same origin: `strata serve` serves this app). A collector started with
// --token-file answers 401 without a bearer token: the UI asks for it once and keeps it for the tab.

import type { Diagnosis, DiffProfile, Heatmap, Job, MetricRow, ReducedFidelity } from './shape';

const TOKEN_KEY = 'strata.token';

export class ApiError extends Error {
  constructor(
    public status: number,
    message: string,
  ) {
    super(message);
  }
}

export function apiUrl(path: string, params: Record<string, string | number | undefined> = {}): string {
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) if (v !== undefined) q.set(k, String(v));
  const s = q.toString();
  return `api/v1/${path}${s ? '?' + s : ''}`;
}

// The token prompt in progress: a page makes several calls at once, and all of them get 401 from a
// collector with a token; the user is asked once and every call waits for that answer.
let asking: Promise<string | null> | null = null;

async function get(path: string, params: Record<string, string | number | undefined> = {}): Promise<Response> {
  const headers: Record<string, string> = {};
  const token = sessionStorage.getItem(TOKEN_KEY);
  if (token) headers.Authorization = `Bearer ${token}`;
  const res = await fetch(apiUrl(path, params), { headers });
  if (res.status === 401) {
    // Another call may have been given the token since this one was sent: retry with it unasked.
    const now = sessionStorage.getItem(TOKEN_KEY);
    if (now && now !== token) return get(path, params);
    if (!asking) {
      asking = Promise.resolve(window.prompt('This collector needs its bearer token (strata serve --token-file):'))
        .then((t) => {
          if (t) sessionStorage.setItem(TOKEN_KEY, t.trim());
          return t;
        })
        .finally(() => { asking = null; });
    }
    const t = await asking;
    if (t) return get(path, params);
  }
  if (!res.ok) {
    let why = res.statusText;
    try {
      why = (await res.json()).error ?? why;
    } catch {
      /* not JSON */
    }
    throw new ApiError(res.status, `${path}: ${why}`);
  }
  return res;
}

// Saves an API answer as a file. A link (<a href download>) cannot send the bearer token, and the
// token must never ride in a URL (logs, history, Referer): fetch with the header, hand the browser
// the bytes as a blob: URL, and let it go once the save has started.
export async function download(path: string, params: Record<string, string | number | undefined>, filename: string): Promise<void> {
  const blob = await (await get(path, params)).blob();
  const href = URL.createObjectURL(blob);
  const a = document.createElement('a');
  a.href = href;
  a.download = filename;
  a.style.display = 'none';
  document.body.append(a);
  try {
    a.click();
  } finally {
    a.remove();
    setTimeout(() => URL.revokeObjectURL(href), 60_000);
  }
}

const json = async <T>(path: string, params: Record<string, string | number | undefined> = {}) =>
  (await (await get(path, params)).json()) as T;

export const api = {
  jobs: () => json<{ jobs: Job[] }>('jobs').then((r) => r.jobs),
  findings: (job: string) => json<Diagnosis>('findings', { job }),
  // The steps of the 10 minutes up to `at` (unix ns), or of the latest 10 minutes; `os`: OS metrics
  // to sum per rank over that span (summary.os).
  heatmap: (job: string, onlyTrend = false, series?: string[], at?: string, os?: string[]) =>
    json<Heatmap>('heatmap', { job, only: onlyTrend ? 'trend' : undefined, series: series?.join(','), to: at, os: os?.join(',') }),
  // `range`: from/to in unix ns (decimal strings); the profile of the windows that overlap it.
  diff: (job: string, rank: number, kind: string, range: { from?: string; to?: string } = {}) =>
    json<DiffProfile>('diff', { job, rank, kind, from: range.from, to: range.to }),
  profile: async (rank: number, kind: string) => (await get('profile', { rank, kind })).text(),
  // One rank, or several on one time axis (`ranks=`, the cross-rank timeline).
  // `span`: the time range to read (unix ns); without it the server's default, its latest 10 minutes.
  timeline: (job: string, ranks: number | number[], span?: import('./shape').TimeRange | null) =>
    json<{ traceEvents: import('./shape').TraceEvent[] }>('timeline', {
      job, ...(Array.isArray(ranks) ? { ranks: ranks.join(',') } : { rank: ranks }), from: span?.from, to: span?.to,
    }),
  metrics: (prefix: string) => json<{ metrics: MetricRow[] }>('metrics', { prefix }).then((r) => r.metrics),
  nodes: () => json<{ nodes: NodeStatus[] }>('nodes').then((r) => r.nodes),
  // Reduced fidelity in a span (unix ns strings; without one, the server's latest 10 minutes).
  fidelity: (job: string, span: { from?: string; to?: string } = {}) =>
    json<{ reduced: ReducedFidelity[]; truncated: boolean }>('fidelity', { job, from: span.from, to: span.to }),
  overhead: () => json<{ stats: Record<string, number> }>('overhead').then((r) => r.stats),
  processes: (job?: string) => json<{ processes: ProcessRow[] }>('processes', { job }).then((r) => r.processes),
};

export interface NodeStatus {
  node: string;
  agent_id: string;
  last_seen_ns: number;
  seconds_since_seen: number;
  last_batch: number;
  status: string;
  health: Record<string, number | string> | null;
}

export interface ProcessRow {
  node: string;
  pid: number;
  comm: string;
  command: string;
  job: string;
  rank: number;
  world_size: number;
}

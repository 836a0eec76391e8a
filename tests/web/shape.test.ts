// Unit tests of the web UI's data shaping (web/src/shape.ts): run by `npm test` in web/ and by CTest
// (label "web").
import {
  buildFlameTree, cellRange, colorDomain, diffTree, fmtRange, functionDeltas, median, nsString, osTotalsOf,
  parseFolded, quantile, rampColor, rampTable, rangeSteps, rankBreakdown, rankTotal, robustZ, stepsRange, stepTrend,
  traceTracks, fmtMs, fmtNum, type DiffProfile, type Heatmap,
  computeMatrix, defaultTimelineRanks, deviationDomain, deviationMatrix, diffColor, divergingColor, downsampleExtreme,
  jobStatusText, jobStepMs, markedRows, maxAbsDelta, niceTicks, rankLanes, sortFunctions, functionTable, stepWindow, worstStep,
  MIN_DEVIATION_SHARE, selfDiff, shortName, heatmapRowLayout, MARK_ROW_PX, diagnosisVerdict,
} from '../../web/src/shape';

// A synchronous job of `ranks` ranks x `steps` steps: every rank's step takes the same time (they
// wait for each other), rank `slow` computes 40 ms longer from the middle step and waits 40 ms less.
function syncJob(ranks: number, steps: number, slow: number): { step: (number | null)[][]; wait: (number | null)[][] } {
  let seed = 7;
  const noise = () => ((seed = (seed * 1103515245 + 12345) % 2 ** 31) / 2 ** 31 - 0.5) * 4;  // ±2 ms
  const step: number[][] = [];
  const wait: number[][] = [];
  for (let r = 0; r < ranks; r++) {
    step.push([]);
    wait.push([]);
    for (let c = 0; c < steps; c++) {
      const late = c >= steps / 2 ? 40 : 0;
      const t = 200 + late + Math.abs(noise());
      step[r].push(t);
      wait[r].push(t - 120 - (r === slow ? late : 0) - noise());
    }
  }
  return { step, wait };
}

describe('statistics', () => {
  it('median and quantile ignore non-finite values', () => {
    expect(median([3, 1, NaN, 2])).toBe(2);
    expect(median([4, 1, 3, 2])).toBe(2.5);
    expect(median([])).toBeNaN();
    expect(quantile([0, 10], 0.25)).toBe(2.5);
    expect(quantile([5], 0.99)).toBe(5);
  });
  it('robust z marks the one rank that computes longest', () => {
    const z = robustZ([100, 101, 99, 100, 180]);
    expect(z[4]).toBeGreaterThan(10);
    expect(Math.abs(z[0])).toBeLessThan(1);
  });
});

describe('heatmap', () => {
  const m = [
    [400, 200, 210, 200, 205, 200, 201],
    [420, 201, 200, null, 200, 210, 202],
  ];
  it('step trend is the median over ranks per step, gaps skipped', () => {
    expect(stepTrend(m)).toEqual([410, 200.5, 205, 200, 202.5, 205, 201.5]);
  });
  it('colour domain leaves out the start-up steps and never collapses', () => {
    const [lo, hi] = colorDomain(m);
    expect(lo).toBeGreaterThanOrEqual(200);
    expect(hi).toBeLessThan(400);
    expect(colorDomain([[5, 5]])).toEqual([5, 6]);
    expect(colorDomain([])).toEqual([0, 1]);
  });
  it('ramp clamps and greys unknowns', () => {
    expect(rampColor(0)).toEqual([68, 1, 84]);
    expect(rampColor(2)).toEqual([253, 231, 37]);
    expect(rampColor(NaN)).toEqual([128, 128, 128]);
  });
  it('the ramp table holds the ramp as little-endian RGBA words', () => {
    const t = rampTable(256);
    const bytes = new Uint8Array(t.buffer);
    expect([...bytes.slice(0, 4)]).toEqual([68, 1, 84, 255]);
    expect([...bytes.slice(255 * 4, 256 * 4)]).toEqual([253, 231, 37, 255]);
  });
  it('the median trend and domain match the plain statistics on a large matrix', () => {
    // 1,000 ranks x 60 steps of pseudo-random values, with gaps: the typed-array paths agree with
    // quantile()/median() on plain arrays.
    let x = 7;
    const rnd = () => ((x = (x * 1103515245 + 12345) % 2 ** 31) / 2 ** 31);
    const big = Array.from({ length: 1000 }, () => Array.from({ length: 60 }, () => (rnd() < 0.01 ? null : 100 + 50 * rnd())));
    const col = (c: number) => big.map((r) => r[c]).filter((v): v is number => v !== null);
    const trend = stepTrend(big);
    for (const c of [0, 17, 59]) expect(trend[c]).toBeCloseTo(median(col(c)), 9);
    const rest = big.flatMap((r) => r.slice(2)).filter((v): v is number => v !== null);
    const [lo, hi] = colorDomain(big);
    expect(lo).toBeCloseTo(quantile(rest, 0.01), 9);
    expect(hi).toBeCloseTo(quantile(rest, 0.99), 9);
  });
});

describe('time windows', () => {
  const t0 = 1_700_000_000_000_000_000;
  const hm: Pick<Heatmap, 'step_start_ns' | 'step_end_ns' | 'series'> = {
    step_start_ns: [t0, t0 + 200e6, t0 + 400e6],
    step_end_ns: [t0 + 210e6, t0 + 420e6, t0 + 650e6],
    series: { step_ms: [[200, 200, 250], [210, 220, 240]] },
  };
  it('ns strings are plain decimals the URL and the API carry', () => {
    expect(nsString(t0)).toBe('1700000000000000000');
    expect(nsString(1.5e21)).toBe('1500000000000000000000');
    expect(nsString(-5)).toBe('0');
  });
  it('a cell covers its step on every rank: earliest start to latest end', () => {
    expect(cellRange(hm, 0, 1)).toEqual({ from: nsString(t0 + 200e6), to: nsString(t0 + 420e6) });
    expect(stepsRange(hm, 0, 2)).toEqual({ from: nsString(t0), to: nsString(t0 + 650e6) });
    expect(stepsRange(hm, 2, 1)).toBeNull();
    expect(stepsRange(hm, 0, 3)).toBeNull();
  });
  it('without step ends (an older server): the next start, or the cell\'s own step time', () => {
    const old = { step_start_ns: hm.step_start_ns, series: hm.series };
    expect(cellRange(old, 0, 0)).toEqual({ from: nsString(t0), to: nsString(t0 + 200e6) });
    expect(cellRange(old, 1, 2)).toEqual({ from: nsString(t0 + 400e6), to: nsString(t0 + 640e6) });
  });
  it('a range maps back to the steps it covers (the window picker)', () => {
    expect(rangeSteps(hm, {})).toEqual([1, 3]);
    for (const [a, b] of [[0, 0], [1, 1], [2, 2], [0, 1], [1, 2], [0, 2]]) expect(rangeSteps(hm, stepsRange(hm, a, b)!)).toEqual([a + 1, b + 1]);
    expect(rangeSteps(hm, { from: nsString(t0 + 1), to: nsString(t0 + 100e6) })).toEqual([1, 1]);
    // Without ends: every step that starts inside the range.
    expect(rangeSteps({ step_start_ns: hm.step_start_ns }, { from: nsString(t0 + 200e6), to: nsString(t0 + 420e6) })).toEqual([2, 3]);
    expect(rangeSteps({ step_start_ns: [] }, {})).toBeNull();
  });
  it('formats a range and totals a rank\'s profile', () => {
    expect(fmtRange(Date.UTC(2024, 0, 1, 12, 0, 5, 120) * 1e6, Date.UTC(2024, 0, 1, 12, 0, 5, 320) * 1e6))
      .toBe('12:00:05.120–12:00:05.320 UTC (0.20 s)');
    expect(rankTotal({ stacks: [['a;b', 3, 10], ['a;c', 4, 0]] })).toBe(7);
  });
});

describe('per-rank breakdown', () => {
  const h: Heatmap = {
    job: 'j', steps: 2, step_start_ns: [0, 1],
    ranks: [{ rank: 0, pid: 10, node: 'a' }, { rank: 1, pid: 11, node: 'b' }],
    series: {
      step_ms: [[100, 110], [100, 110]],
      collective_ms: [[60, 70], [5, 15]],
      gpu_idle_ms: [[null, null], [1, 3]],
    },
  };
  it('splits step time into compute and collective wait, per step', () => {
    // The server's sums per row (summary.os); a name the page does not show is left out.
    const os = osTotalsOf({ summary: { means: {}, os: { 'os.runq_wait_us': [null, 40000], 'os.runq_latency_us.hist': [99, 99] } } });
    const rows = rankBreakdown(h, os);
    expect(rows[0]).toMatchObject({ rank: 0, node: 'a', steps: 2, step_ms: 105, collective_ms: 65, compute_ms: 40 });
    expect(rows[0].gpu_idle_ms).toBeNaN();
    expect(rows[1]).toMatchObject({ compute_ms: 95, gpu_idle_ms: 2 });
    // 40 ms of run-queue wait over 2 steps; histogram buckets are not summed in.
    expect(rows[1].os['os.runq_wait_us']).toBe(20);
    expect(Object.keys(rows[1].os)).toEqual(['os.runq_wait_us']);
  });
});

describe('flame graphs', () => {
  it('parses folded lines, skipping malformed ones', () => {
    expect(parseFolded('a;b 3\nbad\na;c d 2\n\nx -1\n')).toEqual([['a;b', 3], ['a;c d', 2]]);
  });
  it('builds an inclusive tree that merges shared prefixes', () => {
    const t = buildFlameTree([{ stack: 'main;f;g', value: 3 }, { stack: 'main;f', value: 1 }, { stack: 'main;h', value: 2 }]);
    expect(t.value).toBe(6);
    const main = t.children[0];
    expect(main).toMatchObject({ name: 'main', value: 6 });
    expect(main.children.map((c) => [c.name, c.value])).toEqual([['f', 4], ['h', 2]]);
    expect(main.children[0].children[0]).toMatchObject({ name: 'g', value: 3 });
  });
  const d: DiffProfile = {
    job: 'j', rank: 2, kind: 'oncpu', unit: 'count', peers: 3,
    stacks: [
      ['_start;main;preprocess;cpu_work', 30, 90],    // same as an average peer
      ['_start;main;slow_augment;cpu_work', 100, 0],  // the hotspot: only on rank 2
      ['_start;main;load', 5, 60],                    // less than its peers
      ['start_thread;peer_only', 0, 30],              // never on rank 2
    ],
  };
  it('differential tree: widths are the rank, self deltas against the average peer', () => {
    const t = diffTree(d);
    expect(t.name).toBe('rank 2 vs 3 peers');
    expect(t.value).toBe(135);
    const main = t.children[0].children[0];
    const aug = main.children.find((c) => c.name === 'slow_augment')!;
    expect(aug.children[0]).toMatchObject({ name: 'cpu_work', value: 100, delta: 100 });
    const load = main.children.find((c) => c.name === 'load')!;
    expect(load.delta).toBe(-15);
    expect(t.children.some((c) => c.name === 'start_thread')).toBe(false);
  });
  it('function deltas put the function doing the extra work first, then its callers', () => {
    const top = functionDeltas(d, 5);
    expect(top[0]).toMatchObject({ name: 'cpu_work', rank: 130, peer: 30, delta: 100 });
    // _start and main tie (each only contains the gain): the deeper one, nearer the work, first.
    expect(top.map((f) => f.name)).toEqual(['cpu_work', 'slow_augment', 'main', '_start', 'preprocess']);
  });
});

describe('timeline', () => {
  it('turns a chrome trace into named, ordered tracks and steps', () => {
    const tl = traceTracks({
      traceEvents: [
        { ph: 'M', name: 'thread_name', pid: 1, tid: 4000000000, args: { name: 'steps' } },
        { ph: 'M', name: 'thread_sort_index', pid: 1, tid: 4000000000, args: { sort_index: 0 } },
        { ph: 'M', name: 'thread_name', pid: 1, tid: 4100000000, args: { name: 'GPU 0 stream 0x1' } },
        { ph: 'M', name: 'thread_sort_index', pid: 1, tid: 4100000000, args: { sort_index: 10 } },
        { ph: 'X', pid: 1, tid: 4100000000, name: 'gemm', cat: 'kernel', ts: 50, dur: 10 },
        { ph: 'X', pid: 1, tid: 1, name: 'nccl allreduce', cat: 'api', ts: 40, dur: 1 },
        { ph: 'X', pid: 1, tid: 4000000000, name: 'step 2', cat: 'step', ts: 100, dur: 90, args: { step: 2 } },
        { ph: 'X', pid: 1, tid: 4000000000, name: 'step 1', cat: 'step', ts: 10, dur: 90, args: { step: 1 } },
        { ph: 'C', pid: 1, tid: 0, name: 'on-CPU', ts: 0, args: { cpu: 1 } },
      ],
    });
    expect(tl.tracks.map((t) => t.name)).toEqual(['steps', '1/1', 'GPU 0 stream 0x1']);
    expect(tl.steps).toEqual([{ step: 1, start: 10, end: 100 }, { step: 2, start: 100, end: 190 }]);
    expect([tl.start, tl.end]).toEqual([10, 190]);
    expect(tl.tracks[0].events[0].name).toBe('step 1');
  });
});

describe('formatting', () => {
  it('formats milliseconds and unknowns', () => {
    expect(fmtMs(12.345)).toBe('12.3 ms');
    expect(fmtMs(2500)).toBe('2.50 s');
    expect(fmtMs(null)).toBe('–');
  });
  it('formats counts with at most one decimal and no ".0"', () => {
    expect(fmtNum(1)).toBe('1');
    expect(fmtNum(4.0000001)).toBe('4');
    expect(fmtNum(62.14)).toBe('62.1');
    expect(fmtNum(-0.7)).toBe('-0.7');
    expect(fmtNum(-0.01)).toBe('0');
    expect(fmtNum(1234)).toBe('1.2k');
    expect(fmtNum(null)).toBe('–');
  });
});

describe('per-rank breakdown from the server summary', () => {
  it('uses the per-rank means when the matrices were not asked for', () => {
    const h: Heatmap = {
      job: 'j', steps: 3, step_start_ns: [0, 1, 2], ranks: [{ rank: 5, pid: 50, node: 'n' }],
      summary: { means: { step_ms: [200], collective_ms: [30], gpu_compute_ms: [null], gpu_idle_ms: [12] } },
      series: {},
    };
    const [r] = rankBreakdown(h);
    expect(r).toMatchObject({ rank: 5, steps: 3, step_ms: 200, collective_ms: 30, compute_ms: 170, gpu_idle_ms: 12 });
    expect(r.gpu_compute_ms).toBeNaN();
  });
});

describe('straggler heatmap', () => {
  it('deviation cancels a job-wide slowdown and leaves the straggler', () => {
    const { step, wait } = syncJob(50, 20, 37);
    const compute = computeMatrix(step, wait);
    const { dev, medians } = deviationMatrix(compute);
    expect(medians).toHaveLength(20);
    // The job's steps grew 40 ms from step 11; the deviation of a typical rank did not.
    expect(Math.abs(dev[3][15] as number)).toBeLessThan(5);
    expect(dev[37][15] as number).toBeGreaterThan(35);
    const stepMs = jobStepMs(step);
    expect(stepMs).toBeGreaterThan(200);
    const marks = markedRows(dev, stepMs);
    expect(marks.map((m) => m.row)).toEqual([37]);
    expect(marks[0].sign).toBe(1);
    // The straggler saturates the scale; the floor keeps a quiet job's noise pale.
    expect(deviationDomain(dev, stepMs)).toBeLessThan(40);
    expect(deviationDomain([[0.1, -0.1]], 200)).toBe(MIN_DEVIATION_SHARE * 200);
    expect(worstStep(dev[37])).toBeGreaterThan(10);
  });
  it('marks nothing on a job whose ranks behave alike', () => {
    const { step, wait } = syncJob(200, 20, -1);
    const { dev } = deviationMatrix(computeMatrix(step, wait));
    expect(markedRows(dev, jobStepMs(step))).toEqual([]);
  });
  it('keeps one straggler among 10,000 ranks in 400 pixel rows', () => {
    const ranks = 10_000;
    const { step, wait } = syncJob(ranks, 8, 6_137);
    const { dev } = deviationMatrix(computeMatrix(step, wait));
    const ds = downsampleExtreme(dev, 400, 800);
    expect([ds.rows, ds.cols]).toEqual([400, 8]);
    // Pixel row 245 covers ranks 6125..6149: it shows rank 6137, its most extreme.
    const y = 245;
    expect(ds.rowStart[y]).toBeLessThanOrEqual(6_137);
    expect(ds.rowStart[y + 1]).toBeGreaterThan(6_137);
    expect(ds.source[y * ds.cols + 6]).toBe(6_137);
    expect(ds.values[y * ds.cols + 6]).toBeGreaterThan(35);
    // Every other pixel row stays near 0 in the slow steps.
    let others = 0;
    for (let yy = 0; yy < ds.rows; yy++) if (yy !== y) others = Math.max(others, Math.abs(ds.values[yy * ds.cols + 6]));
    expect(others).toBeLessThan(10);
    expect(markedRows(dev, jobStepMs(step)).map((m) => m.row)).toEqual([6_137]);
  });
  it('draws a marked or picked rank\'s pixel row MARK_ROW_PX tall, within the heatmap\'s 400 px', () => {
    for (const [rows, special] of [[1_000, [137]], [10_000, [137, 9_000]], [300, [5, 6, 200]], [200, [137]]] as [number, number[]][]) {
      const l = heatmapRowLayout(rows, special, 400);
      expect(l.top[l.outRows]).toBeLessThanOrEqual(400);
      expect(l.rowStart[l.outRows]).toBe(rows);
      for (const r of special) {
        let y = 0;
        while (l.rowStart[y + 1] <= r) y++;
        expect(l.top[y + 1] - l.top[y]).toBeGreaterThanOrEqual(MARK_ROW_PX);
      }
      // Every other pixel row keeps its own height: the tall ones take nobody's pixels.
      const tall = Array.from({ length: l.outRows }, (_, y) => l.top[y + 1] - l.top[y]).filter((hh) => hh !== l.rowPx).length;
      expect(tall).toBeLessThanOrEqual(special.length);
    }
    // Few ranks keep their whole-pixel rows (40 px at 4 ranks, as before) and no extra.
    const small = heatmapRowLayout(4, [2], 400);
    expect(Array.from(small.top)).toEqual([0, 40, 80, 120, 160]);
  });
  it('downsampling in absolute values picks the cell farthest from its column centre', () => {
    const ds = downsampleExtreme([[100], [101], [60], [99]], 2, 10, [100]);
    expect(Array.from(ds.values)).toEqual([101, 60]);
    expect(Array.from(ds.source)).toEqual([1, 2]);
  });
  it('diverging colours: neutral at 0, red above, blue below', () => {
    expect(divergingColor(0)).toEqual([240, 240, 240]);
    expect(divergingColor(1)).toEqual([214, 39, 40]);
    expect(divergingColor(-2)).toEqual([33, 102, 172]);
  });
});

describe('jobs page', () => {
  it('summarises many silent nodes and says a recording is one', () => {
    const nodes = Array.from({ length: 125 }, (_, i) => `node-${i}`);
    expect(jobStatusText({ nodes, silent_nodes: ['node-1', 'node-7', 'node-9'], status: 'degraded' })).toBe('125 nodes, 3 silent');
    expect(jobStatusText({ nodes: ['a', 'b'], silent_nodes: ['b'], status: 'degraded' })).toBe('silent: b');
    expect(jobStatusText({ nodes: ['vm'], silent_nodes: [], status: 'recorded' })).toBe('');
    expect(jobStatusText({ nodes: ['vm'], silent_nodes: [], status: 'healthy' })).toBe('');
  });
  it('one step time: the median over ranks of each rank\'s median step', () => {
    expect(jobStepMs([[100, 300, 110], [120, 130, 500], [90, 95, 99]])).toBe(110);
  });
});

describe('diagnosis verdict', () => {
  // The page said "healthy" whenever there was no finding, over a note that the job slowed and over
  // a straggler no layer explains: the badge is the engine's own verdict.
  it('says healthy only when the engine does', () => {
    expect(diagnosisVerdict({ job: 'j', healthy: true, findings: [] }).badge).toBe('healthy');
    const slowed = diagnosisVerdict({ job: 'j', healthy: false, note: 'the job slowed on every rank alike', findings: [] });
    expect(slowed).toEqual({ badge: 'slowed', text: 'the job slowed on every rank alike' });
    const straggler = { rank: 3, node: 'node-1', lost_ms_per_step: 40, text: 'rank 3 loses 40 ms per step' };
    expect(diagnosisVerdict({ job: 'j', healthy: false, findings: [], unexplained: [straggler] }).badge).toBeNull();
    // Older collectors sent no "healthy": no finding and no unexplained straggler reads healthy.
    expect(diagnosisVerdict({ job: 'j', findings: [], unexplained: [straggler] }).badge).toBeNull();
    expect(diagnosisVerdict({ job: 'j', findings: [] }).badge).toBe('healthy');
    expect(diagnosisVerdict({ job: 'j', healthy: false, waiting_for_data: true, note: 'waits for node-3', findings: [] }))
      .toEqual({ badge: 'waiting', text: 'waits for node-3' });
    expect(diagnosisVerdict({ job: 'j', findings: [], error: 'no steps' }).badge).toBeNull();
  });
});

describe('flame page', () => {
  const d: DiffProfile = {
    job: 'j', rank: 2, kind: 'oncpu', unit: 'count', peers: 2,
    stacks: [
      ['main;step;load;cpu_work', 50, 100],
      ['main;step;load;slow_augment;cpu_work', 40, 0],
      ['main;step;wait', 10, 60],
    ],
  };
  it('self and total per function, sortable, ties by self then name', () => {
    const rows = functionTable(d);
    const by = (n: string) => rows.find((r) => r.name === n)!;
    expect(by('cpu_work')).toMatchObject({ self: 90, total: 90, peerSelf: 50, peerTotal: 50 });
    expect(by('main')).toMatchObject({ self: 0, total: 100, peerTotal: 80 });
    expect(sortFunctions(rows, 'self').map((r) => r.name).slice(0, 2)).toEqual(['cpu_work', 'wait']);
    expect(sortFunctions(rows, 'total')[0].name).toBe('main');
    // main, step and load all total 100 / 90: ties fall back to self, then name.
    expect(sortFunctions(rows, 'total').map((r) => r.name).slice(0, 3)).toEqual(['main', 'step', 'cpu_work']);
    // cpu_work, load and slow_augment all gained 40: cpu_work does the work (self time) and goes
    // first; the others, without self time, by name.
    expect(sortFunctions(rows, 'delta').map((r) => r.name).slice(0, 3)).toEqual(['cpu_work', 'load', 'slow_augment']);
    expect(sortFunctions(rows, 'name', false)[0].name).toBe('cpu_work');
    // Δ self: the function doing the extra work (cpu_work: +40 self) first, callers (Δ self 0) after.
    expect(sortFunctions(rows, 'selfDelta')[0].name).toBe('cpu_work');
    expect(sortFunctions(rows, 'selfDelta', false)[0].name).toBe('wait');
  });
  it('delta colour: a function only the rank runs is red, an equal one grey', () => {
    const tree = diffTree(d);
    const max = maxAbsDelta(tree);
    const aug = tree.children[0].children[0].children[0].children.find((c) => c.name === 'slow_augment')!;
    expect(aug.deltaTotal).toBe(40);
    expect(max).toBe(40);
    expect(diffColor(40, max)).toBe('rgb(214,39,40)');
    expect(diffColor(0, max)).toBe('rgb(221,221,221)');
    expect(diffColor(-20, max)).not.toBe(diffColor(20, max));
  });
  it('delta table: a chain that gained as a whole is ordered by self gain, then depth', () => {
    const chain: DiffProfile = { ...d, peers: 1, stacks: [['a;b;c;d;e;f', 60, 0], ['a;b;x', 10, 10]] };
    const top = functionDeltas(chain, 6).map((f) => f.name);
    // f does the work (self +60); a..e only contain it: deepest first.
    expect(top).toEqual(['f', 'e', 'd', 'c', 'b', 'a']);
  });
});

describe('cross-rank timeline', () => {
  const ev = (pid: number, tid: number, name: string, cat: string, ts: number, dur: number, args?: Record<string, unknown>) =>
    ({ ph: 'X', pid, tid, name, cat, ts, dur, args });
  const trace = {
    traceEvents: [
      { ph: 'M', name: 'process_name', pid: 7, tid: 0, args: { name: 'rank 3 (pid 7, python3)' } },
      { ph: 'M', name: 'process_sort_index', pid: 7, tid: 0, args: { sort_index: 3 } },
      { ph: 'M', name: 'process_name', pid: 5, tid: 0, args: { name: 'rank 1 (pid 5, python3)' } },
      { ph: 'M', name: 'process_sort_index', pid: 5, tid: 0, args: { sort_index: 1 } },
      ev(7, 4000000000, 'step 1', 'step', 0, 100, { step: 1 }),
      ev(7, 4000000000, 'step 2', 'step', 100, 150, { step: 2 }),
      ev(5, 4000000000, 'step 1', 'step', 2, 98, { step: 1 }),
      ev(5, 4000000000, 'step 2', 'step', 100, 152, { step: 2 }),
      ev(5, 4200000000, 'allreduce', 'collective', 120, 130),
      { ph: 'C', pid: 5, tid: 0, name: 'on-CPU python3 (5)', ts: 0, args: { cpu: 0.5 } },
      { ph: 'C', pid: 5, tid: 0, name: 'os.blocked_us', ts: 0, args: { value: 9 } },
    ],
  };
  it('one lane per rank in rank order, on the trace\'s shared axis', () => {
    const lanes = rankLanes(trace);
    expect(lanes.map((l) => l.rank)).toEqual([1, 3]);
    expect(lanes[0].tl.tracks.map((t) => t.events[0].cat)).toEqual(['step', 'collective']);
    expect(lanes[0].cpu).toEqual([{ name: 'on-CPU python3 (5)', points: [{ ts: 0, value: 0.5 }] }]);
    expect(stepWindow(lanes, 2, 2)).toEqual([100, 252]);
    expect(stepWindow(lanes, 1, 2)).toEqual([0, 252]);
    expect(stepWindow(lanes, 5, 6)).toBeNull();
  });
  it('axis ticks at 1/2/5 steps along the whole span', () => {
    expect(niceTicks(0, 1000, 5)).toEqual([0, 200, 400, 600, 800, 1000]);
    expect(niceTicks(0, 250_000, 8).length).toBeGreaterThanOrEqual(5);
  });
  it('default ranks: the chosen one beside its most typical peers', () => {
    const { step, wait } = syncJob(12, 10, 5);
    const hm: Heatmap = {
      job: 'j', steps: 10, step_start_ns: [], ranks: step.map((_, r) => ({ rank: r, pid: 100 + r, node: `n${r >> 2}` })),
      series: { step_ms: step, collective_ms: wait },
    };
    const ranks = defaultTimelineRanks(hm, 5);
    expect(ranks[0]).toBe(5);
    expect(ranks).toHaveLength(4);
    expect(new Set(ranks).size).toBe(4);
  });
});

describe('rank against its own baseline steps', () => {
  it('scales the baseline to the window\'s span and keeps stacks of either side', () => {
    const w = (start: number, end: number) => ({ from_ns: start, to_ns: end, start_ns: start, end_ns: end });
    const now: DiffProfile = { job: 'j', rank: 3, kind: 'oncpu', unit: 'count', peers: 7, window: w(100, 300),
      stacks: [['main;work', 40, 999], ['main;slow_augment', 30, 0]] };
    const base: DiffProfile = { job: 'j', rank: 3, kind: 'oncpu', unit: 'count', peers: 7, window: w(0, 100),
      stacks: [['main;work', 20, 999], ['main;gone', 5, 0]] };
    const d = selfDiff(now, base);
    expect(d.peers).toBe(1);
    // The window spans 200 ns, the baseline 100: the baseline counts double.
    expect(d.stacks).toEqual([['main;work', 40, 40], ['main;slow_augment', 30, 0], ['main;gone', 0, 10]]);
    expect(functionDeltas(d, 1)[0].name).toBe('slow_augment');
  });
});

describe('function names in tables', () => {
  it('drops the anonymous namespace, arguments and clone suffix', () => {
    expect(shortName('(anonymous namespace)::cpu_work(unsigned char const*, unsigned long, long)')).toBe('cpu_work');
    expect(shortName('slow_augment(std::vector<unsigned char> const&, long) [clone .isra.0]')).toBe('slow_augment');
    expect(shortName('do_syscall_64_[k]')).toBe('do_syscall_64_[k]');
    expect(shortName('(anonymous namespace)')).toBe('(anonymous namespace)');
  });
});

// Issue 19: reduced fidelity is said where it happened (node, ranks, when, what), only for the rank
// and window a page shows, and nothing is said where fidelity was full.
import { fidelityNotice, MAX_FIDELITY_LINES, type ReducedFidelity } from '../../web/src/shape';

describe('fidelityNotice', () => {
  const t0 = Date.UTC(2026, 11, 1, 18, 40, 10) * 1e6;  // unix ns
  const run = (over: Partial<ReducedFidelity>): ReducedFidelity => ({
    node: 'node-1', ranks: [0, 1, 2, 3], start_ns: t0, end_ns: t0 + 30e9, windows: 3, configured_hz: 99, sample_hz: 24,
    unwinding: 'fp', ...over,
  });

  it('names node, ranks, time span, rate and unwinding', () => {
    expect(fidelityNotice([run({})])).toEqual([
      'node-1 (ranks 0–3), 18:40:10–18:40:40 UTC, 3 windows: 24 Hz instead of 99 Hz; frame pointers only (CFI unwinding off)',
    ]);
    expect(fidelityNotice([run({ ranks: [5], sample_hz: 99, unwinding: 'fp', windows: 1 })])).toEqual([
      'node-1 (rank 5), 18:40:10–18:40:40 UTC, 1 window: frame pointers only (CFI unwinding off)',
    ]);
    expect(fidelityNotice([run({ ranks: [0, 2, 3], unwinding: 'cfi', sample_hz: 49 })])[0]).toContain('(ranks 0, 2–3)');
    expect(fidelityNotice([run({ ranks: [0, 2, 3], unwinding: 'cfi', sample_hz: 49 })])[0]).toMatch(/: 49 Hz instead of 99 Hz$/);
  });

  it('is empty where nothing was reduced, and keeps only the rank and window asked for', () => {
    expect(fidelityNotice([])).toEqual([]);
    const runs = [run({}), run({ node: 'node-2', ranks: [4, 5, 6, 7], start_ns: t0 + 60e9, end_ns: t0 + 70e9 })];
    expect(fidelityNotice(runs, { rank: 5 })).toHaveLength(1);
    expect(fidelityNotice(runs, { rank: 5 })[0]).toMatch(/^node-2 /);
    expect(fidelityNotice(runs, { rank: 9 })).toEqual([]);
    // A window after the first run and before the second overlaps neither.
    expect(fidelityNotice(runs, { fromNs: t0 + 30e9, toNs: t0 + 60e9 })).toEqual([]);
    expect(fidelityNotice(runs, { fromNs: t0 + 29e9, toNs: t0 + 61e9 })).toHaveLength(2);
  });

  it('lists a bounded number of runs and says how many more', () => {
    const many = Array.from({ length: MAX_FIDELITY_LINES + 3 }, (_, i) => run({ start_ns: t0 + i * 20e9, end_ns: t0 + i * 20e9 + 10e9 }));
    const lines = fidelityNotice(many);
    expect(lines).toHaveLength(MAX_FIDELITY_LINES + 1);
    expect(lines[MAX_FIDELITY_LINES]).toBe('… and 3 more');
  });
});

// Issue 19: the heatmap's deviation against the rank's peer group. Two pipeline stages whose steps
// differ by design (100 vs 200 ms): against every rank, all of stage B looks slow; against its
// group, only the rank that really is (stage B's 230 ms) stands out. A group of one is compared with
// every rank (it would be its own median).
import { deviationMatrix as devOf, MIN_PEER_GROUP } from '../../web/src/shape';

describe('deviationMatrix with peer groups', () => {
  const m = [[100, 100], [101, 100], [200, 200], [200, 230], [199, 200], [150, 150]];
  const groups = ['A', 'A', 'B', 'B', 'B', 'C'];
  it('compares each rank with its own group\'s median per step', () => {
    const all = devOf(m).dev;
    expect(all[0][0]).toBeLessThan(-40);  // job-wide: stage A looks fast, stage B slow
    const { dev, medians } = devOf(m, groups);
    expect(medians).toEqual(devOf(m).medians);  // the job-wide medians stay as they were
    expect(dev[0]).toEqual([-0.5, 0]);
    expect(dev[2]).toEqual([0, 0]);
    expect(dev[3]).toEqual([0, 30]);  // the straggler of stage B
    expect(dev[4][1]).toBe(0);
    expect(MIN_PEER_GROUP).toBe(2);
    // Alone in its group: against every rank (median of step 1 over all six ranks: 175).
    expect(dev[5]).toEqual(all[5]);
    // No group: against every rank too.
    expect(devOf(m, [undefined, 'A', 'B', 'B', 'B', undefined]).dev[0]).toEqual(all[0]);
  });
});

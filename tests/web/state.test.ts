// The URL hash carries the UI's state (web/src/state.ts): shareable links round-trip.
import { formatHash, parseHash, type UiState } from '../../web/src/state';

describe('URL state', () => {
  it('round-trips every view', () => {
    const states: UiState[] = [
      { view: 'jobs' },
      { view: 'job', job: 'torchelastic 7/a&b', metric: 'collective_ms', rank: 137 },
      { view: 'flame', job: 'j', rank: 2, kind: 'offcpu', diff: true },
      { view: 'flame', job: 'j', rank: 2, kind: 'oncpu', from: '1700000000200000000', to: '1700000000400000000' },
      { view: 'job', job: 'j', rank: 137, step: 31 },
      { view: 'timeline', job: '', rank: 0, step: 12 },
      { view: 'timeline', job: 'j', ranks: [137, 0, 1, 2], step: 31 },
      { view: 'timeline', job: 'j', ranks: [137, 0], step: 31, at: '1700000600000000001' },
      { view: 'job', job: 'j', rank: 137, step: 4, at: '1700000600000000001' },
      { view: 'flame', job: 'j', rank: 2, diff: true, from: '1700000000200000000', to: '1700000000400000000', bfrom: '1700000000000000000', bto: '1700000000100000000' },
      { view: 'job', job: 'j', metric: 'compute_ms', heat: 'abs' },
      { view: 'nodes' },
    ];
    for (const s of states) expect(parseHash(formatHash(s))).toEqual(s);
  });
  it('reads hand-written and broken links safely', () => {
    expect(parseHash('')).toEqual({ view: 'jobs' });
    expect(parseHash('#/nope?rank=1')).toEqual({ view: 'jobs', rank: 1 });
    expect(parseHash('#/flame?rank=-3&kind=gpu&diff=yes&metric=<script>')).toEqual({ view: 'flame' });
    expect(formatHash({ view: 'jobs' })).toBe('#/');
    expect(parseHash('#/timeline?ranks=1,x,3&heat=dev')).toEqual({ view: 'timeline' });
    // A time range is digits only (unix ns); anything else is dropped, not passed to the API.
    expect(parseHash('#/flame?from=12&to=1e9')).toEqual({ view: 'flame', from: '12' });
    expect(parseHash('#/flame?from=-1&to=99999999999999999999')).toEqual({ view: 'flame' });
    expect(parseHash('#/job?at=soon')).toEqual({ view: 'job' });
  });
});

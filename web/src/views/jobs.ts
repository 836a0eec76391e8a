// Jobs: status, step-time trend, findings.
import { api } from '../api';
import { lineChart } from '../chart';
import { errorBox, h } from '../dom';
import { fmtMs, jobStepMs, jobStatusText, stepTrend, type Diagnosis, type Job } from '../shape';
import { formatHash } from '../state';

export async function jobsView(main: HTMLElement): Promise<void> {
  main.append(h('h1', {}, 'Jobs'));
  let jobs: Job[];
  try {
    jobs = await api.jobs();
  } catch (e) {
    main.append(errorBox(e));
    return;
  }
  if (jobs.length === 0) {
    main.append(h('p', { class: 'muted' }, 'No training job in this store yet (no process with a RANK).'));
    return;
  }
  const tbody = h('tbody');
  main.append(h('table', { class: 'jobs' },
    h('thead', {}, h('tr', {}, h('th', {}, 'job'), h('th', {}, 'status'), h('th', {}, 'ranks'), h('th', {}, 'nodes'),
      h('th', { title: "median over ranks of each rank's median step, in the latest 10 minutes (as on the job page)" }, 'step time'), h('th', {}, 'findings'))),
    tbody));
  for (const j of jobs) {
    const href = formatHash({ view: 'job', job: j.job });
    const trendCell = h('td', {}, h('span', { class: 'muted' }, '…'));
    const findCell = h('td', { class: 'findings-cell' }, h('span', { class: 'muted' }, 'diagnosing…'));
    const status = j.status === 'degraded' ? 'warn' : 'ok';
    tbody.append(h('tr', { 'data-job': j.job },
      h('td', {}, h('a', { href }, j.job || '(unnamed)')),
      h('td', { class: 'status-cell', title: j.silent_nodes.length ? `silent: ${j.silent_nodes.join(', ')}` : '' },
        h('span', { class: `badge ${status}`, title: j.status === 'recorded' ? 'a finished recording: strata record wrote this store; no agent sends to it' : '' }, j.status),
        ' ', jobStatusText(j)),
      h('td', {}, `${j.ranks}${j.world_size > 0 && j.world_size !== j.ranks ? ` of ${j.world_size}` : ''}`),
      h('td', {}, j.nodes.length <= 3 ? j.nodes.join(', ') : `${j.nodes.length} nodes`),
      trendCell, findCell));
    api.heatmap(j.job, true).then((hm) => {
      const trend = stepTrend(hm.series.step_ms ?? []);
      trendCell.replaceChildren(
        trend.length ? lineChart(trend.map((_, i) => i + 1), [{ label: 'step', values: trend, color: '#3b82f6' }], { width: 180, height: 36, sparkline: true }) : h('span', { class: 'muted' }, 'no steps'),
        h('span', { class: 'step-ms' }, ` ${fmtMs(jobStepMs(hm.series.step_ms ?? []))}`));
    }).catch((e) => trendCell.replaceChildren(errorBox(e)));
    api.findings(j.job).then((d: Diagnosis) => {
      if (d.error) findCell.replaceChildren(h('span', { class: 'muted' }, d.error));
      else if (d.findings.length === 0) findCell.replaceChildren(h('span', { class: 'badge ok' }, 'healthy'));
      else findCell.replaceChildren(...d.findings.slice(0, 2).map((f) =>
        h('div', { class: 'finding-line' }, h('span', { class: 'badge bad' }, f.cause), ` rank ${f.rank}: ${f.culprit} (${fmtMs(f.lost_ms_per_step)}/step)`)));
    }).catch((e) => findCell.replaceChildren(errorBox(e)));
  }
}

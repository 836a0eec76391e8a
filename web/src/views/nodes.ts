// Nodes and agents: health (last batch, silence) and the agent's own cost; for a store written by
// `strata record`, the recording's cost.
import { api } from '../api';
import { errorBox, h } from '../dom';
import { fmtBytes, fmtNum } from '../shape';

export async function nodesView(main: HTMLElement): Promise<void> {
  main.append(h('h1', {}, 'Nodes and agents'));
  try {
    const [nodes, procs, overhead] = await Promise.all([api.nodes(), api.processes(), api.overhead()]);
    if (nodes.length) {
      main.append(h('table', { class: 'nodes' },
        h('thead', {}, h('tr', {}, ['node', 'status', 'last seen', 'batches', 'agent CPU', 'RSS', 'samples', 'drops', 'probe hits', 'spool', 'watched', 'version'].map((t) => h('th', {}, t)))),
        h('tbody', {}, nodes.map((n) => {
          const hl = n.health ?? {};
          const num = (k: string) => Number(hl[k] ?? NaN);
          return h('tr', { 'data-node': n.node },
            h('td', {}, n.node), h('td', {}, h('span', { class: `badge ${n.status === 'healthy' ? 'ok' : 'bad'}` }, n.status)),
            h('td', {}, `${n.seconds_since_seen.toFixed(0)} s ago`), h('td', {}, fmtNum(n.last_batch)),
            h('td', {}, `${num('cpu_s').toFixed(2)} s`), h('td', {}, fmtBytes(num('rss_bytes'))),
            h('td', {}, fmtNum(num('samples'))), h('td', {}, fmtNum(num('drops'))), h('td', {}, fmtNum(num('probe_hits'))),
            h('td', {}, fmtBytes(num('spool_bytes'))), h('td', {}, fmtNum(num('watched_processes'))), h('td', {}, String(hl.version ?? '')));
        }))));
    } else {
      main.append(h('p', { class: 'muted' }, 'No agent has sent to this collector (a store written by strata record).'));
    }
    const byNode = new Map<string, number>();
    for (const p of procs) byNode.set(p.node, (byNode.get(p.node) ?? 0) + (p.rank >= 0 ? 1 : 0));
    main.append(h('h2', {}, 'Nodes of the recorded processes'),
      h('table', {}, h('thead', {}, h('tr', {}, h('th', {}, 'node'), h('th', {}, 'ranks'))),
        h('tbody', {}, [...byNode].map(([n, r]) => h('tr', {}, h('td', {}, n), h('td', {}, String(r)))))));
    const keys = Object.keys(overhead);
    if (keys.length) {
      const cpu = (overhead.agent_cpu_s ?? 0) + (overhead.bpf_run_s ?? 0);
      const share = overhead.target_cpu_s ? ` = ${((100 * cpu) / overhead.target_cpu_s).toFixed(2)}% of the job's CPU` : '';
      main.append(h('h2', {}, 'Cost of the latest recording'), h('p', {}, `agent ${fmtNum((overhead.agent_cpu_s ?? 0) * 1000)} ms + BPF ${fmtNum((overhead.bpf_run_s ?? 0) * 1000)} ms CPU${share}`),
        h('table', {}, h('tbody', {}, keys.map((k) => h('tr', {}, h('td', {}, k), h('td', {}, fmtNum(overhead[k])))))));
    }
    document.body.dataset.ready = 'nodes';
  } catch (e) {
    main.append(errorBox(e));
  }
}

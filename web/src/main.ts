// strata's web UI: a single page over the collector's REST API; the view and its parameters live in
// the URL hash (state.ts) so every page can be shared.
import './style.css';
import { h } from './dom';
import { formatHash, parseHash, type UiState } from './state';
import { jobsView } from './views/jobs';
import { jobView } from './views/job';
import { nodesView } from './views/nodes';

const main = document.getElementById('main') as HTMLElement;

function go(s: UiState): void {
  location.hash = formatHash(s);
}

async function render(): Promise<void> {
  const s = parseHash(location.hash);
  const t0 = performance.now();
  document.body.dataset.ready = '';
  document.body.dataset.view = s.view;
  main.replaceChildren();
  document.querySelectorAll('header nav a').forEach((a) => a.classList.toggle('active', a.getAttribute('data-view') === s.view));
  switch (s.view) {
    case 'job': await jobView(main, s, go); break;
    // Loaded when first opened: d3-flame-graph and the timeline are not the job page's to parse.
    case 'flame': await (await import('./views/flame')).flameView(main, s, go); break;
    case 'timeline': await (await import('./views/timeline')).timelineView(main, s, go); break;
    case 'nodes': await nodesView(main); break;
    default: await jobsView(main);
  }
  // Read by bench/web_render.sh and the end-to-end test.
  document.body.dataset.renderMs = String(Math.round(performance.now() - t0));
}

document.body.prepend(h('header', {},
  h('a', { class: 'brand', href: '#/' }, 'strata'),
  h('nav', {}, h('a', { href: '#/', 'data-view': 'jobs' }, 'Jobs'), h('a', { href: '#/nodes', 'data-view': 'nodes' }, 'Nodes'))));
window.addEventListener('hashchange', () => void render());
void render();

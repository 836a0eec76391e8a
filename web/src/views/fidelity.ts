// The reduced-fidelity notice (issue 19): where the agents' cost budget lowered the sampling rate or
// turned CFI unwinding off, shown on the pages whose numbers come from those samples.
import { api } from '../api';
import { h } from '../dom';
import { FIDELITY_HEADING, fidelityNotice } from '../shape';

// An element that fills in once the answer is there: empty where fidelity was full, the notice
// where it was not, a muted line where the collector could not say. `ready` resolves once it is
// filled (never rejects): the pages draw what is below it after that, so the notice never moves a
// chart under the pointer.
// `span`: what the page shows (unix ns strings, as its other reads ask; without one, the server's
// latest 10 minutes); `fromNs`/`toNs` narrow the notice to a window of it.
export function fidelitySlot(job: string, opts: { rank?: number; fromNs?: number; toNs?: number; span?: { from?: string; to?: string } } = {}):
{ el: HTMLElement; ready: Promise<void> } {
  const slot = h('div', { id: 'fidelity-notice' });
  const ready = api.fidelity(job, opts.span).then((r) => {
    const lines = fidelityNotice(r.reduced, opts);
    if (!lines.length) return;
    if (r.truncated) lines.push('(the collector listed the first runs only)');
    slot.className = 'notice';
    slot.replaceChildren(h('p', {}, h('strong', {}, 'Reduced fidelity: '), FIDELITY_HEADING.replace(/^Reduced fidelity: /, '')),
      h('ul', {}, lines.map((l) => h('li', {}, l))));
  }).catch((e) => {
    slot.replaceChildren(h('p', { class: 'muted' }, `sampling fidelity unknown: ${e instanceof Error ? e.message : String(e)}`));
  });
  return { el: slot, ready };
}

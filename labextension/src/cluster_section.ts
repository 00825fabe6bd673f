/**
 * The panel's cluster section: each node's GPUs as squares in the tier colour of their holder
 * (mine outlined), the legend, and the cluster's allocated GPUs over the last 24 h (api/history
 * rows, as the scheduler's page charts them).
 */
import { clock, el, num, sparkline } from './format';

/** The cluster, by node and tier: one square per GPU in its holder's tier colour, mine outlined. */
export function clusterSection(cluster: any, me: string | null, history: any[]): HTMLElement {
  const nodes = (cluster.nodes as any[]).map(node => {
    const tiers: Record<string, number> = {};
    const cells = (node.gpu_list as any[]).map(gpu => {
      const holders = gpu.jobs as any[];
      for (const h of holders) {
        tiers[`t${h.tier}`] = (tiers[`t${h.tier}`] || 0) + (h.fraction ?? 1);
      }
      const tier = holders.length ? `t${holders[0].tier}` : 'free';
      const who = holders.map(h => h.user || 'someone').join(', ');
      const mine = me !== null && holders.some(h => h.user === me);
      return el('span', {
        class: `jp-gpusched-gpu jp-gpusched-${tier}${mine ? ' jp-gpusched-gpu-mine' : ''}`,
        title: `GPU ${gpu.index}: ${holders.length ? `${who} (tier ${holders[0].tier})` : 'free'}`
      });
    });
    const byTier = Object.entries(tiers)
      .sort()
      .map(([t, n]) => `${t}: ${num(n)}`)
      .join(' · ');
    return el(
      'div',
      { class: 'jp-gpusched-node', 'data-node': node.name },
      el('span', { class: 'jp-gpusched-node-name' }, `${node.name} (${node.gpu_model})${node.state !== 'up' ? ` [${node.state}]` : ''}`),
      el('span', { class: 'jp-gpusched-gpus' }, ...cells),
      el('span', { class: 'jp-gpusched-node-use' }, `${num(node.free)}/${node.gpus} free${byTier ? ` · ${byTier}` : ''}`)
    );
  });
  const legend = el(
    'div',
    { class: 'jp-gpusched-legend' },
    ...[1, 2, 3].map(t => el('span', {}, el('span', { class: `jp-gpusched-gpu jp-gpusched-t${t}` }), ` tier ${t} `)),
    el('span', {}, el('span', { class: 'jp-gpusched-gpu jp-gpusched-free' }), ' free '),
    el('span', {}, el('span', { class: 'jp-gpusched-gpu jp-gpusched-free jp-gpusched-gpu-mine' }), ' mine')
  );
  return el(
    'section',
    { class: 'jp-gpusched-cluster' },
    el('h3', {}, `Cluster: ${num(cluster.allocated_gpus)}/${cluster.total_gpus} GPUs allocated`),
    ...nodes,
    legend,
    historyLine(history)
  );
}

/** The cluster's allocated GPUs over the last 24 h, as the page's utilization chart has them. */
function historyLine(rows: any[]): HTMLElement | null {
  if (!rows.length) {
    return null;
  }
  const allocated = (row: any) => Object.values(row.allocated as Record<string, number>).reduce((a, b) => a + b, 0);
  const last = rows[rows.length - 1];
  const note = `allocated, last 24 h (${num(allocated(last))} of ${last.total_gpus} at ${clock(last.time)})`;
  return sparkline(
    rows.map(row => (row.total_gpus ? (100 * allocated(row)) / row.total_gpus : null)),
    'GPUs allocated in the whole cluster, one point per history sample (the page draws it by tier)',
    note
  );
}

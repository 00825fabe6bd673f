// The scheduler's web page (service/page.py): fetch the JSON APIs every few seconds and draw
// each section (inline SVG, no library). Hand-written, shipped as is: no build step.
'use strict';

const body = document.body;
const PREFIX = body.dataset.prefix;
const ME = body.dataset.user;
const ADMIN = body.dataset.admin === 'true';
const REFRESH_MS = Number(body.dataset.refresh || 5) * 1000;
const XSRF = body.dataset.xsrf;
// standalone (a token file, no hub): the page was opened with ?token=...
const TOKEN = new URLSearchParams(location.search).get('token');
const SVG = 'http://www.w3.org/2000/svg';
// one tier palette everywhere (page.css .t1/.t2/.t3, the Lab panel, the QueueWidget)
const TIER_COLOURS = { 1: '#1565c0', 2: '#2e7d32', 3: '#ef6c00' };
const FAMILY_COLOURS = { capacity: '#6a1b9a', placement: '#00838f', policy: '#c62828' };
const FAMILY_WORDS = {
  capacity: 'capacity (hardware busy)',
  placement: 'placement (shape, topology)',
  policy: 'policy (quotas, limits, holds)',
};
const SERIES_COLOURS = ['#1565c0', '#2e7d32', '#ef6c00', '#6a1b9a', '#00838f', '#c62828', '#5d4037', '#455a64'];
const DAY = 86400;

// -- talking to the service ---------------------------------------------------------------------
async function api(path, options = {}) {
  const headers = { Accept: 'application/json', ...(options.headers || {}) };
  if (TOKEN) headers.Authorization = `token ${TOKEN}`;
  if (options.method && options.method !== 'GET') headers['X-XSRFToken'] = XSRF;
  if (options.json !== undefined) {
    headers['Content-Type'] = 'application/json';
    options = { ...options, body: JSON.stringify(options.json) };
  }
  const response = await fetch(PREFIX + path, { ...options, headers, credentials: 'same-origin' });
  let data = null;
  try {
    data = await response.json();
  } catch (e) {
    data = null;
  }
  if (!response.ok) {
    const error = new Error((data && data.error) || `${response.status} ${response.statusText}`);
    error.status = response.status;
    error.field = data && data.field;
    throw error;
  }
  return data;
}

// -- building DOM and SVG ------------------------------------------------------------------------
function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  setAttrs(node, attrs);
  node.append(...children.flat().filter((c) => c !== null && c !== undefined));
  return node;
}

function svg(tag, attrs = {}, ...children) {
  const node = document.createElementNS(SVG, tag);
  setAttrs(node, attrs);
  node.append(...children.flat().filter((c) => c !== null && c !== undefined));
  return node;
}

function setAttrs(node, attrs) {
  for (const [key, value] of Object.entries(attrs)) {
    if (value === null || value === undefined || value === false) continue;
    if (key === 'class') node.setAttribute('class', value);
    else if (key === 'text') node.textContent = value;
    else if (key.startsWith('on')) node.addEventListener(key.slice(2), value);
    else node.setAttribute(key, value === true ? '' : String(value));
  }
}

function fill(section, ...children) {
  const target = document.querySelector(`#${section} .body`);
  if (target) target.replaceChildren(...children.flat());
}

// -- words ---------------------------------------------------------------------------------------
function gpus(n) {
  const value = Math.round(n * 100) / 100;
  return `${value} GPU${value === 1 ? '' : 's'}`;
}

function duration(seconds) {
  if (seconds < 60) return 'under a minute';
  const minutes = Math.round(seconds / 60);
  if (minutes < 60) return `${minutes} min`;
  const hours = Math.floor(minutes / 60);
  const rest = minutes % 60;
  if (hours < 48) return rest ? `${hours} h ${rest} min` : `${hours} h`;
  return `${Math.round(hours / 24)} days`;
}

function clock(epoch, seconds = false) {
  const parts = { hour: '2-digit', minute: '2-digit', ...(seconds ? { second: '2-digit' } : {}) };
  return new Date(epoch * 1000).toLocaleTimeString([], parts);
}

function eta(epoch) {
  if (epoch === null || epoch === undefined) return '';
  const wait = epoch - Date.now() / 1000;
  return wait <= 0 ? 'any moment' : `about ${duration(wait)} (${clock(epoch)})`;
}

function tierBadge(tier) {
  return el('span', { class: `tier t${tier}`, text: `tier ${tier}` });
}

function reasonText(reason) {
  return reason ? reason.message : '';
}

function ordinal(n) {
  const s = ['th', 'st', 'nd', 'rd'];
  const v = n % 100;
  return n + (s[(v - 20) % 10] || s[v] || s[0]);
}

// -- charts --------------------------------------------------------------------------------------
// A horizontal bar: in use against the guarantee (a tick) and the limit (the bar's end).
function quotaBar(inUse, guaranteed, limit) {
  const width = 300;
  const top = Math.max(limit === null ? 0 : limit, guaranteed || 0, inUse, 1e-9);
  const x = (v) => (v / top) * width;
  return svg(
    'svg',
    { class: 'bar', viewBox: `0 0 ${width} 16`, preserveAspectRatio: 'none', role: 'img' },
    svg('rect', { x: 0, y: 2, width, height: 12, fill: '#eeeeee' }),
    limit === null ? null : svg('rect', { x: 0, y: 2, width: x(limit), height: 12, fill: '#e3f2fd' }),
    svg('rect', { class: 'in-use', x: 0, y: 2, width: x(inUse), height: 12, fill: '#1565c0' }),
    guaranteed === null ? null : svg('rect', { x: Math.max(0, x(guaranteed) - 1), y: 0, width: 2, height: 16, fill: '#212121' }),
  );
}

function sparkline(points) {
  const known = points.filter((p) => p[1] !== null);
  if (known.length < 2) return el('span', { class: 'muted', text: known.length ? `${known[0][1]}%` : 'no samples yet' });
  const t0 = known[0][0];
  const t1 = known[known.length - 1][0];
  const span = Math.max(t1 - t0, 1);
  const line = known.map((p) => `${(((p[0] - t0) / span) * 88 + 1).toFixed(1)},${(21 - (p[1] / 100) * 20).toFixed(1)}`);
  const last = known[known.length - 1][1];
  return el(
    'span',
    { class: 'sparkline', 'data-last': last },
    svg(
      'svg',
      { class: 'spark', viewBox: '0 0 90 22', role: 'img', 'aria-label': `GPU utilization, now ${last}%` },
      svg('polyline', { points: line.join(' '), fill: 'none', stroke: '#2e7d32', 'stroke-width': 1.5 }),
    ),
    ` ${last}%`,
  );
}

// A time chart: ``series`` [{key, label, colour, value(row)}], stacked areas or lines; ``top``
// the y scale's end. The element carries each series' latest value (data-now-<key>) so that
// what it draws can be read back.
function timeChart(rows, series, { stacked = true, top = null, until, unit = 'GPUs' } = {}) {
  const width = 900;
  const height = 170;
  const left = 34;
  const bottom = 18;
  const plotW = width - left - 6;
  const plotH = height - bottom - 6;
  if (!rows.length) return [el('p', { class: 'empty', text: 'no history recorded yet' })];
  const t0 = rows[0].time;
  const t1 = Math.max(until, rows[rows.length - 1].time, t0 + 1);
  const sums = rows.map((row) => series.reduce((s, item) => s + item.value(row), 0));
  const peaks = rows.map((row) => Math.max(0, ...series.map((item) => item.value(row))));
  const yTop = top || Math.max(1, ...(stacked ? sums : peaks));
  const x = (t) => left + ((t - t0) / (t1 - t0)) * plotW;
  const y = (v) => 6 + plotH - (v / yTop) * plotH;
  const short = t1 - t0 < 600; // a young history: its time axis in seconds
  const chart = svg('svg', { class: 'chart', viewBox: `0 0 ${width} ${height}`, role: 'img' });
  chart.append(
    svg('line', { x1: left, y1: y(0), x2: width - 6, y2: y(0), stroke: '#bdbdbd' }),
    svg('text', { x: 2, y: 14, text: `${Math.round(yTop * 10) / 10}` }),
    svg('text', { x: 2, y: y(0), text: '0' }),
    svg('text', { x: left, y: height - 3, text: clock(t0, short) }),
    svg('text', { x: width - 6, y: height - 3, 'text-anchor': 'end', text: clock(t1, short) }),
    svg('text', { x: left + plotW / 2, y: height - 3, 'text-anchor': 'middle', text: clock((t0 + t1) / 2, short) }),
  );
  const base = rows.map(() => 0);
  const latest = {};
  for (const item of series) {
    const values = rows.map((row) => item.value(row));
    latest[item.key] = values[values.length - 1];
    // a step line: each row's value holds until the next row
    const points = [];
    rows.forEach((row, i) => {
      const next = i + 1 < rows.length ? rows[i + 1].time : t1;
      const v = values[i] + (stacked ? base[i] : 0);
      points.push([x(row.time), y(v)], [x(next), y(v)]);
    });
    if (stacked) {
      const under = [];
      rows.forEach((row, i) => {
        const next = i + 1 < rows.length ? rows[i + 1].time : t1;
        under.push([x(row.time), y(base[i])], [x(next), y(base[i])]);
      });
      const outline = [...points, ...under.reverse()].map((p) => p.map((n) => n.toFixed(1)).join(','));
      chart.append(svg('polygon', { class: `series series-${item.key}`, points: outline.join(' '), fill: item.colour, 'fill-opacity': 0.75 }));
      values.forEach((v, i) => (base[i] += v));
    } else {
      const line = points.map((p) => p.map((n) => n.toFixed(1)).join(','));
      chart.append(svg('polyline', { class: `series series-${item.key}`, points: line.join(' '), fill: 'none', stroke: item.colour, 'stroke-width': 2, 'stroke-dasharray': item.dashed ? '5 3' : null }));
    }
  }
  const legend = el(
    'div',
    { class: 'chart-legend' },
    series.map((item) =>
      el(
        'span',
        { class: 'legend-item', 'data-key': item.key, 'data-now': latest[item.key] },
        el('span', { class: 'swatch' }),
        `${item.label}: ${Math.round(latest[item.key] * 100) / 100} ${unit} now${item.extra ? item.extra : ''}`,
      ),
    ),
  );
  legend.querySelectorAll('.swatch').forEach((swatch, i) => (swatch.style.background = series[i].colour));
  return [chart, legend];
}

// -- the sections --------------------------------------------------------------------------------
function groupArrays(jobs) {
  // one row per array (the contract's array_id / array_index), the others as they are
  const out = [];
  const arrays = new Map();
  for (const job of jobs) {
    if (!job.array_id) {
      out.push({ job, members: [job] });
      continue;
    }
    let group = arrays.get(job.array_id);
    if (!group) {
      group = { job, members: [] };
      arrays.set(job.array_id, group);
      out.push(group);
    }
    group.members.push(job);
  }
  return out;
}

function drawMyJobs(jobs, sessions) {
  const spark = new Map(sessions.map((s) => [s.job_id, s.utilization_history || []]));
  if (!jobs.length) return fill('my-jobs', el('p', { class: 'empty', text: 'No pending or running jobs or servers.' }));
  const rows = groupArrays(jobs).map(({ job, members }) => {
    const isArray = members.length > 1 || job.array_id;
    const running = members.filter((m) => m.state === 'running').length;
    const what = isArray
      ? `array ${job.array_id}: ${members.length} jobs (${running} running, ${members.length - running} pending)`
      : job.name || job.command || job.notebook || job.kind;
    const state = isArray ? (running ? 'running' : 'pending') : job.state;
    const waiting = members.find((m) => m.state === 'pending');
    const notebookGPUs = job.kind === 'notebook' && job.gpus > 0 && job.state === 'running';
    return el(
      'tr',
      { class: `job ${state}`, 'data-id': job.id, 'data-array': job.array_id || null },
      el('td', { text: isArray ? job.array_id : job.id }),
      el('td', { text: job.kind === 'notebook' && !isArray ? job.name || 'notebook server' : what }),
      el('td', { text: state }),
      el('td', { text: job.queue }),
      el('td', {}, tierBadge(job.tier)),
      el('td', { class: 'num', text: gpus(job.gpus * (job.gpu_fraction || 1)) }),
      el('td', { class: 'reason', text: waiting ? reasonText(waiting.reason) : '' }),
      el('td', { class: 'num', text: waiting && waiting.position !== null ? waiting.position + 1 : '' }),
      el('td', { text: waiting && waiting.reason ? eta(waiting.reason.eta) : '' }),
      el('td', {}, notebookGPUs ? sparkline(spark.get(job.id) || []) : ''),
    );
  });
  fill(
    'my-jobs',
    el(
      'table',
      {},
      el('thead', {}, el('tr', {}, ['id', 'what', 'state', 'queue', 'tier', 'GPUs', 'why it waits', 'position', 'expected start', 'GPU use'].map((h) => el('th', { text: h })))),
      el('tbody', {}, rows),
    ),
  );
}

function drawMyQueues(me) {
  if (!me.queues.length) return fill('my-queues', el('p', { class: 'empty', text: 'You may submit to no queue.' }));
  fill(
    'my-queues',
    me.queues.map((q) => {
      const share = q.fair_share;
      return el(
        'div',
        { class: 'queue-row', 'data-queue': q.path, 'data-in-use': q.in_use },
        el(
          'div',
          { class: 'title' },
          el('strong', { text: q.path + (q.default ? ' (default)' : '') }),
          el('span', { class: 'figures', text: `in use ${q.in_use} · guaranteed ${q.guaranteed} · limit ${q.limit === null ? 'none' : q.limit}` }),
        ),
        quotaBar(q.in_use, q.guaranteed, q.limit),
        el('div', { class: 'figures' }, share ? `${ordinal(share.rank)} of ${share.of} in the fair-share order (factor ${share.factor})` : 'fair-share order not computed yet'),
      );
    }),
  );
}

function drawCluster(cluster) {
  let mine = 0;
  const nodes = cluster.nodes.map((node) => {
    const cells = node.gpu_list.map((gpu) => {
      const holder = gpu.jobs[0];
      const isMine = gpu.jobs.some((h) => h.user === ME);
      if (isMine) mine += 1;
      const who = gpu.jobs.map((h) => `${h.job || 'a job'} (${h.user || 'someone'}, tier ${h.tier}${h.fraction < 1 ? `, ${h.fraction} of it` : ''})`);
      return el('div', {
        class: `gpu-cell ${holder ? `t${holder.tier}` : 'free'}${isMine ? ' mine' : ''}${holder && holder.reserved ? ' reserved' : ''}`,
        'data-tier': holder ? holder.tier : null,
        title: `${node.name} GPU ${gpu.index}: ${who.length ? who.join(', ') : 'free'}`,
      });
    });
    const down = node.state !== 'up';
    return el(
      'div',
      { class: `node${down ? ' down' : ''}`, 'data-node': node.name },
      el('div', { class: 'name' }, `${node.name} · ${node.gpu_model} · ${node.free} free `, down ? el('span', { class: 'state', text: node.state }) : null),
      el('div', { class: 'cells' }, cells),
    );
  });
  const legend = el(
    'div',
    { class: 'legend' },
    [1, 2, 3].map((t) => el('span', {}, el('span', { class: `swatch t${t}` }), `tier ${t}`)),
    el('span', {}, el('span', { class: 'swatch free' }), 'free'),
    el('span', {}, el('span', { class: 'swatch mine' }), `mine (${mine})`),
    el('span', { text: `${cluster.allocated_gpus} of ${cluster.total_gpus} GPUs allocated` }),
  );
  fill('cluster', el('div', { class: 'nodes', 'data-total': cluster.total_gpus, 'data-mine': mine }, nodes), legend);
}

function queueRows(entries, label) {
  return groupArrays(entries).map(({ job, members }) =>
    el(
      'tr',
      { class: `entry${job.mine ? ' mine' : ''}`, 'data-id': job.id },
      el('td', { class: 'num', text: label || (job.position === null ? '' : job.position + 1) }),
      el('td', { text: members.length > 1 ? `${job.array_id} (${members.length} jobs)` : job.id }),
      el('td', { text: job.mine ? `${job.user} (me)` : job.user || 'someone' }),
      el('td', { text: job.queue }),
      el('td', {}, tierBadge(job.tier)),
      el('td', { class: 'num', text: gpus(job.gpus * (job.gpu_fraction || 1)) }),
      el('td', { class: 'reason', text: reasonText(job.reason) }),
      el('td', { text: job.reason ? eta(job.reason.eta) : '' }),
    ),
  );
}

function drawQueue(queue) {
  const rows = [...queueRows(queue.jobs), ...queueRows(queue.held, 'held'), ...queueRows(queue.retrying, 'retry')];
  const summary = el('p', { class: 'muted', text: `${queue.pending} pending, ${queue.running} running` });
  if (!rows.length) return fill('queue', summary, el('p', { class: 'empty', text: 'Nobody is waiting.' }));
  fill(
    'queue',
    summary,
    el(
      'table',
      {},
      el('thead', {}, el('tr', {}, ['position', 'job', 'user', 'queue', 'tier', 'GPUs', 'why it waits', 'expected start'].map((h) => el('th', { text: h })))),
      el('tbody', {}, rows),
    ),
  );
}

function drawUtilization(history) {
  const rows = history.rows;
  const tiers = ['1', '2', '3'].map((t) => ({
    key: `tier${t}`,
    label: `tier ${t} allocated`,
    colour: TIER_COLOURS[t],
    value: (row) => row.allocated[t] || 0,
  }));
  const busy = (row) => Object.values(row.measured).reduce((s, m) => s + (m.gpus * m.utilization) / 100, 0);
  const total = rows.length ? rows[rows.length - 1].total_gpus : 0;
  const allocatedNow = rows.length ? Object.values(rows[rows.length - 1].allocated).reduce((s, v) => s + v, 0) : 0;
  const parts = timeChart(rows, tiers, { top: total || null, until: history.until });
  const measured = rows.length ? timeChart(rows, [{ key: 'busy', label: 'measured busy (notebook servers sampled)', colour: '#212121', value: busy }], { stacked: false, top: total || null, until: history.until }) : [];
  fill(
    'utilization',
    el('div', { class: 'utilization', 'data-allocated-now': allocatedNow, 'data-total': total }, el('p', { class: 'muted', text: `${allocatedNow} of ${total} GPUs allocated now` }), parts),
    measured.length ? el('details', {}, el('summary', { text: 'measured GPU utilization' }), measured) : null,
  );
}

function drawWaiting(history) {
  const families = Object.keys(FAMILY_WORDS).map((family) => ({
    key: family,
    label: FAMILY_WORDS[family],
    colour: FAMILY_COLOURS[family],
    value: (row) => row.pending[family] || 0,
    extra: `, ${history.waited_gpu_hours[family].toFixed(2)} GPU-hours waited`,
  }));
  fill('waiting', timeChart(history.rows, families, { until: history.until, unit: 'GPUs waiting' }));
}

function drawQueueHistory(history) {
  const names = new Set();
  history.rows.forEach((row) => Object.keys(row.queues).forEach((q) => names.add(q)));
  const series = [...names].sort().map((q, i) => ({
    key: q.replace(/[^A-Za-z0-9_-]/g, '_'),
    label: q,
    colour: SERIES_COLOURS[i % SERIES_COLOURS.length],
    value: (row) => row.queues[q] || 0,
  }));
  if (!series.length) return fill('queue-history', el('p', { class: 'empty', text: 'No queue has run anything in this period.' }));
  fill('queue-history', timeChart(history.rows, series, { stacked: false, until: history.until }));
}

function usageTable(title, rows, withCost) {
  const top = Math.max(1e-9, ...rows.map((r) => r.gpu_hours));
  return el(
    'div',
    { class: 'showback', 'data-by': title },
    el('h3', { text: `by ${title}` }),
    rows.length
      ? el(
          'table',
          {},
          el('thead', {}, el('tr', {}, [title, 'GPU-hours', '', withCost ? 'cost' : null].filter(Boolean).map((h) => el('th', { text: h })))),
          el(
            'tbody',
            {},
            rows.map((r) =>
              el(
                'tr',
                { 'data-key': r.key, 'data-gpu-hours': r.gpu_hours },
                el('td', { text: r.key }),
                el('td', { class: 'num', text: r.gpu_hours.toFixed(2) }),
                el('td', {}, quotaBar(r.gpu_hours, null, top)),
                withCost ? el('td', { class: 'num', text: r.cost === null || r.cost === undefined ? 'no price' : r.cost.toFixed(2) }) : null,
              ),
            ),
          ),
        )
      : el('p', { class: 'empty', text: 'nothing used' }),
  );
}

function drawShowback(byQueue, byUser, byModel) {
  const priced = byModel.usage.some((r) => 'cost' in r);
  fill('showback', el('div', { class: 'showback-grid' }, usageTable('queue', byQueue.usage, false), usageTable('user', byUser.usage, false), usageTable('gpu_model', byModel.usage, priced)));
}

function drawReaperEvents(events) {
  const wanted = events.filter((e) => e.kind.startsWith('reaper-') && e.kind !== 'reaper-settings').slice(0, 30);
  if (!wanted.length) return fill('reaper-events', el('p', { class: 'empty', text: 'No warnings or culls recently.' }));
  fill(
    'reaper-events',
    el(
      'table',
      {},
      el('thead', {}, el('tr', {}, ['when', 'what', 'job', 'user', 'message', 'evidence'].map((h) => el('th', { text: h })))),
      el(
        'tbody',
        {},
        wanted.map((e) =>
          el(
            'tr',
            { class: `event ${e.kind}` },
            el('td', { text: new Date(e.time * 1000).toLocaleString() }),
            el('td', { text: e.kind.replace('reaper-', '') }),
            el('td', { text: e.job_id || '' }),
            el('td', { text: e.user || '' }),
            el('td', { class: 'reason', text: e.message }),
            el('td', {}, e.data ? el('details', {}, el('summary', { text: 'samples, settings' }), el('pre', { text: JSON.stringify(e.data, null, 1) })) : ''),
          ),
        ),
      ),
    ),
  );
}

function drawNodesAdmin(cluster) {
  fill(
    'nodes-admin',
    el(
      'table',
      {},
      el('tbody', {}, cluster.nodes.map((node) => {
        const drained = node.state === 'drain' || node.state === 'draining' || node.state === 'down';
        const action = drained ? 'resume' : 'drain';
        return el(
          'tr',
          { 'data-node': node.name, 'data-state': node.state },
          el('td', { text: node.name }),
          el('td', { text: node.state }),
          el('td', {}, el('button', { type: 'button', class: `node-${action}`, text: action, onclick: () => nodeAction(node.name, action) })),
        );
      })),
    ),
  );
}

async function nodeAction(name, action) {
  try {
    await api(`api/nodes/${encodeURIComponent(name)}/${action}`, { method: 'POST' });
    refresh();
  } catch (error) {
    showStatus(`${action} ${name}: ${error.message}`);
  }
}

const REAPER_FIELDS = [
  ['enabled', 'checkbox', 'on'],
  ['idle_threshold', 'number', 'idle below (%)'],
  ['warning_lead', 'text', 'warning lead (s or 10m)'],
  ['timeout_tier_1', 'text', 'timeout, tier 1'],
  ['timeout_tier_2', 'text', 'timeout, tier 2'],
  ['timeout_tier_3', 'text', 'timeout, tier 3'],
  ['max_lifetime', 'text', 'max lifetime'],
];
let reaperFormFilled = false;

function drawReaperForm(reaper) {
  if (reaperFormFilled) return; // keep what the admin is typing across refreshes
  reaperFormFilled = true;
  const form = document.getElementById('reaper-form');
  const settings = reaper.settings;
  form.replaceChildren(
    ...REAPER_FIELDS.map(([name, type, label]) => {
      const value = settings[name];
      const input = el('input', { name, type, size: 8 });
      if (type === 'checkbox') input.checked = Boolean(value);
      else input.value = value === null || value === undefined ? '' : value;
      return el('label', {}, label, input);
    }),
    el('button', { type: 'submit', text: 'Save' }),
  );
}

async function saveReaper(event) {
  event.preventDefault();
  const form = event.target;
  const answer = document.getElementById('reaper-answer');
  const changes = {};
  for (const [name, type] of REAPER_FIELDS) {
    const input = form.elements[name];
    if (type === 'checkbox') changes[name] = input.checked;
    else if (input.value.trim() === '') changes[name] = name.startsWith('timeout') || name === 'max_lifetime' ? null : undefined;
    else changes[name] = Number.isFinite(Number(input.value)) ? Number(input.value) : input.value.trim();
  }
  Object.keys(changes).forEach((k) => changes[k] === undefined && delete changes[k]);
  try {
    const saved = await api('api/reaper', { method: 'PUT', json: changes });
    reaperFormFilled = false;
    drawReaperForm(saved); // the settings now in force
    answer.className = 'answer';
    answer.textContent = 'Saved.';
  } catch (error) {
    answer.className = 'answer error';
    answer.textContent = `Not saved: ${error.message}`;
  }
}

// -- "when would I start?" (POST api/estimate: the fields of POST api/jobs) ---------------------
function fillQueueChoices(me) {
  const select = document.querySelector('#estimate-form select[name=queue]');
  if (select.options.length) return;
  for (const q of me.queues) select.append(el('option', { value: q.path, text: q.path, selected: q.default }));
}

async function estimate(event) {
  event.preventDefault();
  const form = event.target;
  const answer = document.getElementById('estimate-answer');
  const job = { command: 'true', gpus: Number(form.elements.gpus.value) };
  if (form.elements.queue.value) job.queue = form.elements.queue.value;
  if (form.elements.tier.value) job.tier = Number(form.elements.tier.value);
  if (form.elements.walltime.value.trim()) job.walltime = form.elements.walltime.value.trim();
  answer.className = 'answer';
  answer.textContent = 'asking…';
  try {
    const result = await api('api/estimate', { method: 'POST', json: job });
    answer.dataset.startNow = result.start_now;
    if (result.start_now) answer.textContent = `It would start now, in ${result.queue}.`;
    else {
      const when = result.eta ? `in ${eta(result.eta)}` : 'at a time the scheduler cannot tell yet';
      const place = result.position ? `, ${ordinal(result.position)} in line in ${result.queue}` : '';
      answer.textContent = `It would wait${place}: ${reasonText(result.reason)}. Expected start ${when}.`;
    }
  } catch (error) {
    answer.className = 'answer error';
    answer.textContent = error.status === 404 ? 'This service cannot estimate yet (no api/estimate).' : `No estimate: ${error.message}`;
  }
}

// -- the refresh loop ----------------------------------------------------------------------------
function showStatus(text) {
  const status = document.getElementById('status');
  status.hidden = !text;
  status.textContent = text || '';
}

let timer = null;

async function refresh() {
  clearTimeout(timer);
  const now = Date.now() / 1000;
  const mineOnly = ADMIN ? `&user=${encodeURIComponent(ME)}` : '';
  try {
    const [me, jobs, queue, cluster, history, reaper] = await Promise.all([
      api('api/me'),
      api(`api/jobs?state=pending&state=running&limit=500${mineOnly}`),
      api('api/queue?limit=200'),
      api('api/cluster'),
      api(`api/history?since=${now - DAY}`),
      api('api/reaper').catch(() => ({ sessions: [], settings: {} })),
    ]);
    drawMyJobs(jobs.jobs, reaper.sessions.filter((s) => s.user === ME));
    drawMyQueues(me);
    fillQueueChoices(me);
    drawCluster(cluster);
    drawQueue(queue);
    drawUtilization(history);
    if (ADMIN) {
      const [byQueue, byUser, byModel, events] = await Promise.all([
        api('api/usage?by=queue'),
        api('api/usage?by=user'),
        api('api/usage?by=gpu_model'),
        api('api/events?limit=300'),
      ]);
      drawWaiting(history);
      drawQueueHistory(history);
      drawShowback(byQueue, byUser, byModel);
      drawReaperEvents(events.events);
      drawNodesAdmin(cluster);
      drawReaperForm(reaper);
    }
    showStatus('');
    document.getElementById('updated').textContent = `updated ${new Date().toLocaleTimeString()}`;
  } catch (error) {
    showStatus(`Could not reach the scheduler: ${error.message}`);
  }
  timer = setTimeout(refresh, REFRESH_MS);
}

document.getElementById('estimate-form').addEventListener('submit', estimate);
const reaperForm = document.getElementById('reaper-form');
if (reaperForm) reaperForm.addEventListener('submit', saveReaper);
refresh();

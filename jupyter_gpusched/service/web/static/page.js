// The scheduler's web page (service/page.py): fetch the JSON APIs every few seconds and draw
// each section (with draw.js; admins' sections in admin.js). Hand-written, shipped as is: no
// build step. Loaded last, after draw.js (and admin.js): it starts the refresh loop.
'use strict';

const body = document.body;
const PREFIX = body.dataset.prefix;
const ME = body.dataset.user;
const ADMIN = body.dataset.admin === 'true';
const REFRESH_MS = Number(body.dataset.refresh || 5) * 1000;
const XSRF = body.dataset.xsrf;
// standalone (a token file, no hub): the page was opened with ?token=...
const TOKEN = new URLSearchParams(location.search).get('token');

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

// an array's row: its pending elements named as the CLI's queue names them, a-000012_[2-5%2]
// (api/queue's "arrays", core/arrays.py array_name), or its id when none is pending
function arrayName(job, names) {
  return names[job.array_id] || job.array_id;
}

function counted(members) {
  const running = members.filter((m) => m.state === 'running').length;
  return { running, pending: members.length - running };
}

function cancelQuestion(label, count) {
  // "Cancel a-000005_[0-5]? Its 4 pending jobs leave the queue; its 1 running job gets the
  // stop signal." (what is not there, not said)
  const parts = [];
  if (count.pending) parts.push(`its ${count.pending} pending job${count.pending === 1 ? ' leaves' : 's leave'} the queue`);
  if (count.running) parts.push(`its ${count.running} running job${count.running === 1 ? ' gets' : 's get'} the stop signal`);
  const said = parts.join('; ');
  return `Cancel ${label}? ${said.charAt(0).toUpperCase()}${said.slice(1)}.`;
}

async function cancelArray(arrayId, label, count, button) {
  // a cancel cannot be taken back: the page asks first, in the words of the row
  const question = cancelQuestion(label, count);
  if (!window.confirm(question)) return;
  button.disabled = true;
  try {
    await api(`api/arrays/${encodeURIComponent(arrayId)}`, { method: 'DELETE' });
    refresh();
  } catch (error) {
    showStatus(`Could not cancel ${arrayId}: ${error.message}`);
    button.disabled = false;
  }
}

async function cancelJob(job, button) {
  // a single job's Cancel: asked first, as an array's
  const label = job.name ? `${job.id} (${job.name})` : job.id;
  const question = job.state === 'running'
    ? `Cancel ${label}? It gets the stop signal.`
    : `Cancel ${label}? It leaves the queue.`;
  if (!window.confirm(question)) return;
  button.disabled = true;
  try {
    await api(`api/jobs/${encodeURIComponent(job.id)}`, { method: 'DELETE' });
    refresh();
  } catch (error) {
    showStatus(`Could not cancel ${job.id}: ${error.message}`);
    button.disabled = false;
  }
}

function cancelControl(job) {
  // a batch job: Cancel; a notebook server is stopped where it was started, on the hub's home
  // page (as the notebook's queue widget says); one already signalled: nothing to do
  if (job.stopping) return el('span', { class: 'stopping', text: 'stopping' });
  if (job.kind === 'notebook') {
    return el('a', { class: 'server-stop', href: `${PREFIX}../../hub/home`, text: 'stop it on the hub home page' });
  }
  return el('button', { type: 'button', class: 'job-cancel', text: 'Cancel', onclick: (event) => cancelJob(job, event.target) });
}

function deadlineBadge(job) {
  // a job with a deadline: when it is due (local time), or that it missed it
  if (job.deadline === null || job.deadline === undefined) return null;
  const missed = Boolean(job.deadline_missed);
  const text = `${missed ? 'missed its deadline' : 'due by'} ${dayAndClock(job.deadline)}`;
  return el('span', { class: `deadline${missed ? ' missed' : ''}`, text, title: new Date(job.deadline * 1000).toString() });
}

function drawMyJobs(jobs, sessions, names) {
  const spark = new Map(sessions.map((s) => [s.job_id, s.utilization_history || []]));
  if (!jobs.length) return fill('my-jobs', el('p', { class: 'empty', text: 'No pending or running jobs or servers.' }));
  const rows = groupArrays(jobs).map(({ job, members }) => {
    const isArray = Boolean(job.array_id);
    const count = counted(members);
    const what = isArray
      ? `${job.name ? `${job.name}: ` : ''}array of ${jobsText(members.length)}, ${count.running} running, ${count.pending} pending`
      : job.name || job.command || job.notebook || job.kind;
    const state = isArray ? (count.running ? 'running' : 'pending') : job.state;
    // an array's first pending element in the queue's order speaks for it (as in the queue)
    const pendingOnes = members.filter((m) => m.state === 'pending');
    const waiting = pendingOnes.reduce((first, m) => (first && (first.position ?? Infinity) <= (m.position ?? Infinity) ? first : m), null);
    const notebookGPUs = job.kind === 'notebook' && job.gpus > 0 && job.state === 'running';
    // an array cancelled already (nothing pending, its running elements signalled): stopping
    const arrayStopping = isArray && !count.pending && members.every((m) => m.stopping);
    const cancel = !isArray
      ? cancelControl(job)
      : arrayStopping
        ? el('span', { class: 'stopping', text: 'stopping' })
        : el('button', { type: 'button', class: 'array-cancel', text: 'Cancel array', onclick: (event) => cancelArray(job.array_id, arrayName(job, names), count, event.target) });
    return el(
      'tr',
      { class: `job ${state}`, 'data-id': isArray ? null : job.id, 'data-array': job.array_id || null, 'data-running': count.running, 'data-pending': count.pending },
      el('td', { text: isArray ? arrayName(job, names) : job.id }),
      el('td', { class: 'what', text: job.kind === 'notebook' ? job.name || 'notebook server' : what }),
      el('td', { text: state }, deadlineBadge(job)),
      el('td', { text: job.queue }),
      el('td', {}, tierBadge(job.tier)),
      el('td', { class: 'num', text: gpus(job.gpus * (job.gpu_fraction || 1)) }),
      el(
        'td',
        { class: 'reason' },
        waiting ? el('span', { class: 'why', text: reasonText(waiting.reason) }) : '',
        // how long the scheduler plans it to run (estimated, its walltime, or the default)
        waiting && waiting.planned_run_time ? el('div', { class: 'muted planned', 'data-from': waiting.planned_run_time.from, text: waiting.planned_run_time.message }) : null,
      ),
      el('td', { class: 'num', text: waiting && waiting.position !== null ? waiting.position + 1 : '' }),
      el('td', { class: 'when', text: waiting && waiting.reason ? eta(waiting.reason.eta) : '' }),
      el('td', {}, notebookGPUs ? sparkline(spark.get(job.id) || []) : '', cancel),
    );
  });
  fill(
    'my-jobs',
    el(
      'table',
      {},
      el('thead', {}, el('tr', {}, ['id', 'what', 'state', 'queue', 'tier', 'GPUs', 'why it waits', 'position', 'expected start', ''].map((h) => el('th', { text: h })))),
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

function queueRows(entries, label, names = {}) {
  return groupArrays(entries).map(({ job, members }) =>
    el(
      'tr',
      { class: `entry${job.mine ? ' mine' : ''}`, 'data-id': job.array_id ? null : job.id, 'data-array': job.array_id || null, 'data-count': members.length },
      el('td', { class: 'num', text: label || (job.position === null ? '' : job.position + 1) }),
      el('td', { text: job.array_id ? `${arrayName(job, names)} (${members.length} pending)` : job.id }),
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
  const rows = [...queueRows(queue.jobs, null, queue.arrays), ...queueRows(queue.held, 'held'), ...queueRows(queue.retrying, 'retry')];
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
    el('div', { class: 'utilization', 'data-allocated-now': allocatedNow, 'data-total': total }, el('p', { class: 'muted', text: rows.length ? `${allocatedNow} of ${total} GPUs allocated at the last sample (${clock(rows[rows.length - 1].time, true)}; one every ${history.interval ?? '?'} s)` : 'No sample yet.' }), parts),
    measured.length ? el('details', {}, el('summary', { text: 'measured GPU utilization' }), measured) : null,
  );
}

// the queues the estimate form offers, once: mine; an admin may submit to any leaf queue
// (api/quotas lists them), their own default first chosen
async function fillQueueChoices(me) {
  const select = document.querySelector('#estimate-form select[name=queue]');
  if (select.options.length) return;
  let queues = me.queues;
  if (ADMIN) {
    const mine = new Set(me.queues.filter((q) => q.default).map((q) => q.path));
    const quotas = await api('api/quotas');
    queues = quotas.queues.filter((q) => q.leaf).map((q) => ({ path: q.path, default: mine.has(q.path) }));
  }
  if (select.options.length) return; // (filled while api/quotas answered)
  for (const q of queues) select.append(el('option', { value: q.path, text: q.path, selected: q.default }));
}

async function estimate(event) {
  event.preventDefault();
  const form = event.target;
  const answer = document.getElementById('estimate-answer');
  for (const old of form.querySelectorAll('.field-error')) old.remove();
  // what a user would submit; the command does not change when it would start
  const job = { command: 'true', gpus: Number(form.elements.gpus.value) };
  // its name: the scheduler estimates a run time from earlier runs of that name (when the
  // policy learns them), as it would for the job submitted
  if (form.elements.name.value.trim()) job.name = form.elements.name.value.trim();
  if (form.elements.queue.value) job.queue = form.elements.queue.value;
  if (form.elements.tier.value) job.tier = Number(form.elements.tier.value);
  if (form.elements.walltime.value.trim()) job.walltime = form.elements.walltime.value.trim();
  answer.className = 'answer';
  answer.textContent = 'asking…';
  try {
    const result = await api('api/estimate', { method: 'POST', json: job });
    const words = estimateText(result.start_now, result.eta, result.reason && result.reason.message, Date.now() / 1000);
    const where = `queue ${result.queue}${result.position ? `, ${ordinal(result.position)} in line` : ''}`;
    answer.dataset.startNow = result.start_now;
    const planned = result.planned_run_time;
    const parts = [el('span', { class: 'words', text: words }), el('span', { class: 'muted', text: ` (${where})` })];
    if (planned && !result.start_now) parts.push(el('span', { class: 'planned', 'data-from': planned.from, text: `; ${planned.message}` }));
    answer.replaceChildren(...parts); // (a DOM method: a null would show as "null")
  } catch (error) {
    // a 400 names the field it refuses: the message goes next to that field
    const field = error.field && form.elements[error.field];
    answer.className = 'answer error';
    answer.textContent = field ? 'Not estimated: see above.' : `Not estimated: ${error.message}`;
    if (field) field.closest('label').after(el('span', { class: 'field-error', 'data-field': error.field, text: error.message }));
  }
}

// -- the refresh loop ----------------------------------------------------------------------------
function showStatus(text) {
  const status = document.getElementById('status');
  status.hidden = !text;
  status.textContent = text || '';
}

let timer = null;
// the history changes once a history_interval (60 s by default): read again only then
let historyCache = null;
let historyRead = 0;

async function readHistory(now) {
  const interval = historyCache && historyCache.interval ? historyCache.interval : 0;
  if (!historyCache || now - historyRead >= Math.max(interval, REFRESH_MS / 1000)) {
    historyCache = await api(`api/history?since=${now - DAY}`);
    historyRead = now;
  }
  return historyCache;
}

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
      readHistory(now),
      api('api/reaper').catch(() => ({ sessions: [], settings: {} })),
    ]);
    drawMyJobs(jobs.jobs, reaper.sessions.filter((s) => s.user === ME), queue.arrays);
    drawMyQueues(me);
    await fillQueueChoices(me);
    drawCluster(cluster);
    drawQueue(queue);
    drawUtilization(history);
    if (ADMIN) {
      const [byQueue, byUser, byModel, events, quotas] = await Promise.all([
        api('api/usage?by=queue'),
        api('api/usage?by=user'),
        api('api/usage?by=gpu_model'),
        api('api/events?limit=300'),
        api('api/quotas'),
      ]);
      drawWaiting(history);
      drawQueuesAdmin(quotas);
      drawQueueHistory(history);
      drawShowback(byQueue, byUser, byModel);
      drawReaperEvents(events.events);
      drawNodesAdmin(cluster);
      drawReaperForm(reaper);
    }
    showStatus('');
    document.getElementById('updated').textContent = `updated ${clock(Date.now() / 1000, true)}`;
  } catch (error) {
    showStatus(`Could not reach the scheduler: ${error.message}`);
  }
  timer = setTimeout(refresh, REFRESH_MS);
}

document.getElementById('estimate-form').addEventListener('submit', estimate);
const reaperForm = document.getElementById('reaper-form');
if (reaperForm) reaperForm.addEventListener('submit', saveReaper);
refresh();

// The scheduler's web page (service/page.py): the sections for scheduler admins only (the page
// loads this file only for them): waiting GPUs by reason, per-queue use, showback, the reaper's
// events, node drains and the reaper settings. page.js calls these at each refresh.
'use strict';

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

// every queue of the tree (api/quotas), parents before their children: what it holds against
// its guarantee and limit, what it borrows above its guarantee, what its waiting jobs ask for
function drawQueuesAdmin(quotas) {
  const figure = (v) => (v === null ? 'none' : `${Math.round(v * 100) / 100}`);
  const rows = quotas.queues.map((q) => {
    const depth = q.path === 'root' ? 0 : q.path.split('/').length;
    const inUse = q.in_use;
    const borrowed = q.borrowed;
    const who = [...q.users, ...q.groups.map((g) => `group ${g}`)];
    return el(
      'tr',
      { 'data-queue': q.path, 'data-in-use': inUse, 'data-pending': q.pending, class: q.leaf ? 'leaf' : 'parent' },
      el('td', { class: 'queue-name', 'data-depth': Math.min(depth, 4), text: q.path === 'root' ? 'root (the cluster)' : q.path.split('/').pop() }),
      el('td', { class: 'bar-cell' }, quotaBar(inUse, q.guaranteed, q.limit)),
      el('td', { class: 'num', text: figure(inUse) }),
      el('td', { class: 'num', text: figure(q.guaranteed) }),
      el('td', { class: 'num', text: figure(q.limit) }),
      el('td', { class: 'num', text: borrowed > 0 ? figure(borrowed) : '' }),
      el('td', { class: 'num', text: q.pending > 0 ? figure(q.pending) : '' }),
      el('td', { class: 'num', text: figure(q.weight) }),
      el('td', { text: who.length ? who.join(', ') : '' }),
    );
  });
  fill(
    'queues-admin',
    el(
      'table',
      {},
      el(
        'thead',
        {},
        el(
          'tr',
          {},
          el('th', { text: 'queue' }),
          el('th', { text: 'in use (tick: guarantee)' }),
          ['in use', 'guaranteed', 'limit', 'borrowing', 'waiting', 'weight'].map((h) => el('th', { class: 'num', text: h })),
          el('th', { text: 'who may submit' }),
        ),
      ),
      el('tbody', {}, rows),
    ),
    el('p', { class: 'form-note', text: 'GPUs. In use counts GPUs held for jobs whose pre-emption victims are leaving; borrowing is what a queue uses above its guarantee (reclaimed when others need their guarantee); waiting is what its pending jobs ask for.' }),
  );
  drawQuotaForm(quotas);
}

// A queue's guarantee, limit and weight, changed in the queue document in force (api/quotas'
// document, read again just before saving) and put back whole (PUT api/quotas): the service
// checks it as it checks the queue file, and refuses it with the field named.
const QUOTA_FIELDS = ['guaranteed', 'limit', 'weight'];
let quotaFormFilled = false;

// the queue's own mapping in the queue document (an empty entry, `name:` in YAML, becomes {})
function queueEntry(queueDocument, path) {
  let level = queueDocument.queues;
  let entry = null;
  for (const name of path.split('/')) {
    if (!level || typeof level !== 'object' || !(name in level)) return null;
    if (level[name] === null) level[name] = {};
    entry = level[name];
    if (typeof entry !== 'object') return null;
    level = entry.children;
  }
  return entry;
}

function drawQuotaForm(quotas) {
  if (quotaFormFilled || !quotas.document) return; // keep what the admin is typing
  quotaFormFilled = true;
  const form = document.getElementById('quota-form');
  const paths = quotas.queues.map((q) => q.path).filter((path) => path !== 'root');
  const select = el('select', { name: 'queue' }, paths.map((path) => el('option', { value: path, text: path })));
  const inputs = QUOTA_FIELDS.map((name) => el('input', { name, type: 'text', size: 6 }));
  const show = () => {
    const entry = queueEntry(quotas.document, select.value) || {};
    inputs.forEach((input) => {
      const value = entry[input.name];
      input.value = value === undefined || value === null ? '' : value;
    });
  };
  select.addEventListener('change', show);
  form.onsubmit = saveQuota;
  form.replaceChildren(
    el('label', {}, 'queue', select),
    ...inputs.map((input) => el('label', {}, input.name, input)),
    el('button', { type: 'submit', text: 'Save' }),
    el('p', { class: 'form-note', text: 'Empty: the default (no limit; weight 1; guaranteed 0, or for a parent its queues\' sum). The service keeps the change across restarts; the queue file is not rewritten.' }),
  );
  show();
}

async function saveQuota(event) {
  event.preventDefault();
  const form = event.target;
  const answer = document.getElementById('quota-answer');
  const path = form.elements.queue.value;
  const values = {};
  QUOTA_FIELDS.forEach((name) => { values[name] = form.elements[name].value.trim(); });
  const said = QUOTA_FIELDS.map((name) => `${name} ${values[name] || 'default'}`).join(', ');
  if (!window.confirm(`Change queue ${path}: ${said}? Jobs running there go on; waiting ones are scheduled under the new figures.`)) return;
  try {
    const current = await api('api/quotas');
    const entry = queueEntry(current.document, path);
    if (!entry) throw new Error(`queue ${path} is no longer in the queue document`);
    for (const name of QUOTA_FIELDS) {
      if (values[name] === '') delete entry[name];
      else entry[name] = Number.isFinite(Number(values[name])) ? Number(values[name]) : values[name];
    }
    const saved = await api('api/quotas', { method: 'PUT', json: current.document });
    quotaFormFilled = false;
    drawQueuesAdmin(saved); // the figures now in force
    form.elements.queue.value = path;
    form.elements.queue.dispatchEvent(new Event('change'));
    answer.className = 'answer';
    answer.textContent = 'Saved.';
  } catch (error) {
    answer.className = 'answer error';
    // (the service says where in the document: its name adds nothing here)
    answer.textContent = `Not saved: ${error.message.replace(/^the queue document, /, '')}`;
  }
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
            // in UTC, to the second: as the messages beside it say their times
            el('td', { text: new Date(e.time * 1000).toISOString().slice(0, 19).replace('T', ' ') + ' UTC' }),
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
  // a drain keeps new jobs off the node until an admin resumes it: the page asks first
  const question = `Drain ${name}? Its running jobs go on; no new job starts there until you resume it.`;
  if (action === 'drain' && !window.confirm(question)) return;
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
      input.dataset.drawn = shownValue(input);
      return el('label', {}, label, input);
    }),
    ...profileTimeoutFields(settings),
    el('button', { type: 'submit', text: 'Save' }),
  );
}

function profileTimeoutFields(settings) {
  // a server's own profile's timeout wins over its tier's (core/reaper.py timeout_for): the
  // admin's override, else the hub's profile idle_timeout. Empty: the hub's; off: never culled
  const ours = settings.profile_timeouts || {};
  const hubs = settings.profile_idle_timeouts || {};
  const slugs = [...new Set([...Object.keys(hubs), ...Object.keys(ours)])].sort();
  if (!slugs.length) return [];
  const note = el('p', {
    class: 'form-note',
    text: "A profile's own timeout wins over its tier's: the tier timeouts apply to servers whose "
      + "profile has none. Empty: the hub's profile setting; off: never culled for idleness.",
  });
  return [note, ...slugs.map((slug) => {
    const own = ours[slug];
    const placeholder = slug in hubs ? `hub: ${hubs[slug]} s` : 'its tier\'s';
    const input = el('input', { name: `profile:${slug}`, type: 'text', size: 8, placeholder });
    input.value = own === undefined ? '' : own === null ? 'off' : own;
    input.dataset.drawn = shownValue(input);
    return el('label', {}, `timeout, profile ${slug}`, input);
  })];
}

function shownValue(input) {
  return input.type === 'checkbox' ? String(input.checked) : input.value;
}

function edited(input) {
  // changed since the form showed the settings in force: only those are sent, so that a save
  // does not pin the others (they keep following the policy file)
  return shownValue(input) !== input.dataset.drawn;
}

async function saveReaper(event) {
  event.preventDefault();
  const form = event.target;
  const answer = document.getElementById('reaper-answer');
  const changes = {};
  for (const [name, type] of REAPER_FIELDS) {
    const input = form.elements[name];
    if (!edited(input)) continue;
    if (type === 'checkbox') changes[name] = input.checked;
    else if (input.value.trim() === '') changes[name] = name.startsWith('timeout') || name === 'max_lifetime' ? null : undefined;
    else changes[name] = Number.isFinite(Number(input.value)) ? Number(input.value) : input.value.trim();
  }
  Object.keys(changes).forEach((k) => changes[k] === undefined && delete changes[k]);
  const profiles = {};
  for (const input of form.querySelectorAll('input[name^="profile:"]')) {
    const text = input.value.trim();
    if (text !== '') profiles[input.name.slice('profile:'.length)] = Number.isFinite(Number(text)) ? Number(text) : text;
  }
  if ([...form.querySelectorAll('input[name^="profile:"]')].some(edited)) changes.profile_timeouts = profiles;
  if (!Object.keys(changes).length) {
    answer.className = 'answer';
    answer.textContent = 'Nothing changed.';
    return;
  }
  try {
    const saved = await api('api/reaper', { method: 'PUT', json: changes });
    reaperFormFilled = false;
    drawReaperForm(saved); // the settings now in force
    answer.className = 'answer';
    answer.textContent = 'Saved.';
  } catch (error) {
    answer.className = 'answer error';
    answer.textContent = `Not saved: ${formError(form, error)}`;
  }
}

// -- "when would I start?" (POST api/estimate: the fields of POST api/jobs) ---------------------

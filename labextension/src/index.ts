/**
 * jupyter-gpusched: the GPU scheduler in JupyterLab.
 *
 * - a status-bar item: "2x H100 · 63% · idle reclaim in 12 min", or "queued #3 · policy · ETA 14:20";
 * - a side panel: the cluster's occupancy by node and tier, the queue (others anonymised), my jobs
 *   with their GPU utilization, cancel and log view, and, for admins of the scheduler only, the
 *   reaper's timeouts per tier, editable (`api/me` says whether the user is one);
 * - the scheduler's notices to this server (reaper warnings, pre-emption) as notifications.
 *
 * It talks only to this server's extension (`<base>/gpusched/api/...`, jupyter_gpusched.serverext),
 * which forwards to the scheduler service as the server's user. Every poll backs off on errors and
 * stops while the page is hidden.
 */
import {
  ILabShell,
  JupyterFrontEnd,
  JupyterFrontEndPlugin
} from '@jupyterlab/application';
import { Notification } from '@jupyterlab/apputils';
import { URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';
import { IStatusBar } from '@jupyterlab/statusbar';
import { LabIcon } from '@jupyterlab/ui-components';
import { Widget } from '@lumino/widgets';

const PLUGIN_ID = 'jupyter-gpusched:plugin';
const PANEL_ID = 'jp-gpusched-panel';
const OPEN_COMMAND = 'gpusched:open-panel';

const gpuIcon = new LabIcon({
  name: 'jupyter-gpusched:gpu',
  svgstr:
    '<svg xmlns="http://www.w3.org/2000/svg" width="16" viewBox="0 0 24 24">' +
    '<g class="jp-icon3" fill="#616161"><path d="M4 6h16v12H4z" fill="none" stroke="#616161" stroke-width="2"/>' +
    '<rect x="7" y="9" width="4" height="6"/><rect x="13" y="9" width="4" height="6"/>' +
    '<rect x="2" y="10" width="2" height="4"/><rect x="20" y="10" width="2" height="4"/></g></svg>'
});

// -- the server extension's API ---------------------------------------------------------------
class APIError extends Error {
  constructor(
    message: string,
    readonly status: number
  ) {
    super(message);
  }
}

async function request(
  path: string,
  init: RequestInit = {},
  text = false
): Promise<any> {
  const settings = ServerConnection.makeSettings();
  const url = URLExt.join(settings.baseUrl, 'gpusched', 'api', path);
  let response: Response;
  try {
    response = await ServerConnection.makeRequest(url, init, settings);
  } catch (error) {
    throw new APIError(String(error), 0);
  }
  const body = await response.text();
  if (!response.ok) {
    let message = body;
    try {
      const data = JSON.parse(body);
      message = data.error || data.message || body;
    } catch {
      /* not JSON */
    }
    throw new APIError(message || response.statusText, response.status);
  }
  return text ? body : body ? JSON.parse(body) : null;
}

// -- polling with back-off, paused while the page is hidden -----------------------------------
class Poller {
  private timer: number | null = null;
  private delay: number;
  private running = false;
  private stopped = true;
  private readonly onVisibility = () => this.schedule(0);

  constructor(
    private readonly fn: () => Promise<void>,
    private readonly interval: number,
    private readonly maxInterval: number,
    private readonly active: () => boolean = () => true
  ) {
    this.delay = interval;
  }

  start(): void {
    if (!this.stopped) {
      return;
    }
    this.stopped = false;
    document.addEventListener('visibilitychange', this.onVisibility);
    this.schedule(0);
  }

  stop(): void {
    this.stopped = true;
    document.removeEventListener('visibilitychange', this.onVisibility);
    this.clear();
  }

  /** Run now (e.g. after a change the user made), then go on at the normal pace. */
  refresh(): void {
    this.delay = this.interval;
    this.schedule(0);
  }

  private clear(): void {
    if (this.timer !== null) {
      window.clearTimeout(this.timer);
      this.timer = null;
    }
  }

  private schedule(ms: number): void {
    this.clear();
    if (this.stopped || document.visibilityState === 'hidden') {
      return; // visibilitychange starts it again
    }
    this.timer = window.setTimeout(() => void this.tick(), ms);
  }

  private async tick(): Promise<void> {
    this.timer = null;
    if (this.running || this.stopped || document.visibilityState === 'hidden') {
      return;
    }
    if (!this.active()) {
      this.schedule(this.interval);
      return;
    }
    this.running = true;
    try {
      await this.fn();
      this.delay = this.interval;
    } catch (error) {
      this.delay = Math.min(this.delay * 2, this.maxInterval);
      console.debug('gpusched: poll failed, next in', this.delay, error);
    } finally {
      this.running = false;
    }
    this.schedule(this.delay);
  }
}

// -- formatting ---------------------------------------------------------------------------------
interface IReason {
  family: string;
  detail?: string;
  message?: string;
  eta?: number | null;
}

interface IStatus {
  configured: boolean;
  time: number;
  job_id: string | null;
  job: any | null;
  gpus: number | null;
  gpu_model: string | null;
  node: string | null;
  utilization: number | null;
  reaper: {
    reclaim_at: number | null;
    timeout: number | null;
    exempt: boolean | null;
  } | null;
  pending: {
    id: string;
    name: string | null;
    gpus: number;
    tier: number;
    position: number | null;
    reason: IReason | null;
  }[];
}

function num(value: number): string {
  return Number.isInteger(value) ? String(value) : value.toFixed(2).replace(/0+$/, '');
}

function clock(epoch: number): string {
  return new Date(epoch * 1000).toLocaleTimeString([], {
    hour: '2-digit',
    minute: '2-digit',
    hour12: false
  });
}

function queued(position: number | null, reason: IReason | null): string {
  const parts = [position === null ? 'held' : `queued #${position + 1}`];
  if (reason?.family) {
    parts.push(reason.family);
  }
  if (reason?.eta) {
    parts.push(`ETA ${clock(reason.eta)}`);
  }
  return parts.join(' · ');
}

/** A running job's `utilization` (the service's job view): "63%", or an em dash when unknown. */
export function utilizationText(job: any): string {
  const percent = job?.utilization?.percent;
  return percent === null || percent === undefined ? '\u2014' : `${Math.round(percent)}%`;
}

/**
 * A timeout as the reaper editor shows it: minutes ("45"), or "off".
 * `parseTimeout` is its inverse: minutes (a number) -> seconds; "off" or nothing -> null;
 * anything else ("1h", "90s") is passed on for the service to read (a 400 names the field).
 */
export function timeoutText(seconds: number | null | undefined): string {
  return seconds === null || seconds === undefined ? 'off' : num(seconds / 60);
}

export function parseTimeout(text: string): number | string | null {
  const value = text.trim().toLowerCase();
  if (value === '' || value === 'off' || value === 'none' || value === 'null') {
    return null;
  }
  if (/^\d+(\.\d+)?$/.test(value)) {
    return Number(value) * 60;
  }
  return value;
}

export function statusText(status: IStatus, now = Date.now() / 1000): string {
  const parts: string[] = [];
  const job = status.job;
  if (job && job.state === 'running') {
    const gpus = status.gpus ?? job.gpus;
    let text = `${num(gpus)}x ${status.gpu_model ?? 'GPU'}`;
    if (status.utilization !== null && status.utilization !== undefined) {
      text += ` · ${Math.round(status.utilization)}%`;
    }
    const reclaim = status.reaper?.reclaim_at;
    if (reclaim) {
      const skew = now - status.time; // the server's clock against ours
      const minutes = Math.max(0, Math.ceil((reclaim - (now - skew)) / 60));
      text += ` · idle reclaim in ${minutes} min`;
    }
    parts.push(text);
  } else if (job && job.state === 'pending') {
    parts.push(queued(job.position, job.reason));
  }
  const others = status.pending.filter(p => p.id !== status.job_id);
  if (others.length) {
    parts.push(queued(others[0].position, others[0].reason));
  }
  if (!parts.length) {
    return status.configured ? 'No GPUs' : 'GPU scheduler: not connected';
  }
  return parts.join('  |  ');
}

function el<K extends keyof HTMLElementTagNameMap>(
  tag: K,
  attrs: Record<string, string> = {},
  ...children: (Node | string | null)[]
): HTMLElementTagNameMap[K] {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (key === 'class') {
      node.className = value;
    } else {
      node.setAttribute(key, value);
    }
  }
  for (const child of children) {
    if (child !== null) {
      node.append(child);
    }
  }
  return node;
}

function table(headers: string[], rows: (Node | string)[][], rowAttrs: Record<string, string>[] = []) {
  return el(
    'table',
    { class: 'jp-gpusched-table' },
    el('thead', {}, el('tr', {}, ...headers.map(h => el('th', {}, h)))),
    el(
      'tbody',
      {},
      ...rows.map((cells, i) => el('tr', rowAttrs[i] ?? {}, ...cells.map(c => el('td', {}, c))))
    )
  );
}

// -- the status-bar item ------------------------------------------------------------------------
class StatusItem extends Widget {
  constructor(onClick: () => void) {
    super();
    this.addClass('jp-gpusched-status');
    this.node.title = 'GPU scheduler: click for the queue, the cluster and your jobs';
    this.node.textContent = 'GPUs …';
    this.node.addEventListener('click', onClick);
  }

  show_status(status: IStatus): void {
    this.node.textContent = statusText(status);
  }

  show_error(error: Error): void {
    this.node.textContent = 'GPUs: ?';
    this.node.title = `GPU scheduler: ${error.message}`;
  }
}

// -- the reaper's timeouts, for admins ------------------------------------------------------------
const REAPER_FIELDS: [string, string][] = [
  ['timeout_tier_1', 'tier 1 timeout'],
  ['timeout_tier_2', 'tier 2 timeout'],
  ['timeout_tier_3', 'tier 3 timeout'],
  ['warning_lead', 'warning before']
];

/**
 * The admin's editor of the reaper's timeouts (minutes, or "off"). It keeps its own DOM across
 * the panel's refreshes, so a value being typed is not overwritten by the next poll; a field the
 * admin changed keeps its text until saved (or Reset).
 */
class ReaperEditor {
  readonly node = el('section', { class: 'jp-gpusched-reaper', hidden: '' });
  private readonly inputs = new Map<string, HTMLInputElement>();
  private readonly dirty = new Set<string>();
  private readonly message = el('div', { class: 'jp-gpusched-reaper-message' });
  private readonly save = el('button', { class: 'jp-gpusched-reaper-save jp-mod-styled jp-mod-accept' }, 'Save');
  private readonly reset = el('button', { class: 'jp-gpusched-reaper-reset jp-mod-styled' }, 'Reset');
  private settings: any = null;

  constructor(private readonly onSaved: () => void) {
    const rows = REAPER_FIELDS.map(([field, label]) => {
      const input = el('input', {
        class: 'jp-gpusched-reaper-input jp-mod-styled',
        'data-setting': field,
        size: '6',
        title: 'minutes, or off (also 1h, 90s)'
      });
      input.addEventListener('input', () => this.dirty.add(field));
      input.addEventListener('keydown', event => {
        if (event.key === 'Enter') {
          void this.submit();
        }
      });
      this.inputs.set(field, input);
      return [label, el('span', {}, input, ' min')] as (Node | string)[];
    });
    this.save.addEventListener('click', () => void this.submit());
    this.reset.addEventListener('click', () => {
      this.dirty.clear();
      this.message.textContent = '';
      this.show(this.settings);
    });
    this.node.append(
      el('h3', {}, 'Idle reaper (admin)'),
      table(['Setting', 'Value'], rows, REAPER_FIELDS.map(([field]) => ({ 'data-reaper-row': field }))),
      el('div', { class: 'jp-gpusched-actions' }, this.save, this.reset),
      this.message
    );
  }

  /** The settings in force; fields the admin is editing keep their text. */
  show(settings: any): void {
    this.settings = settings;
    if (!settings) {
      return;
    }
    for (const [field, input] of this.inputs) {
      if (!this.dirty.has(field) && document.activeElement !== input) {
        input.value = timeoutText(settings[field]);
      }
    }
  }

  async submit(): Promise<void> {
    const changes: Record<string, number | string | null> = {};
    for (const field of this.dirty) {
      changes[field] = parseTimeout(this.inputs.get(field)!.value);
    }
    if (!Object.keys(changes).length) {
      this.message.className = 'jp-gpusched-reaper-message';
      this.message.textContent = 'Nothing changed.';
      return;
    }
    this.save.disabled = true;
    try {
      const answer = await request('reaper', { method: 'PUT', body: JSON.stringify(changes) });
      this.dirty.clear();
      this.show(answer?.settings ?? this.settings);
      this.message.className = 'jp-gpusched-reaper-message jp-gpusched-reaper-ok';
      this.message.textContent = `Saved: ${Object.keys(changes).join(', ')}`;
      this.onSaved();
    } catch (error) {
      this.message.className = 'jp-gpusched-reaper-message jp-gpusched-error';
      this.message.textContent = `Not saved: ${(error as Error).message}`;
    } finally {
      this.save.disabled = false;
    }
  }
}

// -- the side panel -------------------------------------------------------------------------------
class GPUPanel extends Widget {
  readonly poller: Poller;
  private readonly body = el('div', { class: 'jp-gpusched-body' });
  private readonly logView = el('pre', { class: 'jp-gpusched-log', hidden: '' });
  private readonly errorLine = el('div', { class: 'jp-gpusched-error' });
  private logJob: string | null = null;
  private readonly reaperEditor = new ReaperEditor(() => this.poller.refresh());

  constructor(private readonly onChange: () => void) {
    super();
    this.id = PANEL_ID;
    this.addClass('jp-gpusched-panel');
    this.title.icon = gpuIcon;
    this.title.caption = 'GPU scheduler';
    const refresh = el('button', { class: 'jp-gpusched-refresh jp-mod-styled' }, 'Refresh');
    refresh.addEventListener('click', () => this.poller.refresh());
    this.node.append(
      el('header', {}, el('h2', {}, 'GPU scheduler'), refresh),
      this.errorLine,
      this.body,
      this.reaperEditor.node,
      this.logView
    );
    this.poller = new Poller(() => this.update_all(), 5000, 60000, () => this.isVisible);
  }

  protected onAfterShow(): void {
    this.poller.refresh();
  }

  async update_all(): Promise<void> {
    try {
      // `me` says whether the user administers the scheduler: only admins see the reaper's
      // settings (and may change them); the service itself refuses others' changes.
      const [status, jobs, queue, cluster, me, reaper] = await Promise.all([
        request('status'),
        request('jobs?state=pending&state=running'),
        request('queue'),
        request('cluster'),
        request('me').catch(() => null),
        request('reaper').catch(() => null)
      ]);
      this.errorLine.textContent = '';
      this.render(status, jobs.jobs, queue, cluster, me?.admin ? reaper : null);
      if (this.logJob) {
        await this.show_log(this.logJob);
      }
    } catch (error) {
      this.errorLine.textContent = `Cannot reach the GPU scheduler: ${(error as Error).message}`;
      throw error;
    }
  }

  private render(status: IStatus, jobs: any[], queue: any, cluster: any, reaper: any): void {
    const sections: HTMLElement[] = [];
    sections.push(
      el('section', { class: 'jp-gpusched-mine' }, el('h3', {}, 'This server'), el('p', {}, statusText(status)))
    );

    // my jobs
    const rows = jobs.map(job => {
      const cancel = el('button', { class: 'jp-gpusched-cancel jp-mod-styled jp-mod-warn' }, 'Cancel');
      cancel.addEventListener('click', () => void this.cancel(job.id, cancel));
      const log = el('button', { class: 'jp-gpusched-showlog jp-mod-styled' }, 'Log');
      log.addEventListener('click', () => void this.show_log(job.id));
      const where =
        job.state === 'running'
          ? (job.allocation || []).map((p: any) => `${p.node}:${p.gpus.join(',')}`).join(' ')
          : queued(job.position, job.reason);
      // this server's own job is stopped through the hub, not cancelled from inside it
      const actions = el(
        'div',
        { class: 'jp-gpusched-actions' },
        job.id === status.job_id ? null : cancel,
        job.kind === 'notebook' ? null : log
      );
      const name = el('div', {}, el('div', {}, job.name || job.id), actions);
      // the state, and under it the GPU utilization its server last reported ("—": unknown)
      const state = el(
        'div',
        {},
        el('div', {}, job.state),
        el(
          'div',
          { class: 'jp-gpusched-util', title: 'GPU utilization (mean over its GPUs), as its notebook server last reported it' },
          `GPU ${job.state === 'running' ? utilizationText(job) : '\u2014'}`
        )
      );
      return [name, state, `${num(job.gpus)} · t${job.tier}`, where];
    });
    sections.push(
      el(
        'section',
        { class: 'jp-gpusched-jobs' },
        el('h3', {}, 'My jobs'),
        jobs.length
          ? table(['Job', 'State', 'GPUs · tier', 'Where / why'], rows, jobs.map(j => ({ 'data-job-id': j.id })))
          : el('p', { class: 'jp-gpusched-empty' }, 'No pending or running jobs.')
      )
    );

    // the queue
    const qrows = (queue.jobs as any[]).map(j => [
      String(j.position + 1),
      j.mine ? `${j.name || j.id} (mine)` : j.user || 'someone',
      `${num(j.gpus)} · t${j.tier}`,
      j.queue || '',
      j.reason ? `${j.reason.family}${j.reason.eta ? ` · ETA ${clock(j.reason.eta)}` : ''}` : ''
    ]);
    sections.push(
      el(
        'section',
        { class: 'jp-gpusched-queue' },
        el('h3', {}, `Queue (${queue.pending} pending, ${queue.running} running)`),
        qrows.length
          ? table(['#', 'Who', 'GPUs · tier', 'Queue', 'Reason'], qrows, (queue.jobs as any[]).map(j => ({ 'data-queue-job': j.mine ? j.id : '' })))
          : el('p', { class: 'jp-gpusched-empty' }, 'The queue is empty.')
      )
    );

    // the cluster, by node and tier
    const nodes = (cluster.nodes as any[]).map(node => {
      const tiers: Record<string, number> = {};
      const cells = (node.gpu_list as any[]).map(gpu => {
        const holders = gpu.jobs as any[];
        for (const h of holders) {
          tiers[`t${h.tier}`] = (tiers[`t${h.tier}`] || 0) + (h.fraction ?? 1);
        }
        const tier = holders.length ? `t${holders[0].tier}` : 'free';
        const who = holders.map(h => h.user || 'someone').join(', ');
        return el('span', {
          class: `jp-gpusched-gpu jp-gpusched-${tier}`,
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
        el('span', { class: 'jp-gpusched-node-name' }, `${node.name} (${node.gpu_model}) ${node.state !== 'up' ? `[${node.state}]` : ''}`),
        el('span', { class: 'jp-gpusched-gpus' }, ...cells),
        el('span', { class: 'jp-gpusched-node-use' }, `${num(node.free)}/${node.gpus} free${byTier ? ` · ${byTier}` : ''}`)
      );
    });
    sections.push(
      el(
        'section',
        { class: 'jp-gpusched-cluster' },
        el('h3', {}, `Cluster: ${num(cluster.allocated_gpus)}/${cluster.total_gpus} GPUs allocated`),
        ...nodes
      )
    );

    // the reaper's settings: admins only (the caller passes null to others). The editor stays
    // in the page between refreshes (a field being typed in keeps its focus); hidden otherwise.
    const admin = Boolean(reaper && reaper.settings);
    this.reaperEditor.node.hidden = !admin;
    if (admin) {
      this.reaperEditor.show(reaper.settings);
    }
    this.body.replaceChildren(...sections);
  }

  private async cancel(jobId: string, button: HTMLButtonElement): Promise<void> {
    button.disabled = true;
    try {
      await request(`jobs/${encodeURIComponent(jobId)}`, { method: 'DELETE' });
      Notification.info(`Job ${jobId} cancelled`, { autoClose: 3000 });
    } catch (error) {
      Notification.error(`Could not cancel job ${jobId}: ${(error as Error).message}`);
      button.disabled = false;
    }
    this.poller.refresh();
    this.onChange();
  }

  private async show_log(jobId: string): Promise<void> {
    this.logJob = jobId;
    this.logView.hidden = false;
    try {
      const text = await request(`jobs/${encodeURIComponent(jobId)}/log?bytes=16384`, {}, true);
      this.logView.textContent = `== log of ${jobId}\n${text}`;
    } catch (error) {
      this.logView.textContent = `== log of ${jobId}: ${(error as Error).message}`;
    }
  }
}

// -- notices: reaper warnings and pre-emption ---------------------------------------------------
// The server numbers its notices from 1 at each of its starts and names the start (`start`):
// what was shown is remembered as (start, last id), so that a restarted server's notices,
// numbered from 1 again, are shown, and a reloaded page does not show a notice twice.
interface Seen {
  start: string;
  id: number;
}

class Notices {
  readonly poller: Poller;
  private readonly key: string;
  private seen: Seen;

  constructor(private readonly openPanel: () => void) {
    this.key = `jupyter-gpusched:last-notice:${ServerConnection.makeSettings().baseUrl}`;
    this.seen = Notices.load(window.localStorage.getItem(this.key));
    this.poller = new Poller(() => this.check(), 10000, 120000);
  }

  private static load(stored: string | null): Seen {
    try {
      const value = JSON.parse(stored || 'null');
      if (value && typeof value.start === 'string' && typeof value.id === 'number') {
        return { start: value.start, id: value.id };
      }
    } catch {
      /* an older version kept a bare number: start afresh */
    }
    return { start: '', id: 0 };
  }

  async check(): Promise<void> {
    const data = await request('notices');
    for (const notice of data.notices as any[]) {
      const start = String(notice.start ?? data.start ?? '');
      if (start === this.seen.start && notice.id <= this.seen.id) {
        continue;
      }
      this.seen = { start, id: notice.id };
      window.localStorage.setItem(this.key, JSON.stringify(this.seen));
      this.show(notice);
    }
  }

  private show(notice: any): void {
    const deadline = notice.deadline ? ` (by ${clock(notice.deadline)})` : '';
    const title =
      notice.kind === 'preemption' ? 'Pre-emption' : notice.kind === 'idle' ? 'Idle GPUs' : `GPU scheduler (${notice.kind})`;
    const options = {
      autoClose: false as const,
      actions: [{ label: 'GPU panel', callback: () => this.openPanel() }]
    };
    const message = `${title}: ${notice.message}${deadline}`;
    if (notice.kind === 'preemption') {
      Notification.error(message, options);
    } else {
      Notification.warning(message, options);
    }
  }
}

// -- the plugin --------------------------------------------------------------------------------
const plugin: JupyterFrontEndPlugin<void> = {
  id: PLUGIN_ID,
  description: 'GPU scheduler: my GPUs, the queue, the reaper countdown and notices',
  autoStart: true,
  optional: [IStatusBar, ILabShell],
  activate: (app: JupyterFrontEnd, statusBar: IStatusBar | null, labShell: ILabShell | null) => {
    let statusPoller: Poller | null = null;
    const panel = new GPUPanel(() => statusPoller?.refresh());
    app.shell.add(panel, 'right', { rank: 900 });
    const openPanel = () => app.shell.activateById(PANEL_ID);
    app.commands.addCommand(OPEN_COMMAND, {
      label: 'Show the GPU scheduler panel',
      execute: openPanel
    });
    panel.poller.start();

    if (statusBar) {
      const item = new StatusItem(openPanel);
      statusBar.registerStatusItem(PLUGIN_ID, {
        item,
        align: 'left',
        rank: 50
      });
      statusPoller = new Poller(
        async () => {
          try {
            item.show_status(await request('status'));
          } catch (error) {
            item.show_error(error as Error);
            throw error;
          }
        },
        15000,
        120000
      );
      statusPoller.start();
    }

    new Notices(openPanel).poller.start();
    void labShell;
  }
};

export default plugin;

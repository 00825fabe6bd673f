/**
 * The side panel: this server's own job (with its recent GPU utilization), my jobs, my queues (in
 * use against guarantee and limit), the queue (others anonymised), the cluster by node and tier
 * (my GPUs marked), and for admins of the scheduler the reaper's timeouts, editable. Its header
 * links to the scheduler's web page, which shows the same and more at a page's width.
 *
 * It must be readable at the right sidebar's default width (about 300 px): jobs and queue entries
 * are stacked blocks (a head line, a details line, why it waits, the actions), never tables of
 * many columns, and every text wraps. After anything the panel changes (a cancel, the reaper's
 * settings, Refresh) it refreshes itself and the status bar at once (`onChange`), and each of its
 * refreshes hands the status it read to the status bar too (`onStatus`).
 */
import { Dialog, Notification, showDialog } from '@jupyterlab/apputils';
import { LabIcon } from '@jupyterlab/ui-components';
import { Widget } from '@lumino/widgets';

import { Poller, request } from './api';
import {
  IStatus,
  allocationText,
  arrayText,
  groupArrays,
  clock,
  deadlineNode,
  el,
  num,
  ordinal,
  queueBar,
  sparkline,
  queued,
  reasonNode,
  serverText,
  tierTag,
  utilizationText
} from './format';
import { INotice, noticeText } from './notices';
import { clusterSection } from './cluster_section';
import { ReaperEditor } from './reaper_editor';

export const PANEL_ID = 'jp-gpusched-panel';
const UTIL_POINTS = 60; // the sparkline's readings: 5 min at the panel's 5 s refresh
const HISTORY_EVERY = 60; // seconds between the panel's reads of api/history

const gpuIcon = new LabIcon({
  name: 'jupyter-gpusched:gpu',
  svgstr:
    '<svg xmlns="http://www.w3.org/2000/svg" width="16" viewBox="0 0 24 24">' +
    '<g class="jp-icon3" fill="#616161"><path d="M4 6h16v12H4z" fill="none" stroke="#616161" stroke-width="2"/>' +
    '<rect x="7" y="9" width="4" height="6"/><rect x="13" y="9" width="4" height="6"/>' +
    '<rect x="2" y="10" width="2" height="4"/><rect x="20" y="10" width="2" height="4"/></g></svg>'
});

// -- the panel ---------------------------------------------------------------------------------------
export class GPUPanel extends Widget {
  readonly poller: Poller;
  private readonly body = el('div', { class: 'jp-gpusched-body' });
  private readonly logView = el('pre', { class: 'jp-gpusched-log', hidden: '' });
  private readonly errorLine = el('div', { class: 'jp-gpusched-error' });
  private logJob: string | null = null;
  private readonly reaperEditor: ReaperEditor;
  private readonly pageLink = el(
    'a',
    { class: 'jp-gpusched-page-link', target: '_blank', rel: 'noopener', hidden: '' },
    'Open the scheduler page \u2197'
  );
  // the cluster's allocated GPUs over the last 24 h (api/history), read at most once a minute
  private history: { read: number; rows: any[] } = { read: -Infinity, rows: [] };
  // this server's utilization at each refresh (the sparkline): the last UTIL_POINTS readings
  private readonly utilization: { job: string | null; values: (number | null)[] } = {
    job: null,
    values: []
  };

  /**
   * `onChange`: the panel changed something (refresh everything that shows it);
   * `onStatus`: the status the panel just read (the status bar shows it too);
   * `lastNotice`: the newest warning this server got, shown whole under "This server".
   */
  constructor(
    private readonly onChange: () => void,
    private readonly onStatus: (status: IStatus) => void = () => undefined,
    private readonly lastNotice: () => INotice | null = () => null
  ) {
    super();
    this.id = PANEL_ID;
    this.addClass('jp-gpusched-panel');
    this.title.icon = gpuIcon;
    this.title.caption = 'GPU scheduler';
    this.reaperEditor = new ReaperEditor(() => this.changed());
    const refresh = el('button', { class: 'jp-gpusched-refresh jp-mod-styled' }, 'Refresh');
    refresh.addEventListener('click', () => this.changed());
    this.node.append(
      el('header', {}, el('h2', {}, 'GPU scheduler'), refresh),
      this.pageLink,
      this.errorLine,
      this.body,
      this.reaperEditor.node,
      this.logView
    );
    this.poller = new Poller(() => this.update_all(), 5000, 60000, () => this.isVisible);
  }

  /** After an action of the panel: this panel and the status bar read the service again now. */
  changed(): void {
    this.poller.refresh();
    this.onChange();
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
      this.onStatus(status);
      if (status.page_url) {
        this.pageLink.href = status.page_url;
        this.pageLink.hidden = false;
      }
      this.remember(status);
      await this.readHistory();
      this.render(status, jobs.jobs, queue, cluster, me, me?.admin ? reaper : null);
      if (this.logJob) {
        await this.show_log(this.logJob);
      }
    } catch (error) {
      this.errorLine.textContent = `Cannot reach the GPU scheduler: ${(error as Error).message}`;
      throw error;
    }
  }

  /** The cluster over the last 24 h, read again once a minute (rows: one per history_interval). */
  private async readHistory(): Promise<void> {
    const now = Date.now() / 1000;
    if (now - this.history.read < HISTORY_EVERY) {
      return;
    }
    this.history.read = now;
    const answer = await request(`history?since=${Math.floor(now - 24 * 3600)}`).catch(() => null);
    this.history.rows = answer?.rows ?? this.history.rows;
  }

  /** This server's utilization now, kept for its sparkline (a new job starts a new line). */
  private remember(status: IStatus): void {
    if (this.utilization.job !== status.job_id) {
      this.utilization.job = status.job_id;
      this.utilization.values = [];
    }
    const values = this.utilization.values;
    values.push(status.utilization ?? null);
    values.splice(0, Math.max(0, values.length - UTIL_POINTS));
  }

  /** This server's own job only (GPUSCHED_JOB_ID of this server: serverext/proxy.py). */
  private serverSection(status: IStatus): HTMLElement {
    const job = status.job;
    const section = el('section', { class: 'jp-gpusched-mine' }, el('h3', {}, 'This server'));
    if (status.job_id) {
      section.setAttribute('data-job-id', status.job_id);
    }
    const line = serverText(status);
    section.append(
      el('p', { class: 'jp-gpusched-server-line' }, line ?? 'This server has no GPUs of the scheduler.')
    );
    if (line && job) {
      const where = allocationText(job.allocation);
      const reaper = status.reaper;
      // a CPU-only server is judged by its activity, not by GPUs it does not have
      const idle = job.gpus === 0 ? 'without activity' : 'with idle GPUs';
      const timeout = reaper?.exempt
        ? 'exempt from the idle reaper'
        : reaper?.timeout
          ? `stopped after ${num(reaper.timeout / 60)} min ${idle}`
          : 'no idle timeout';
      section.append(
        el(
          'div',
          { class: 'jp-gpusched-details' },
          tierTag(job.tier),
          ` ${[job.id, job.queue ? `queue ${job.queue}` : '', where, timeout].filter(Boolean).join(' · ')}`
        )
      );
      if (job.state === 'pending') {
        section.append(reasonNode(job.reason) ?? '');
      }
      if (job.state === 'running' && job.gpus !== 0 && this.utilization.values.some(v => v !== null)) {
        section.append(sparkline(this.utilization.values, 'GPU utilization of this server, at each refresh of the panel'));
      }
    }
    const notice = this.lastNotice();
    if (notice) {
      const when = notice.received ? `${clock(notice.received)}: ` : '';
      section.append(el('div', { class: 'jp-gpusched-last-notice' }, `Last notice ${when}${noticeText(notice)}`));
    }
    return section;
  }

  private jobBlock(job: any, status: IStatus): HTMLElement {
    const thisServer = job.id === status.job_id;
    const cancel = el('button', { class: 'jp-gpusched-cancel jp-mod-styled jp-mod-warn' }, 'Cancel');
    const label = job.name ? `${job.id} (${job.name})` : job.id;
    const counts = job.state === 'running' ? { running: 1, pending: 0 } : { running: 0, pending: 1 };
    cancel.addEventListener('click', () => void this.cancel('job', job.id, cancel, cancelQuestion(label, counts)));
    const log = el('button', { class: 'jp-gpusched-showlog jp-mod-styled' }, 'Log');
    log.addEventListener('click', () => void this.show_log(job.id));
    // this server's own job is stopped through the hub, not cancelled from inside it
    const actions = el(
      'div',
      { class: 'jp-gpusched-actions' },
      thisServer ? null : cancel,
      job.kind === 'notebook' ? null : log
    );
    const where =
      job.state === 'running'
        ? allocationText(job.allocation)
        : queued(job.position, null);
    return el(
      'div',
      { class: 'jp-gpusched-job', 'data-job-id': job.id },
      el(
        'div',
        { class: 'jp-gpusched-job-head' },
        el('span', { class: 'jp-gpusched-job-name' }, `${job.name || job.id}${thisServer ? ' (this server)' : ''}`),
        ' ',
        el('span', { class: `jp-gpusched-state jp-gpusched-state-${job.state}` }, job.state)
      ),
      el(
        'div',
        { class: 'jp-gpusched-details' },
        tierTag(job.tier),
        job.gpus === 0 ? ` no GPU · ${where}` : ` ${num(job.gpus)} GPU${job.gpus === 1 ? '' : 's'} · ${where} · `,
        // the GPU utilization its server last reported ("—": unknown, or not running)
        job.gpus === 0
          ? null
          : el(
              'span',
              { class: 'jp-gpusched-util', title: 'GPU utilization (mean over its GPUs), as its notebook server last reported it' },
              `GPU ${job.state === 'running' ? utilizationText(job) : '\u2014'}`
            ),
        job.deadline ? ' · ' : null,
        deadlineNode(job)
      ),
      job.state === 'pending' ? reasonNode(job.reason) : null,
      // how long the scheduler plans it to run (an estimate from earlier runs, its walltime,
      // or the default): what decides whether it may start in front of a reservation
      job.state === 'pending' && job.planned_run_time
        ? el('div', { class: 'jp-gpusched-planned', 'data-from': job.planned_run_time.from }, job.planned_run_time.message)
        : null,
      actions.childElementCount ? actions : null
    );
  }

  /**
   * A job array as one block: its name as `queue` (api/queue's `arrays`) gives it, Slurm's
   * `a-000012_[2-5%2]`, its state counts, the first waiting element's reason, Cancel.
   */
  private arrayBlock(elements: any[], names: Record<string, string>): HTMLElement {
    const first = elements[0];
    // the next to start: first in line (api/jobs lists the newest first)
    const waiting = elements
      .filter(e => e.state === 'pending')
      .sort((a, b) => (a.position ?? Infinity) - (b.position ?? Infinity));
    const cancel = el('button', { class: 'jp-gpusched-cancel jp-mod-styled jp-mod-warn' }, 'Cancel array');
    const counts = {
      running: elements.filter(e => e.state === 'running').length,
      pending: elements.filter(e => e.state === 'pending').length
    };
    const question = cancelQuestion(names[first.array_id] ?? first.array_id, counts);
    cancel.addEventListener('click', () => void this.cancel('array', first.array_id, cancel, question));
    const cap = first.array_max_running ? ` · at most ${first.array_max_running} running` : '';
    return el(
      'div',
      { class: 'jp-gpusched-job jp-gpusched-array', 'data-array-id': first.array_id },
      el(
        'div',
        { class: 'jp-gpusched-job-head' },
        el('span', { class: 'jp-gpusched-job-name' }, names[first.array_id] ?? first.array_id),
        ` ${first.name ? `${first.name}: ` : ''}`,
        el('span', { class: 'jp-gpusched-state' }, arrayText(elements))
      ),
      el(
        'div',
        { class: 'jp-gpusched-details' },
        tierTag(first.tier),
        ` ${num(first.gpus)} GPU${first.gpus === 1 ? '' : 's'} each${cap}`,
        waiting.length ? ` · first waiting ${queued(waiting[0].position, null)}` : ''
      ),
      waiting.length ? reasonNode(waiting[0].reason) : null,
      el('div', { class: 'jp-gpusched-actions' }, cancel)
    );
  }

  private render(status: IStatus, jobs: any[], queue: any, cluster: any, me: any, reaper: any): void {
    const sections: HTMLElement[] = [this.serverSection(status)];

    sections.push(
      el(
        'section',
        { class: 'jp-gpusched-jobs' },
        el('h3', {}, 'My jobs'),
        ...(jobs.length
          ? groupArrays(jobs).map(item =>
              Array.isArray(item) ? this.arrayBlock(item, queue.arrays ?? {}) : this.jobBlock(item, status)
            )
          : [el('p', { class: 'jp-gpusched-empty' }, 'No pending or running jobs.')])
      )
    );

    // my queues: GPUs in use against the guarantee and the limit (api/me)
    const queues = (me?.queues ?? []) as any[];
    if (queues.length) {
      sections.push(
        el(
          'section',
          { class: 'jp-gpusched-myqueues' },
          el('h3', {}, 'My queues'),
          ...queues.map(q =>
            el(
              'div',
              { class: 'jp-gpusched-myqueue', 'data-queue': q.path },
              el(
                'div',
                { class: 'jp-gpusched-myqueue-text' },
                `${q.path}${q.default ? ' (default)' : ''}: ${num(q.in_use)} in use · ${num(q.guaranteed)} guaranteed · ` +
                  (q.limit === null ? 'no limit' : `limit ${num(q.limit)}`)
              ),
              queueBar(q.in_use, q.guaranteed, q.limit),
              el(
                'div',
                { class: 'jp-gpusched-fair-share' },
                q.fair_share
                  ? `${ordinal(q.fair_share.rank)} of ${q.fair_share.of} in the fair-share order`
                  : 'fair-share order not computed yet'
              )
            )
          )
        )
      );
    }

    // the queue: one block per waiting job (an array's elements: one), others anonymised
    const entries = groupArrays(queue.jobs as any[]).map(item => {
      const elements = Array.isArray(item) ? item : [item];
      const j = elements[0];
      const many = Array.isArray(item) ? ` · ${queue.arrays?.[j.array_id] ?? j.array_id}, ${elements.length} waiting` : '';
      return el(
        'div',
        {
          class: 'jp-gpusched-qjob',
          'data-queue-job': j.mine ? j.id : '',
          'data-queue-array': Array.isArray(item) && j.mine ? j.array_id : ''
        },
        el(
          'div',
          { class: 'jp-gpusched-job-head' },
          `#${j.position + 1} ${j.mine ? `${j.name || j.id} (mine)` : j.user || 'someone'} `,
          tierTag(j.tier),
          ` ${num(j.gpus)} GPU${j.gpus === 1 ? '' : 's'}${Array.isArray(item) ? ' each' : ''}${j.queue ? ` · queue ${j.queue}` : ''}${many}`
        ),
        reasonNode(j.reason)
      );
    });
    sections.push(
      el(
        'section',
        { class: 'jp-gpusched-queue' },
        el('h3', {}, `Queue (${queue.pending} pending, ${queue.running} running)`),
        ...(entries.length ? entries : [el('p', { class: 'jp-gpusched-empty' }, 'The queue is empty.')])
      )
    );

    sections.push(clusterSection(cluster, me?.name ?? null, this.history.rows));

    // the reaper's settings: admins only (the caller passes null to others). The editor stays
    // in the page between refreshes (a field being typed in keeps its focus); hidden otherwise.
    const admin = Boolean(reaper && reaper.settings);
    this.reaperEditor.node.hidden = !admin;
    if (admin) {
      this.reaperEditor.show(reaper.settings);
    }
    this.body.replaceChildren(...sections);
  }

  /** Cancel a job (`what` "job", `jobs/<id>`) or a job array ("array", `arrays/<id>`). */
  private async cancel(what: 'job' | 'array', id: string, button: HTMLButtonElement, question: string): Promise<void> {
    // a cancel cannot be taken back: asked first, in the page's words
    const answer = await showDialog({
      title: what === 'job' ? 'Cancel the job?' : 'Cancel the array?',
      body: question,
      buttons: [Dialog.cancelButton({ label: 'Keep it' }), Dialog.warnButton({ label: 'Cancel it' })]
    });
    if (!answer.button.accept) {
      return;
    }
    button.disabled = true;
    try {
      await request(`${what}s/${encodeURIComponent(id)}`, { method: 'DELETE' });
      Notification.info(`${what === 'job' ? 'Job' : 'Array'} ${id} cancelled`, { autoClose: 3000 });
    } catch (error) {
      Notification.error(`Could not cancel ${what} ${id}: ${(error as Error).message}`);
      button.disabled = false;
    }
    this.changed();
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

/**
 * "Cancel a-000005_[0-5]? Its 4 pending jobs leave the queue; its 1 running job gets the stop
 * signal." (the scheduler's page asks the same; what is not there, not said)
 */
export function cancelQuestion(label: string, count: { pending: number; running: number }): string {
  const parts: string[] = [];
  const single = count.pending + count.running === 1;
  if (count.pending) {
    parts.push(single ? 'it leaves the queue' : `its ${count.pending} pending job${count.pending === 1 ? ' leaves' : 's leave'} the queue`);
  }
  if (count.running) {
    parts.push(single ? 'it gets the stop signal' : `its ${count.running} running job${count.running === 1 ? ' gets' : 's get'} the stop signal`);
  }
  const said = parts.join('; ');
  return `Cancel ${label}? ${said.charAt(0).toUpperCase()}${said.slice(1)}.`;
}

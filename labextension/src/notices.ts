/**
 * The scheduler's notices to this server (serverext/notices.py) as the user sees them:
 *
 * - a reaper warning or a pre-emption: a toast that stays. JupyterLab cuts a toast's text at
 *   140 characters, so a longer notice gets a summary that fits (what happens, and when) and a
 *   "Details" action with the whole text; the panel's "This server" shows the last one whole;
 * - `reaper-cull` (the reaper is stopping this server now): a dialog that stays until dismissed,
 *   with the reaper's reason, in place of the warnings' toasts (they go). The server extension
 *   holds the reaper's request until the Lab has fetched it, and this poll runs every second
 *   around a warning's deadline, so the dialog comes before the connection drops (JupyterLab's
 *   own "server unavailable" dialog queues behind it).
 *
 * The server numbers its notices from 1 at each of its starts and names the start (`start`):
 * what was shown is remembered as (start, last id), so that a restarted server's notices,
 * numbered from 1 again, are shown, and a reloaded page does not show a notice twice.
 */
import { Dialog, Notification, showDialog } from '@jupyterlab/apputils';
import { ServerConnection } from '@jupyterlab/services';
import { Widget } from '@lumino/widgets';

import { Poller, request } from './api';
import { clock, el } from './format';

/** JupyterLab's toasts show at most this many characters (apputils' Notification). */
export const TOAST_LIMIT = 140;
const NORMAL_MS = 5000;
const URGENT_MS = 1000; // around a warning's deadline: the cull may come any second
const URGENT_BEFORE = 30; // seconds before a deadline ...
const URGENT_AFTER = 180; // ... and after it (the reaper acts at its next tick)
export const CULL_KIND = 'reaper-cull';

interface Seen {
  start: string;
  id: number;
}

export interface INotice {
  id: number;
  kind: string;
  message: string;
  deadline: number | null;
  received?: number;
}

function title(kind: string): string {
  if (kind === 'preemption') {
    return 'Pre-emption';
  }
  if (kind === 'idle') {
    return 'Idle server';
  }
  if (kind === 'unmonitored') {
    return 'GPU use not measured';
  }
  return `GPU scheduler (${kind})`;
}

/** The whole text of a notice, as the Details dialog and the panel show it. */
export function noticeText(notice: INotice): string {
  const deadline = notice.deadline ? ` (by ${clock(notice.deadline, true)})` : '';
  return `${title(notice.kind)}: ${notice.message}${deadline}`;
}

/** The toast's text: the whole notice when it fits, else what happens and when. */
export function toastText(notice: INotice): string {
  const whole = noticeText(notice);
  if (whole.length <= TOAST_LIMIT) {
    return whole;
  }
  const when = notice.deadline ? `at ${clock(notice.deadline, true)}` : 'soon';
  const what =
    notice.kind === 'idle'
      ? `this server will be stopped ${when} unless its GPUs are used.`
      : notice.kind === 'preemption'
        ? `this server will be stopped ${when}: a higher tier needs its GPUs.`
        : `${notice.message.slice(0, 80).replace(/\s+\S*$/, '')} \u2026`;
  return `${title(notice.kind)}: ${what} See Details.`;
}

function textBody(className: string, ...paragraphs: string[]): Widget {
  const body = new Widget({ node: el('div', { class: className }, ...paragraphs.map(p => el('p', {}, p))) });
  return body;
}

export class Notices {
  readonly poller: Poller;
  /** The newest warning or pre-emption shown (the panel's "This server" shows it whole). */
  latest: INotice | null = null;
  private readonly key: string;
  private seen: Seen;
  private lastCheck = 0;
  private deadline: number | null = null; // of the newest warning, in server epoch seconds
  private toasts: string[] = []; // the warnings' toasts, which the cull's dialog replaces

  constructor(
    private readonly openPanel: () => void,
    private readonly onNotice: () => void = () => undefined
  ) {
    this.key = `jupyter-gpusched:last-notice:${ServerConnection.makeSettings().baseUrl}`;
    this.seen = Notices.load(window.localStorage.getItem(this.key));
    this.poller = new Poller(() => this.check(), URGENT_MS, 60000, () => this.due());
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

  /** Every second around the newest warning's deadline, else every few seconds. */
  private due(): boolean {
    const now = Date.now() / 1000;
    const urgent =
      this.deadline !== null && now > this.deadline - URGENT_BEFORE && now < this.deadline + URGENT_AFTER;
    return Date.now() - this.lastCheck >= (urgent ? URGENT_MS : NORMAL_MS);
  }

  async check(): Promise<void> {
    this.lastCheck = Date.now();
    const data = await request('notices?watching=1'); // the server holds a cull for a watching Lab
    for (const notice of data.notices as any[]) {
      if (notice.deadline && notice.kind !== CULL_KIND) {
        this.deadline = notice.deadline; // a restarted page still knows when the cull is due
      }
      const start = String(notice.start ?? data.start ?? '');
      if (start === this.seen.start && notice.id <= this.seen.id) {
        continue;
      }
      this.seen = { start, id: notice.id };
      window.localStorage.setItem(this.key, JSON.stringify(this.seen));
      this.show(notice);
    }
  }

  private show(notice: INotice): void {
    if (notice.kind === CULL_KIND) {
      // the warnings are overtaken: their toasts ("... unless its GPUs are used") go
      this.toasts.forEach(id => Notification.dismiss(id));
      this.toasts = [];
      void showDialog({
        title: 'The idle reaper is stopping this server',
        body: textBody(
          'jp-gpusched-cull-dialog',
          notice.message,
          'Unsaved changes are lost. Start the server again from the hub home page (File > Hub Control Panel).'
        ),
        buttons: [Dialog.okButton({ label: 'OK' })]
      });
      return;
    }
    this.latest = notice;
    this.onNotice();
    const whole = noticeText(notice);
    const actions: Notification.IAction[] = [{ label: 'GPU panel', callback: () => this.openPanel() }];
    if (toastText(notice) !== whole) {
      actions.unshift({
        label: 'Details',
        callback: (event: Event) => {
          event.preventDefault(); // the toast stays
          void showDialog({
            title: title(notice.kind),
            body: textBody('jp-gpusched-notice-dialog', whole),
            buttons: [Dialog.okButton({ label: 'OK' })]
          });
        }
      });
    }
    const options = { autoClose: false as const, actions };
    if (notice.kind === 'preemption') {
      this.toasts.push(Notification.error(toastText(notice), options));
    } else {
      this.toasts.push(Notification.warning(toastText(notice), options));
    }
  }
}

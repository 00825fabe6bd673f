/**
 * What the extension writes: the status bar's text, this server's line, a waiting job's reason,
 * timeouts, and a small DOM helper.
 */

export interface IReason {
  family: string;
  detail?: string;
  message?: string;
  eta?: number | null;
}

export interface IStatus {
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
  page_url?: string | null;
  pending: {
    id: string;
    name: string | null;
    gpus: number;
    tier: number;
    position: number | null;
    reason: IReason | null;
  }[];
}

export function num(value: number): string {
  return Number.isInteger(value) ? String(value) : value.toFixed(2).replace(/0+$/, '');
}

export function clock(epoch: number, seconds = false): string {
  // "14:06" (24-hour, local time); with seconds, "14:06:30": a moment a server will be stopped
  // (a minute's rounding is too much there). The page's draw.js says times the same way.
  return new Date(epoch * 1000).toLocaleTimeString([], {
    hour: '2-digit',
    minute: '2-digit',
    hour12: false,
    ...(seconds ? { second: '2-digit' } : {})
  });
}

/** "18:00" today, else "2026-12-07 18:00" (as the notebook widget says a time). */
export function dayAndClock(epoch: number): string {
  const moment = new Date(epoch * 1000);
  if (moment.toDateString() === new Date().toDateString()) {
    return clock(epoch);
  }
  const day = `${moment.getFullYear()}-${String(moment.getMonth() + 1).padStart(2, '0')}-${String(moment.getDate()).padStart(2, '0')}`;
  return `${day} ${clock(epoch)}`;
}

/** "queued #3 · policy · ETA 14:20" (the status bar: the family only, the panel says more). */
export function queued(position: number | null, reason: IReason | null): string {
  const parts = [position === null ? 'held' : `queued #${position + 1}`];
  if (reason?.family) {
    parts.push(reason.family);
  }
  if (reason?.eta) {
    parts.push(`ETA ${dayAndClock(reason.eta)}`);
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

/**
 * This server's own job, and nothing else: "2x H100 · 63% · idle reclaim in 12 min" while it
 * runs, its place in the queue while it waits; null when the server has no job of the scheduler.
 */
export function serverText(status: IStatus, now = Date.now() / 1000): string | null {
  const job = status.job;
  if (!job || (status.job_id && job.id && job.id !== status.job_id)) {
    return null;
  }
  if (job.state === 'running') {
    const gpus = status.gpus ?? job.gpus;
    // a server without GPUs (a gpus: 0 profile) says so, not "0x GPU"
    let text = gpus === 0 ? 'CPU only' : `${num(gpus)}x ${status.gpu_model ?? 'GPU'}`;
    if (status.utilization !== null && status.utilization !== undefined) {
      text += ` · ${Math.round(status.utilization)}%`;
    }
    const reclaim = status.reaper?.reclaim_at;
    if (reclaim) {
      const skew = now - status.time; // the server's clock against ours
      const minutes = Math.max(0, Math.ceil((reclaim - (now - skew)) / 60));
      text += ` · idle reclaim in ${minutes} min`;
    }
    return text;
  }
  if (job.state === 'pending') {
    return queued(job.position, job.reason);
  }
  return job.state;
}

/** The status bar: this server, then the user's first other waiting job, named. */
export function statusText(status: IStatus, now = Date.now() / 1000): string {
  const parts: string[] = [];
  const server = serverText(status, now);
  if (server) {
    parts.push(server);
  }
  const others = status.pending.filter(p => p.id !== status.job_id);
  if (others.length) {
    parts.push(`${others[0].name || others[0].id}: ${queued(others[0].position, others[0].reason)}`);
  }
  if (!parts.length) {
    return status.configured ? 'No GPUs' : 'GPU scheduler: not connected';
  }
  return parts.join('  |  ');
}

/** Where a job runs: "gpu1:0,1 gpu2:0,1"; a part without GPUs (a CPU-only job) is its node. */
export function allocationText(allocation: { node: string; gpus: number[] }[] | null | undefined): string {
  return (allocation || []).map(p => (p.gpus.length ? `${p.node}:${p.gpus.join(',')}` : p.node)).join(' ');
}

export function el<K extends keyof HTMLElementTagNameMap>(
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

/** Why a job waits: the service's message in full, its family as a small tag, and the ETA. */
export function reasonNode(reason: IReason | null | undefined): HTMLElement | null {
  if (!reason) {
    return null;
  }
  return el(
    'div',
    { class: 'jp-gpusched-reason' },
    el('span', { class: `jp-gpusched-tag jp-gpusched-tag-${reason.family}` }, reason.family),
    ' ',
    el('span', { class: 'jp-gpusched-reason-message' }, reason.message || reason.detail || ''),
    reason.eta ? el('span', { class: 'jp-gpusched-eta' }, ` · ETA ${dayAndClock(reason.eta)}`) : null
  );
}

/** A job's deadline (the scheduler's page says it the same way): "due by 18:00", or that it
 * missed it; null for a job without one. */
export function deadlineNode(job: { deadline?: number | null; deadline_missed?: boolean }): HTMLElement | null {
  if (job.deadline === null || job.deadline === undefined) {
    return null;
  }
  const missed = Boolean(job.deadline_missed);
  const text = `${missed ? 'missed its deadline' : 'due by'} ${dayAndClock(job.deadline)}`;
  return el(
    'span',
    { class: `jp-gpusched-deadline${missed ? ' jp-gpusched-deadline-missed' : ''}`, title: new Date(job.deadline * 1000).toString() },
    text
  );
}

/** A tier as a small tag in the one tier palette (docs/notebook.md: tier colours). */
export function tierTag(tier: number): HTMLElement {
  return el('span', { class: `jp-gpusched-tag jp-gpusched-tier jp-gpusched-t${tier}` }, `tier ${tier}`);
}

const SVG = 'http://www.w3.org/2000/svg';

function svg(tag: string, attrs: Record<string, string>): SVGElement {
  const node = document.createElementNS(SVG, tag);
  for (const [key, value] of Object.entries(attrs)) {
    node.setAttribute(key, value);
  }
  return node;
}

/**
 * A queue's GPUs as a bar: in use filled (past the guarantee: borrowed, in the warning colour),
 * the guarantee a tick, the bar's end the limit (no limit: the larger of the two, and a bit).
 */
export function queueBar(inUse: number, guaranteed: number, limit: number | null): HTMLElement {
  const scale = Math.max(limit ?? Math.max(guaranteed, inUse) * 1.25, inUse, guaranteed, 1);
  const percent = (value: number) => `${Math.min(100, (100 * value) / scale)}%`;
  const owned = Math.min(inUse, guaranteed);
  return el(
    'div',
    {
      class: 'jp-gpusched-bar',
      role: 'img',
      'aria-label': `${num(inUse)} of ${limit === null ? 'unlimited' : num(limit)} GPUs in use, ${num(guaranteed)} guaranteed`
    },
    el('span', { class: 'jp-gpusched-bar-used', style: `width: ${percent(owned)}` }),
    inUse > guaranteed
      ? el('span', {
          class: 'jp-gpusched-bar-borrowed',
          style: `left: ${percent(guaranteed)}; width: ${percent(inUse - guaranteed)}`
        })
      : null,
    el('span', { class: 'jp-gpusched-bar-guarantee', style: `left: ${percent(guaranteed)}` })
  );
}

/**
 * Readings in percent (null: unknown, a gap) as a small line, newest on the right, then `note`
 * (default: the newest reading, "63% now").
 */
export function sparkline(values: (number | null)[], title: string, note?: string): HTMLElement {
  const width = 120;
  const height = 24;
  const step = values.length > 1 ? width / (values.length - 1) : width;
  const chart = svg('svg', {
    class: 'jp-gpusched-sparkline',
    viewBox: `0 0 ${width} ${height}`,
    width: String(width),
    height: String(height)
  });
  let path = '';
  values.forEach((value, i) => {
    if (value === null) {
      return; // a gap: unknown is not 0%
    }
    const x = (i * step).toFixed(1);
    const y = (height - 1 - ((height - 2) * Math.max(0, Math.min(100, value))) / 100).toFixed(1);
    path += `${path && values[i - 1] !== null ? 'L' : 'M'}${x},${y} `;
  });
  chart.append(svg('path', { d: path.trim(), fill: 'none', 'stroke-width': '1.5' }));
  const last = [...values].reverse().find(v => v !== null);
  return el(
    'div',
    { class: 'jp-gpusched-spark', title },
    chart as unknown as Node,
    ` ${note ?? `${last === undefined || last === null ? '\u2014' : `${Math.round(last)}%`} now`}`
  );
}

/** Jobs in their order, the elements of each job array gathered where its first one stands. */
export function groupArrays<T extends { array_id?: string | null }>(jobs: T[]): (T | T[])[] {
  const out: (T | T[])[] = [];
  const arrays = new Map<string, T[]>();
  for (const job of jobs) {
    const id = job.array_id;
    if (!id) {
      out.push(job);
      continue;
    }
    let group = arrays.get(id);
    if (!group) {
      group = [];
      arrays.set(id, group);
      out.push(group);
    }
    group.push(job);
  }
  return out;
}

/** "array of 6 jobs, 2 running, 4 pending", as the scheduler's page says it (page.js). */
export function arrayText(elements: { state?: string }[]): string {
  const running = elements.filter(e => e.state === 'running').length;
  const pending = elements.filter(e => e.state === 'pending').length;
  const jobs = `${elements.length} job${elements.length === 1 ? '' : 's'}`;
  return `array of ${jobs}, ${running} running, ${pending} pending`;
}

/** 1st, 2nd, 3rd, 4th ... 11th, 12th, 13th, 21st (the page's ordinal, draw.js). */
export function ordinal(n: number): string {
  const suffixes = ['th', 'st', 'nd', 'rd'];
  const v = n % 100;
  return n + (suffixes[(v - 20) % 10] || suffixes[v] || suffixes[0]);
}

/**
 * The server extension's API (`<base>/gpusched/api/...`, jupyter_gpusched.serverext) and the
 * polls that read it: each backs off on errors and stops while the page is hidden.
 */
import { URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';

export class APIError extends Error {
  constructor(
    message: string,
    readonly status: number,
    readonly field: string | null = null // the request's field the service refused, if any
  ) {
    super(message);
  }
}

export async function request(path: string, init: RequestInit = {}, text = false): Promise<any> {
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
    let field: string | null = null;
    try {
      const data = JSON.parse(body);
      message = data.error || data.message || body;
      field = typeof data.field === 'string' ? data.field : null;
    } catch {
      /* not JSON */
    }
    throw new APIError(message || response.statusText, response.status, field);
  }
  return text ? body : body ? JSON.parse(body) : null;
}

/** Runs `fn` every `interval` ms while `active()`, backing off to `maxInterval` on errors. */
export class Poller {
  private timer: number | null = null;
  private delay: number;
  private running = false;
  private again = false; // a refresh came during a run: run once more right after it
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
    if (this.running) {
      this.again = true;
      return;
    }
    if (this.stopped || document.visibilityState === 'hidden') {
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
    const again = this.again;
    this.again = false;
    this.schedule(again ? 0 : this.delay);
  }
}

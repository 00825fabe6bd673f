/**
 * jupyter-gpusched: the GPU scheduler in JupyterLab.
 *
 * - a status-bar item: "2x H100 · 63% · idle reclaim in 12 min", then the user's next waiting
 *   job ("big-run: queued #3 · policy · ETA 14:20");
 * - a side panel (panel.ts): this server's job, my jobs with their GPU utilization, cancel and
 *   log view, the queue (others anonymised), the cluster by node and tier, and, for admins of the
 *   scheduler only, the reaper's timeouts, editable (`api/me` says whether the user is one);
 * - the scheduler's notices to this server (notices.ts): reaper warnings and pre-emption as
 *   toasts, the reaper's cull as a dialog before the connection drops.
 *
 * It talks only to this server's extension (`<base>/gpusched/api/...`, jupyter_gpusched.serverext),
 * which forwards to the scheduler service as the server's user. Every poll backs off on errors and
 * stops while the page is hidden.
 */
import { JupyterFrontEnd, JupyterFrontEndPlugin } from '@jupyterlab/application';
import { IStatusBar } from '@jupyterlab/statusbar';
import { Widget } from '@lumino/widgets';

import { Poller, request } from './api';
import { IStatus, statusText } from './format';
import { Notices } from './notices';
import { GPUPanel, PANEL_ID } from './panel';

export { parseTimeout, statusText, timeoutText, utilizationText } from './format';

const PLUGIN_ID = 'jupyter-gpusched:plugin';
const OPEN_COMMAND = 'gpusched:open-panel';

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
    this.node.title = 'GPU scheduler: click for the queue, the cluster and your jobs';
  }

  show_error(error: Error): void {
    this.node.textContent = 'GPUs: ?';
    this.node.title = `GPU scheduler: ${error.message}`;
  }
}

const plugin: JupyterFrontEndPlugin<void> = {
  id: PLUGIN_ID,
  description: 'GPU scheduler: my GPUs, the queue, the reaper countdown and notices',
  autoStart: true,
  optional: [IStatusBar],
  activate: (app: JupyterFrontEnd, statusBar: IStatusBar | null) => {
    let statusPoller: Poller | null = null;
    let item: StatusItem | null = null;
    const openPanel = () => app.shell.activateById(PANEL_ID);
    // a notice changes what the panel and the status bar say (a warning: the reclaim is near)
    const notices = new Notices(openPanel, () => {
      panel.poller.refresh();
      statusPoller?.refresh();
    });
    const panel = new GPUPanel(
      () => statusPoller?.refresh(),
      status => item?.show_status(status), // what the panel just read: no lag between the two
      () => notices.latest
    );
    app.shell.add(panel, 'right', { rank: 900 });
    app.commands.addCommand(OPEN_COMMAND, {
      label: 'Show the GPU scheduler panel',
      execute: openPanel
    });
    panel.poller.start();

    if (statusBar) {
      const shown = new StatusItem(openPanel);
      item = shown;
      statusBar.registerStatusItem(PLUGIN_ID, { item: shown, align: 'left', rank: 50 });
      statusPoller = new Poller(
        async () => {
          try {
            shown.show_status(await request('status'));
          } catch (error) {
            shown.show_error(error as Error);
            throw error;
          }
        },
        15000,
        120000
      );
      statusPoller.start();
    }

    notices.poller.start();
  }
};

export default plugin;

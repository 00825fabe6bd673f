/**
 * The panel's editor of the idle reaper's timeouts, for admins of the scheduler (panel.ts shows
 * it to them only; the service refuses others' changes).
 */
import { APIError, request } from './api';
import { el, parseTimeout, timeoutText } from './format';

// -- the reaper's timeouts, for admins ------------------------------------------------------------
const REAPER_FIELDS: [string, string][] = [
  ['timeout_tier_1', 'tier 1 timeout'],
  ['timeout_tier_2', 'tier 2 timeout'],
  ['timeout_tier_3', 'tier 3 timeout'],
  ['warning_lead', 'warning before']
];
const LABELS = new Map(REAPER_FIELDS);

/** The service's refusal in the editor's words: "tier 3 timeout", not 'timeout_tier_3'. */
export function refusalText(message: string, field: string | null): string {
  const label = field ? LABELS.get(field) : undefined;
  if (!field || !label) {
    return message;
  }
  return message.split(`'${field}'`).join(`"${label}"`).replace(' (null in JSON)', '');
}

/**
 * The admin's editor of the reaper's timeouts (minutes, or "off"). It keeps its own DOM across
 * the panel's refreshes, so a value being typed is not overwritten by the next poll; a field the
 * admin changed keeps its text until saved (or Reset).
 */
export class ReaperEditor {
  readonly node = el('section', { class: 'jp-gpusched-reaper', hidden: '' });
  private readonly inputs = new Map<string, HTMLInputElement>();
  private readonly dirty = new Set<string>();
  private readonly message = el('div', { class: 'jp-gpusched-reaper-message' });
  // the profiles whose own timeout wins over these (set on the scheduler's page)
  private readonly profiles = el('p', { class: 'jp-gpusched-reaper-profiles' });
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
      return el(
        'label',
        { class: 'jp-gpusched-reaper-row', 'data-reaper-row': field },
        el('span', { class: 'jp-gpusched-reaper-label' }, label),
        el('span', {}, input, ' min')
      );
    });
    this.save.addEventListener('click', () => void this.submit());
    this.reset.addEventListener('click', () => {
      this.dirty.clear();
      this.message.textContent = '';
      this.show(this.settings);
    });
    this.node.append(
      el('h3', {}, 'Idle reaper (admin)'),
      ...rows,
      this.profiles,
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
    this.profiles.textContent = profilesText(settings);
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
      const saved = Object.keys(changes).map(field => LABELS.get(field) ?? field);
      this.message.textContent = `Saved: ${saved.join(', ')}`;
      this.onSaved();
    } catch (error) {
      this.message.className = 'jp-gpusched-reaper-message jp-gpusched-error';
      const field = error instanceof APIError ? error.field : null;
      this.message.textContent = `Not saved: ${refusalText((error as Error).message, field)}`;
    } finally {
      this.save.disabled = false;
    }
  }
}

/**
 * The profiles whose own timeout wins over the tiers' above (the hub's idle_timeout of a
 * profile, or the admin's profile_timeouts), in minutes: a tier's timeout changed here does not
 * reach their servers.
 */
export function profilesText(settings: any): string {
  const own = { ...(settings.profile_idle_timeouts ?? {}), ...(settings.profile_timeouts ?? {}) };
  const names = Object.keys(own).sort();
  if (!names.length) {
    return '';
  }
  const each = names.map(name => {
    const value = timeoutText(own[name]);
    return value === 'off' ? `${name} off` : `${name} ${value} min`;
  });
  return (
    `A profile's own timeout wins over its tier's: ${each.join(', ')}. ` +
    "Change those on the scheduler's page."
  );
}

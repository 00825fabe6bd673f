// The scheduler's web page (service/page.py): how it draws. DOM and inline SVG building, the
// words for numbers and times, and the charts (bars, sparklines, time charts); no library.
// Loaded first: admin.js and page.js use these.
'use strict';

const SVG = 'http://www.w3.org/2000/svg';
// one tier palette everywhere (page.css .t1/.t2/.t3, the Lab panel, the QueueWidget)
const TIER_COLOURS = { 1: '#1565c0', 2: '#2e7d32', 3: '#ef6c00' };
const FAMILY_COLOURS = { capacity: '#6a1b9a', placement: '#00838f', policy: '#c62828' };
const FAMILY_WORDS = {
  capacity: 'capacity (hardware busy)',
  placement: 'placement (shape, topology)',
  policy: 'policy (quotas, limits, holds)',
};
// the tier colours mean tiers only (one palette everywhere): other series and bars use others
const NEUTRAL = '#455a64';
const SERIES_COLOURS = ['#5d4037', '#ad1457', '#283593', '#00695c', '#9e9d24', '#4e342e', NEUTRAL, '#6d4c41'];
const DAY = 86400;
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

function formError(form, error) {
  // a refusal in the form's words: a field named by its API name ('idle_threshold') is named
  // by its label ("idle below (%)"), and the message also goes next to that field
  for (const old of form.querySelectorAll('.field-error')) old.remove();
  const input = error.field && form.elements[error.field];
  const label = input && input.closest && input.closest('label');
  if (!label) return error.message;
  const words = label.firstChild.textContent.trim();
  const text = error.message.split(`'${error.field}'`).join(`"${words}"`).replace(' (null in JSON)', '');
  label.after(el('span', { class: 'field-error', 'data-field': error.field, text }));
  return text;
}

function jobsText(n) {
  // "1 job", "6 jobs"
  return `${n} job${n === 1 ? '' : 's'}`;
}

// The words of core/wording.py (wait_text, estimate_text), which the notebook, the spawn form
// and the CLI print: the same rules, tested on the same cases (tests/test_page_browser.py).
// Python's round() takes halves to the even neighbour; Math.round takes them up.
function roundHalfEven(x) {
  return Math.abs(x % 1) === 0.5 ? 2 * Math.round(x / 2) : Math.round(x);
}

function waitText(seconds) {
  const minutes = Math.max(1, roundHalfEven(seconds / 60));
  if (minutes < 60) return `${minutes} min`;
  if (minutes < 120) return minutes > 60 ? `1 h ${minutes - 60} min` : '1 h';
  if (minutes < 48 * 60) {
    const tens = roundHalfEven(minutes / 10) * 10;
    const hours = Math.floor(tens / 60);
    const rest = tens % 60;
    return rest ? `${hours} h ${rest} min` : `${hours} h`;
  }
  return `${roundHalfEven(minutes / (24 * 60))} days`;
}

function estimateText(startNow, at, reason, now, withClock = true) {
  if (startNow) return 'starts now';
  if (at === null || at === undefined) return reason ? `waits: ${reason}` : 'waits';
  let text = `about ${waitText(at - now)}`;
  if (withClock) {
    const moment = new Date(at * 1000).toISOString(); // UTC: 2026-12-02T14:05:00.000Z
    const sameDay = moment.slice(0, 10) === new Date(now * 1000).toISOString().slice(0, 10);
    text += ` (at ${sameDay ? '' : `${moment.slice(0, 10)} `}${moment.slice(11, 16)} UTC)`;
  }
  return reason ? `${text}: ${reason}` : text;
}

function clock(epoch, seconds = false) {
  // "14:06" (24-hour, local time), as the Lab panel, the widget and the CLI say a time
  const parts = { hour: '2-digit', minute: '2-digit', hour12: false, ...(seconds ? { second: '2-digit' } : {}) };
  return new Date(epoch * 1000).toLocaleTimeString([], parts);
}

function dayAndClock(epoch) {
  // "18:00" today, else "2026-12-07 18:00" (as the Lab panel and the notebook widget say it)
  const moment = new Date(epoch * 1000);
  if (moment.toDateString() === new Date().toDateString()) return clock(epoch);
  const pad = (n) => String(n).padStart(2, '0');
  return `${moment.getFullYear()}-${pad(moment.getMonth() + 1)}-${pad(moment.getDate())} ${clock(epoch)}`;
}

function eta(epoch) {
  if (epoch === null || epoch === undefined) return '';
  const wait = epoch - Date.now() / 1000;
  // (another day's time with its date: "about 24 h (2026-12-08 13:30)")
  return wait <= 0 ? 'any moment' : `about ${waitText(wait)} (${dayAndClock(epoch)})`;
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
    svg('rect', { class: 'in-use', x: 0, y: 2, width: x(inUse), height: 12, fill: NEUTRAL }),
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
      svg('polyline', { points: line.join(' '), fill: 'none', stroke: NEUTRAL, 'stroke-width': 1.5 }),
    ),
    ` ${last}%`,
  );
}

// A time chart: ``series`` [{key, label, colour, value(row)}], stacked areas or lines; ``top``
// the y scale's end. The legend gives each series' value at the last sample, with its time (a
// history is sampled: "now" would read as live beside the page's live figures), and carries it
// (data-now) so that what it draws can be read back.
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
  const sampled = clock(rows[rows.length - 1].time, short);
  // "1 GPU waiting", "3 GPUs": a count of GPUs in the singular where it is one
  const amount = (v) => (unit.startsWith('GPUs') ? `${gpus(v)}${unit.slice(4)}` : `${Math.round(v * 100) / 100} ${unit}`);
  const legend = el(
    'div',
    { class: 'chart-legend' },
    series.map((item) =>
      el(
        'span',
        { class: 'legend-item', 'data-key': item.key, 'data-now': latest[item.key] },
        el('span', { class: 'swatch' }),
        `${item.label}: ${amount(latest[item.key])} at ${sampled}${item.extra ? item.extra : ''}`,
      ),
    ),
  );
  legend.querySelectorAll('.swatch').forEach((swatch, i) => (swatch.style.background = series[i].colour));
  return [chart, legend];
}

// What every view of the dashboard shares: building elements, formatting
// numbers and durations, the API client (reads revalidated by ETag, writes
// with the server's error and its field), the poller with its back-off and
// banner, uPlot line charts and a job's metric series.

export const KEY_STORE = 'fusebox.key';
export const POLL_MS = 2000;
const MAX_BACKOFF_MS = 30000;

let uPlotMod = null;
try {
  uPlotMod = (await import('./uPlot.esm.js')).default;
} catch {
  uPlotMod = null;
}
export const uPlot = uPlotMod;

export const $ = (sel, root = document) => root.querySelector(sel);
export const main = $('#main');

// ---- elements and formatting ---------------------------------------------

export function h(tag, attrs = {}, ...kids) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === null || v === undefined || v === false) continue;
    if (k === 'class') el.className = v;
    else if (k.startsWith('on')) el.addEventListener(k.slice(2), v);
    else el.setAttribute(k, v === true ? '' : v);
  }
  for (const kid of kids.flat(Infinity)) {
    if (kid === null || kid === undefined || kid === false) continue;
    el.append(kid instanceof Node ? kid : document.createTextNode(String(kid)));
  }
  return el;
}

// Replaces el's children with kids, as h() takes them: nested lists are
// flattened and null, undefined and false left out (replaceChildren itself
// would write them as the text "null").
export function put(el, ...kids) {
  el.replaceChildren(...kids.flat(Infinity).filter((k) => k !== null && k !== undefined && k !== false)
    .map((k) => (k instanceof Node ? k : document.createTextNode(String(k)))));
  return el;
}

// An element of the SVG namespace (the sweep's scatter and parallel coordinates).
export function svg(tag, attrs = {}, ...kids) {
  const el = document.createElementNS('http://www.w3.org/2000/svg', tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v !== null && v !== undefined && v !== false) el.setAttribute(k, v);
  }
  for (const kid of kids.flat(Infinity)) {
    if (kid === null || kid === undefined || kid === false) continue;
    el.append(kid instanceof Node ? kid : document.createTextNode(String(kid)));
  }
  return el;
}

export function fmt(v, digits = 4) {
  if (v === null || v === undefined || Number.isNaN(v)) return '—';
  if (typeof v !== 'number') return String(v);
  if (v !== 0 && (Math.abs(v) >= 1e5 || Math.abs(v) < 1e-3)) return v.toExponential(2);
  return String(Number(v.toPrecision(digits)));
}

// A duration given in ms, in the unit that reads best: "547 ns" is never
// written as "5.47e-4 ms" (µs below a millisecond, s from a second on).
export function fmtMs(ms, digits = 3) {
  if (ms === null || ms === undefined || Number.isNaN(ms)) return '—';
  const a = Math.abs(ms);
  const p = (x) => String(Number(x.toPrecision(digits)));
  if (a === 0) return '0 ms';
  if (a < 1e-3) return `${p(ms * 1e6)} ns`;
  if (a < 1) return `${p(ms * 1e3)} µs`;
  if (a < 1000) return `${p(ms)} ms`;
  return `${p(ms / 1000)} s`;
}

export function fmtBytes(n) {
  if (!n) return '0 B';
  const u = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  const i = Math.min(u.length - 1, Math.floor(Math.log2(n) / 10));
  return `${fmt(n / 2 ** (10 * i), 3)} ${u[i]}`;
}

export function fmtTime(iso) {
  if (!iso) return '—';
  const d = new Date(iso);
  return Number.isNaN(d.getTime()) ? iso : d.toLocaleString();
}

export const short = (id) => (id ? id.slice(0, 8) : '—');
export const fmtShare = (x) => `${fmt(100 * x, 3)}%`;

// A sweep as a person tells it from another of the same name: its name, its
// short id and when it was created.
export const sweepLabel = (s) => `${s.name} · ${short(s.id)} · ${fmtTime(s.created_at)}`;

export function stateBadge(state) {
  return h('span', { class: `badge s-${state}` }, state);
}

export function progress(step, steps) {
  const pct = steps > 0 ? Math.min(100, (100 * (step || 0)) / steps) : 0;
  return h('div', { class: 'progress', title: `${step || 0} / ${steps || '?'} steps` },
    h('div', { class: 'bar', style: `width:${pct.toFixed(1)}%` }),
    h('span', {}, `${step || 0} / ${steps || '?'}`));
}

export function metricOf(job, name) {
  const m = job.latest_metrics;
  return m && typeof m === 'object' && typeof m[name] === 'number' ? m[name] : null;
}

export function kv(rows) {
  return h('dl', { class: 'kv' }, rows.map(([k, val]) => [h('dt', {}, k), h('dd', {}, val)]));
}

// ---- API access and the reachability banner ----------------------------

export class ApiError extends Error {
  constructor(status, code, message, field) {
    super(message);
    this.status = status;
    this.code = code;
    this.field = field || null;
  }
}

export const key = () => sessionStorage.getItem(KEY_STORE);

async function errorOf(res) {
  let body = null;
  try {
    body = await res.json();
  } catch {
    body = null;
  }
  const err = body && body.error ? body.error : {};
  return new ApiError(res.status, err.code || 'http_error', err.message || res.statusText, err.field);
}

// The last answer of each polled read with its ETag: the request names the tag and an
// unchanged answer comes back as 304 without a body, so polling an idle job costs neither
// side the transfer and the parse.  Bounded: the oldest entry goes first.
const revalidated = new Map();
const REVALIDATED_MAX = 64;

export async function api(path, k = key()) {
  const slot = `${k}\u0000${path}`;
  const cached = revalidated.get(slot);
  const headers = { Authorization: `Bearer ${k}` };
  if (cached) headers['If-None-Match'] = cached.etag;
  let res;
  try {
    res = await fetch(path, { headers, cache: 'no-store' });
  } catch (e) {
    throw new ApiError(0, 'unreachable', 'the server cannot be reached');
  }
  if (res.status === 304 && cached) return cached.body;
  if (!res.ok) throw await errorOf(res);
  let body = null;
  try {
    body = await res.json();
  } catch {
    body = null;
  }
  const etag = res.headers.get('ETag');
  revalidated.delete(slot);
  if (etag && body !== null) {
    revalidated.set(slot, { etag, body });
    if (revalidated.size > REVALIDATED_MAX) revalidated.delete(revalidated.keys().next().value);
  }
  return body;
}

// A write (POST) with the signed-in key: the answer's body, or an ApiError
// with the server's code, message and the field at fault.  A JSON body is
// sent as JSON; without one the request has no body (the cancel routes take
// none).  extra adds headers (Idempotency-Key).
export async function apiSend(method, path, body, extra = {}) {
  const headers = { Authorization: `Bearer ${key()}`, ...extra };
  if (body !== undefined) headers['Content-Type'] = 'application/json';
  let res;
  try {
    res = await fetch(path, { method, headers, body, cache: 'no-store' });
  } catch {
    throw new ApiError(0, 'unreachable', 'the server cannot be reached');
  }
  if (!res.ok) throw await errorOf(res);
  return res.json();
}

const banner = $('#banner');
export function setBanner(text) {
  banner.textContent = text || '';
  banner.hidden = !text;
}

// Where a poller sends a key that stopped working (app.js sets it).
export const hooks = { signOut: () => {} };

// A poller runs fn, waits for it to finish, then sleeps interval ms (more
// after errors, doubling up to MAX_BACKOFF_MS) and runs it again, until the
// view that owns it is left.  now() runs it at once (an action shows its
// effect): during a run, right after it; never two runs at a time.
export class Poller {
  constructor(fn, interval = POLL_MS) {
    this.fn = fn;
    this.interval = interval;
    this.failures = 0;
    this.stopped = false;
    this.timer = null;
    this.busy = false;
    this.again = false;
    this.run();
  }

  now() {
    if (this.busy) this.again = true;
    else this.run();
  }

  async run() {
    if (this.stopped) return;
    clearTimeout(this.timer);
    this.busy = true;
    let wait = this.interval;
    if (!document.hidden) {
      try {
        await this.fn();
        if (this.failures) setBanner('');
        this.failures = 0;
      } catch (e) {
        this.busy = false;
        if (this.stopped) return;
        if (e.status === 401) {
          hooks.signOut('Your key is no longer accepted. Sign in again.');
          return;
        }
        this.failures++;
        wait = Math.min(MAX_BACKOFF_MS, this.interval * 2 ** this.failures);
        const why = e.status === 0 ? 'Server unreachable' :
          e.status >= 500 ? `Server error (${e.status})` : `Request failed: ${e.message}`;
        setBanner(`${why}; retrying in ${Math.round(wait / 1000)} s.`);
      }
    }
    this.busy = false;
    if (this.again) {
      this.again = false;
      wait = 0;
    }
    if (!this.stopped) this.timer = setTimeout(() => this.run(), wait);
  }

  stop() {
    this.stopped = true;
    clearTimeout(this.timer);
  }
}

// A view: pollers it started and charts to resize, all stopped on leave.
// v.poll returns the poller, whose now() an action calls to show its effect at once.
export function makeView() {
  const v = { pollers: [], charts: [] };
  v.poll = (fn, ms) => {
    const p = new Poller(fn, ms);
    v.pollers.push(p);
    return p;
  };
  v.stop = () => v.pollers.forEach((p) => p.stop());
  return v;
}

// ---- charts ---------------------------------------------------------------

export const COLORS = ['#2563eb', '#dc2626', '#16a34a', '#d97706', '#7c3aed', '#0891b2', '#db2777',
  '#65a30d', '#ea580c', '#4f46e5'];

// The color of series i: the ten above, then hues spaced by the golden angle, so that
// a sweep's sixteen trials (or a thousand) each get one.
export const colorOf = (i) => (i < COLORS.length ? COLORS[i] :
  `hsl(${Math.round((i * 137.508) % 360)}, 65%, 45%)`);

// A series with at most this many points draws them as dots as well: an evaluation
// recorded at one step is a point with no line through it.
const FEW_POINTS = 40;

// A line chart over step: series is [{label, color?, fill?}], data is
// [steps, ...values]; value(si, i) optionally overrides legend values and
// opts.unit formats the y axis and legend (fmtMs for durations).  The box
// says how many steps (data-points) and series (data-series) it holds and
// which series are drawn with dots (data-dots, their labels).
export class Chart {
  constructor(parent, title, series, opts = {}) {
    this.box = h('div', { class: 'chart', 'data-chart': opts.id || title, 'data-points': '0',
      'data-series': String(series.length), 'data-dots': '' }, h('h3', {}, title));
    parent.append(this.box);
    this.series = series;
    this.data = [[], ...series.map(() => [])];
    this.plot = null;
    this.opts = opts;
    this.dots = [];
    if (!uPlot) this.box.append(h('p', { class: 'muted' }, 'Charts unavailable (uPlot missing).'));
  }

  width() {
    return Math.max(260, this.box.clientWidth - 16);
  }

  make() {
    const f = this.opts.unit || fmt;
    const series = [{ label: 'step' }, ...this.series.map((s, i) => ({
      label: s.label,
      stroke: s.color || colorOf(i),
      fill: s.fill || undefined,
      width: 1.5,
      points: { show: (u, si) => this.dots[si - 1] === true, size: 6 },
      spanGaps: true,
      value: this.opts.value ? (u, v, si, idx) => f(this.opts.value(si, idx)) : (u, v) => f(v),
    }))];
    this.plot = new uPlot({
      width: this.width(),
      height: this.opts.height || 200,
      series,
      scales: { x: { time: false } },
      axes: [{ label: 'step', size: 36 }, { size: 64, values: (u, ticks) => ticks.map((t) => f(t)) }],
      cursor: { drag: { x: true, y: false } },
      legend: { live: true, show: this.opts.legend !== false },
    }, this.data, this.box);
  }

  set(data) {
    this.data = data;
    this.dots = data.slice(1).map((col) => col.reduce((n, v) => n + (v === null ? 0 : 1), 0) <= FEW_POINTS);
    this.box.dataset.points = String(data[0].length);
    this.box.dataset.dots = this.series.filter((s, i) => this.dots[i] &&
      data[i + 1].some((v) => v !== null)).map((s) => s.label).join(',');
    if (!uPlot || data[0].length === 0) return;
    if (!this.plot) this.make();
    else this.plot.setData(this.data);
  }

  resize() {
    if (this.plot) this.plot.setSize({ width: this.width(), height: this.opts.height || 200 });
  }
}

// Accumulates metric points of one job, asking only for the steps from the
// last one seen on: that one again, because a step's point can gain fields
// after it was read (the evaluation at a member's last step lands on the
// point its progress report wrote), then the new ones.  pull() resolves to
// how many points were added or changed.
export class Series {
  constructor(jobId, fields) {
    this.jobId = jobId;
    this.fields = fields;
    this.points = [];
  }

  async pull() {
    let more = true;
    let n = 0;
    let changed = 0;
    while (more && n++ < 10) {
      const last = this.points.length ? this.points[this.points.length - 1] : null;
      const q = new URLSearchParams({ since_step: String(last ? last.step - 1 : -1), limit: '1000' });
      if (this.fields) q.set('fields', this.fields.join(','));
      const r = await api(`/v1/jobs/${this.jobId}/metrics?${q}`);
      let pts = r.points;
      if (last && pts.length && pts[0].step === last.step) {
        if (JSON.stringify(pts[0]) !== JSON.stringify(last)) {
          this.points[this.points.length - 1] = pts[0];
          changed++;
        }
        pts = pts.slice(1);
      }
      for (const p of pts) this.points.push(p);
      changed += pts.length;
      more = r.next_since_step !== null && pts.length > 0;
    }
    return changed;
  }

  column(name) {
    return this.points.map((p) => (typeof p[name] === 'number' ? p[name] : null));
  }

  steps() {
    return this.points.map((p) => p.step);
  }
}

// Several jobs' series of one metric on the union of their steps, for one chart:
// [steps, ...one column per job] (null where a job has no point).
export function overlay(list, name) {
  const steps = [...new Set(list.flatMap((s) => s.steps()))].sort((a, b) => a - b);
  const cols = list.map((s) => {
    const m = new Map(s.points.map((p) => [p.step, typeof p[name] === 'number' ? p[name] : null]));
    return steps.map((x) => (m.has(x) ? m.get(x) : null));
  });
  return [steps, ...cols];
}

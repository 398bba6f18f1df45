// The fusebox dashboard: a few views over the public REST API (docs/api.md),
// routed by the URL hash.  Each view polls only what it shows, one request
// at a time, asks for new metric points only (since_step), backs off on
// errors and says when the server cannot be reached.  Charts are uPlot,
// served by fuseboxd from the build; without it the tables still work.

const KEY_STORE = 'fusebox.key';
const POLL_MS = 2000;
const MAX_BACKOFF_MS = 30000;

let uPlot = null;
try {
  uPlot = (await import('./uPlot.esm.js')).default;
} catch {
  uPlot = null;
}

const $ = (sel, root = document) => root.querySelector(sel);
const main = $('#main');

// ---- small helpers -------------------------------------------------------

function h(tag, attrs = {}, ...kids) {
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

function fmt(v, digits = 4) {
  if (v === null || v === undefined || Number.isNaN(v)) return '—';
  if (typeof v !== 'number') return String(v);
  if (v !== 0 && (Math.abs(v) >= 1e5 || Math.abs(v) < 1e-3)) return v.toExponential(2);
  return String(Number(v.toPrecision(digits)));
}

function fmtBytes(n) {
  if (!n) return '0 B';
  const u = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  const i = Math.min(u.length - 1, Math.floor(Math.log2(n) / 10));
  return `${fmt(n / 2 ** (10 * i), 3)} ${u[i]}`;
}

function fmtTime(iso) {
  if (!iso) return '—';
  const d = new Date(iso);
  return Number.isNaN(d.getTime()) ? iso : d.toLocaleString();
}

const short = (id) => (id ? id.slice(0, 8) : '—');

function stateBadge(state) {
  return h('span', { class: `badge s-${state}` }, state);
}

function progress(step, steps) {
  const pct = steps > 0 ? Math.min(100, (100 * (step || 0)) / steps) : 0;
  return h('div', { class: 'progress', title: `${step || 0} / ${steps || '?'} steps` },
    h('div', { class: 'bar', style: `width:${pct.toFixed(1)}%` }),
    h('span', {}, `${step || 0} / ${steps || '?'}`));
}

function metricOf(job, name) {
  const m = job.latest_metrics;
  return m && typeof m === 'object' && typeof m[name] === 'number' ? m[name] : null;
}

// ---- API access and the reachability banner ----------------------------

class ApiError extends Error {
  constructor(status, code, message) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

const key = () => sessionStorage.getItem(KEY_STORE);

// The last answer of each polled read with its ETag: the request names the tag and an
// unchanged answer comes back as 304 without a body, so polling an idle job costs neither
// side the transfer and the parse.  Bounded: the oldest entry goes first.
const revalidated = new Map();
const REVALIDATED_MAX = 64;

async function api(path, k = key()) {
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
  let body = null;
  try {
    body = await res.json();
  } catch {
    body = null;
  }
  if (!res.ok) {
    const err = body && body.error ? body.error : {};
    throw new ApiError(res.status, err.code || 'http_error', err.message || res.statusText);
  }
  const etag = res.headers.get('ETag');
  revalidated.delete(slot);
  if (etag && body !== null) {
    revalidated.set(slot, { etag, body });
    if (revalidated.size > REVALIDATED_MAX) revalidated.delete(revalidated.keys().next().value);
  }
  return body;
}

const banner = $('#banner');
function setBanner(text) {
  banner.textContent = text || '';
  banner.hidden = !text;
}

// A poller runs fn, waits for it to finish, then sleeps interval ms (more
// after errors, doubling up to MAX_BACKOFF_MS) and runs it again, until the
// view that owns it is left.
class Poller {
  constructor(fn, interval = POLL_MS) {
    this.fn = fn;
    this.interval = interval;
    this.failures = 0;
    this.stopped = false;
    this.timer = null;
    this.run();
  }

  async run() {
    if (this.stopped) return;
    let wait = this.interval;
    if (!document.hidden) {
      try {
        await this.fn();
        if (this.failures) setBanner('');
        this.failures = 0;
      } catch (e) {
        if (this.stopped) return;
        if (e.status === 401) {
          signOut('Your key is no longer accepted. Sign in again.');
          return;
        }
        this.failures++;
        wait = Math.min(MAX_BACKOFF_MS, this.interval * 2 ** this.failures);
        const why = e.status === 0 ? 'Server unreachable' :
          e.status >= 500 ? `Server error (${e.status})` : `Request failed: ${e.message}`;
        setBanner(`${why}; retrying in ${Math.round(wait / 1000)} s.`);
      }
    }
    if (!this.stopped) this.timer = setTimeout(() => this.run(), wait);
  }

  stop() {
    this.stopped = true;
    clearTimeout(this.timer);
  }
}

// ---- charts ---------------------------------------------------------------

const COLORS = ['#2563eb', '#dc2626', '#16a34a', '#d97706', '#7c3aed', '#0891b2', '#db2777',
  '#65a30d', '#ea580c', '#4f46e5'];

// A line chart over step: series is [{label, color?, fill?}], data is
// [steps, ...values]; value(si, i) optionally overrides legend values.
class Chart {
  constructor(parent, title, series, opts = {}) {
    this.box = h('div', { class: 'chart', 'data-chart': opts.id || title, 'data-points': '0' },
      h('h3', {}, title));
    parent.append(this.box);
    this.series = series;
    this.data = [[], ...series.map(() => [])];
    this.plot = null;
    this.opts = opts;
    if (!uPlot) this.box.append(h('p', { class: 'muted' }, 'Charts unavailable (uPlot missing).'));
  }

  width() {
    return Math.max(260, this.box.clientWidth - 16);
  }

  make() {
    const series = [{ label: 'step' }, ...this.series.map((s, i) => ({
      label: s.label,
      stroke: s.color || COLORS[i % COLORS.length],
      fill: s.fill || undefined,
      width: 1.5,
      points: { show: false },
      spanGaps: true,
      value: this.opts.value ? (u, v, si, idx) => fmt(this.opts.value(si, idx)) : (u, v) => fmt(v),
    }))];
    this.plot = new uPlot({
      width: this.width(),
      height: this.opts.height || 200,
      series,
      scales: { x: { time: false } },
      axes: [{ label: 'step', size: 36 }, { size: 56 }],
      cursor: { drag: { x: true, y: false } },
      legend: { live: true },
    }, this.data, this.box);
  }

  set(data) {
    this.data = data;
    this.box.dataset.points = String(data[0].length);
    if (!uPlot || data[0].length === 0) return;
    if (!this.plot) this.make();
    else this.plot.setData(this.data);
  }

  resize() {
    if (this.plot) this.plot.setSize({ width: this.width(), height: this.opts.height || 200 });
  }
}

// ---- views ------------------------------------------------------------------

let current = null; // {stop()} of the view on screen
let tenant = null;
let sweepNames = new Map();

function leaveView() {
  if (current) current.stop();
  current = null;
  setBanner('');
}

// A view: pollers it started and charts to resize, all stopped on leave.
function makeView() {
  const v = { pollers: [], charts: [] };
  v.poll = (fn, ms) => v.pollers.push(new Poller(fn, ms));
  v.stop = () => v.pollers.forEach((p) => p.stop());
  return v;
}

async function loadSweepNames() {
  const r = await api('/v1/sweeps?limit=200');
  sweepNames = new Map(r.sweeps.map((s) => [s.id, s.name]));
  return r.sweeps;
}

function jobsView(params) {
  const v = makeView();
  const state = params.get('state') || '';
  const sweep = params.get('sweep') || '';
  const stateSel = h('select', { id: 'f-state', 'aria-label': 'state' },
    ['', 'queued', 'scheduled', 'running', 'completed', 'failed', 'cancelled'].map((s) =>
      h('option', { value: s, selected: s === state }, s || 'any state')));
  const sweepSel = h('select', { id: 'f-sweep', 'aria-label': 'sweep' },
    h('option', { value: '' }, 'any sweep'));
  const apply = () => {
    const q = new URLSearchParams();
    if (stateSel.value) q.set('state', stateSel.value);
    if (sweepSel.value) q.set('sweep', sweepSel.value);
    location.hash = `#/jobs${q.toString() ? `?${q}` : ''}`;
  };
  stateSel.addEventListener('change', apply);
  sweepSel.addEventListener('change', apply);
  const count = h('span', { class: 'muted' });
  const body = h('tbody');
  main.replaceChildren(
    h('section', { class: 'card' },
      h('div', { class: 'toolbar' }, h('h2', {}, 'Jobs'), count, h('span', { class: 'spacer' }),
        stateSel, sweepSel),
      h('div', { class: 'scroll' }, h('table', { id: 'jobs' },
        h('thead', {}, h('tr', {}, ['Job', 'State', 'Tenant', 'Sweep', 'Array', 'Progress', 'Loss',
          'Val acc.', 'Samples/s', 'Slowdown'].map((c) => h('th', {}, c)))), body))));

  v.poll(async () => {
    const sweeps = await loadSweepNames();
    if (sweepSel.options.length !== sweeps.length + 1) {
      sweepSel.replaceChildren(h('option', { value: '' }, 'any sweep'),
        sweeps.map((s) => h('option', { value: s.id, selected: s.id === sweep }, s.name)));
    }
  }, 10000);
  v.poll(async () => {
    const q = new URLSearchParams({ limit: '200' });
    if (state) q.set('state', state);
    if (sweep) q.set('sweep_id', sweep);
    const r = await api(`/v1/jobs?${q}`);
    // An array's size, worker and share are the server's (GET /v1/cluster), asked for only
    // while some job shown trains in one; a finished array keeps just its id here.
    const live = r.jobs.some((j) => j.group_id && (j.state === 'scheduled' || j.state === 'running'));
    const arrays = live ? new Map((await api('/v1/cluster')).arrays.map((a) => [a.id, a])) : new Map();
    count.textContent = `${r.jobs.length}${r.next_cursor ? '+' : ''} shown`;
    body.replaceChildren(...r.jobs.map((j) => h('tr', { 'data-job': j.id },
      h('td', {}, h('a', { href: `#/jobs/${j.id}` }, j.name)),
      h('td', {}, stateBadge(j.state),
        j.queue ? h('div', { class: 'muted small' }, j.queue.reason,
          j.queue.position ? ` (#${j.queue.position})` : '') : null),
      // GET /v1/jobs lists the caller's own jobs only, so their tenant is the one signed in
      h('td', { class: 'tenant' }, tenant ? tenant.name : '—'),
      h('td', {}, j.sweep_id ? h('a', { href: `#/sweeps/${j.sweep_id}` },
        sweepNames.get(j.sweep_id) || short(j.sweep_id)) : '—'),
      h('td', { class: 'array' }, arrayCell(j.group_id, arrays.get(j.group_id))),
      h('td', {}, progress(j.step, j.steps)),
      h('td', { class: 'num' }, fmt(metricOf(j, 'loss'))),
      h('td', { class: 'num val-acc' }, fmt(metricOf(j, 'val_accuracy'))),
      h('td', { class: 'num' }, fmt(metricOf(j, 'samples_per_s'))),
      h('td', { class: 'num slowdown' }, fmt(j.slowdown, 3)))));
    if (!r.jobs.length)
      body.append(h('tr', {}, h('td', { colspan: 10, class: 'muted' }, 'No jobs yet.')));
  });
  return v;
}

// A job's array in the jobs table: its id, and while it trains its size,
// where it runs and its time share, with how many other tenants share it.
function arrayCell(id, a) {
  if (!id) return '—';
  if (!a) return h('span', { title: id }, short(id));
  const others = a.other_tenants ? `, shared with ${tenantCount(a.other_tenants)}` : '';
  return h('span', { title: `${id}: ${a.members} members on ${deviceNames(a)}, ` +
    `${fmtShare(a.time_share)} of the device time${others}` },
  `${short(id)} ×${a.members}`, h('span', { class: 'muted small' }, ` ${fmtShare(a.time_share)}`));
}

// Accumulates metric points of one job, asking only for steps after the
// last one seen.
class Series {
  constructor(jobId, fields) {
    this.jobId = jobId;
    this.fields = fields;
    this.since = -1;
    this.points = [];
  }

  async pull() {
    let more = true;
    let n = 0;
    while (more && n++ < 10) {
      const q = new URLSearchParams({ since_step: String(this.since), limit: '1000' });
      if (this.fields) q.set('fields', this.fields.join(','));
      const r = await api(`/v1/jobs/${this.jobId}/metrics?${q}`);
      for (const p of r.points) this.points.push(p);
      if (r.points.length) this.since = r.points[r.points.length - 1].step;
      more = r.next_since_step !== null && r.points.length > 0;
    }
  }

  column(name) {
    return this.points.map((p) => (typeof p[name] === 'number' ? p[name] : null));
  }

  steps() {
    return this.points.map((p) => p.step);
  }
}

function kv(rows) {
  return h('dl', { class: 'kv' }, rows.map(([k, val]) => [h('dt', {}, k), h('dd', {}, val)]));
}

function jobView(id) {
  const v = makeView();
  const head = h('div', { class: 'toolbar' }, h('h2', {}, 'Job'));
  const facts = h('div');
  const charts = h('div', { class: 'charts' });
  const events = h('tbody');
  const ckpts = h('tbody');
  main.replaceChildren(
    h('section', { class: 'card' }, head, facts),
    h('section', { class: 'card' }, charts),
    h('div', { class: 'two' },
      h('section', { class: 'card' }, h('h2', {}, 'Checkpoints'),
        h('table', { id: 'checkpoints' }, h('thead', {}, h('tr', {},
          ['Step', 'Time', 'Size', 'Final'].map((c) => h('th', {}, c)))), ckpts),
        h('p', {}, h('a', { id: 'download', class: 'button', href: '#', onclick: (e) => {
          e.preventDefault();
          download(id);
        } }, 'Download model'))),
      h('section', { class: 'card' }, h('h2', {}, 'Events'),
        h('table', { id: 'events' }, h('thead', {}, h('tr', {},
          ['Time', 'Kind', 'Message'].map((c) => h('th', {}, c)))), events))));

  const loss = new Chart(charts, 'Loss', [{ label: 'train' }, { label: 'val' }], { id: 'loss' });
  const acc = new Chart(charts, 'Accuracy', [{ label: 'train' }, { label: 'val' }],
    { id: 'accuracy' });
  const slow = new Chart(charts, 'Slowdown', [{ label: 'slowdown', color: '#d97706' }],
    { id: 'slowdown' });
  // stacked: each series is the sum of itself and those below, drawn top first
  const parts = ['wait_ms', 'io_ms', 'comm_ms', 'compute_ms'];
  let raw = [];
  const time = new Chart(charts, 'Step time (ms)', [
    { label: 'idle', color: '#9ca3af', fill: '#e5e7eb' },
    { label: 'I/O wait', color: '#d97706', fill: '#fde68a' },
    { label: 'comm', color: '#7c3aed', fill: '#ddd6fe' },
    { label: 'compute', color: '#2563eb', fill: '#bfdbfe' }], {
    id: 'breakdown', value: (si, i) => (raw[si - 1] ? raw[si - 1][i] : null) });
  v.charts.push(loss, acc, slow, time);

  const series = new Series(id, null);
  let job = null;
  v.poll(async () => {
    job = await api(`/v1/jobs/${id}`);
    head.replaceChildren(h('h2', {}, job.name), stateBadge(job.state),
      h('span', { class: 'spacer' }),
      job.sweep_id ? h('a', { href: `#/sweeps/${job.sweep_id}` }, 'sweep') : null);
    const lm = job.latest_metrics || {};
    facts.replaceChildren(kv([
      ['id', h('code', {}, job.id)],
      ['queue', job.queue ? `${job.queue.reason}${job.queue.position ? ` (#${job.queue.position})` : ''}` : '—'],
      ['progress', progress(job.step, job.steps)],
      ['loss', fmt(lm.loss)],
      ['samples/s', fmt(lm.samples_per_s)],
      ['slowdown', h('span', { id: 'job-slowdown' }, fmt(job.slowdown, 3))],
      ['array', job.group_id ? short(job.group_id) : 'not placed'],
      ['dataset', job.dataset],
      ['restarts', `${job.restarts} / ${job.max_restarts}`],
      ['submitted', fmtTime(job.created_at)],
      ['error', job.error || '—'],
    ]));
  });
  v.poll(async () => {
    const before = series.points.length;
    await series.pull();
    if (series.points.length === before && before > 0) return;
    const x = series.steps();
    loss.set([x, series.column('loss'), series.column('val_loss')]);
    acc.set([x, series.column('accuracy'), series.column('val_accuracy')]);
    slow.set([x, series.column('slowdown')]);
    raw = parts.map((p) => series.column(p));
    const stacked = parts.map((_, k) => x.map((_, i) => {
      let s = 0;
      let any = false;
      for (let j = k; j < parts.length; j++) {
        if (raw[j][i] !== null) {
          s += raw[j][i];
          any = true;
        }
      }
      return any ? s : null;
    }));
    time.set([x, ...stacked]);
  });
  let after = 0;
  v.poll(async () => {
    const r = await api(`/v1/jobs/${id}/events?after=${after}&limit=1000`);
    for (const e of r.events) {
      events.prepend(h('tr', {}, h('td', {}, fmtTime(e.time)), h('td', {}, e.kind),
        h('td', {}, e.message)));
      after = e.id;
    }
  }, 4000);
  v.poll(async () => {
    const r = await api(`/v1/jobs/${id}/checkpoints`);
    ckpts.replaceChildren(...r.checkpoints.map((c) => h('tr', {}, h('td', { class: 'num' }, c.step),
      h('td', {}, fmtTime(c.time)), h('td', { class: 'num' }, fmtBytes(c.bytes)),
      h('td', {}, c.final ? 'final' : ''))));
    if (!r.checkpoints.length)
      ckpts.append(h('tr', {}, h('td', { colspan: 4, class: 'muted' }, 'None yet.')));
  }, 5000);
  return v;
}

// The model download needs the key, so it is fetched and saved as a blob.
async function download(id) {
  const msg = $('#download-msg') || h('span', { id: 'download-msg', class: 'muted' });
  $('#download').after(msg);
  msg.textContent = ' downloading…';
  try {
    const res = await fetch(`/v1/jobs/${id}/model`, { headers: { Authorization: `Bearer ${key()}` } });
    if (!res.ok) {
      const b = await res.json().catch(() => ({}));
      throw new Error(b.error ? b.error.message : res.statusText);
    }
    const cd = res.headers.get('Content-Disposition') || '';
    const m = /filename="([^"]+)"/.exec(cd);
    const blob = await res.blob();
    const a = h('a', { href: URL.createObjectURL(blob), download: m ? m[1] : `${id}.safetensors` });
    document.body.append(a);
    a.click();
    a.remove();
    setTimeout(() => URL.revokeObjectURL(a.href), 10000);
    msg.textContent = ` ${fmtBytes(blob.size)}`;
  } catch (e) {
    msg.textContent = ` ${e.message}`;
    msg.className = 'error';
  }
}

function sweepsView() {
  const v = makeView();
  const body = h('tbody');
  main.replaceChildren(h('section', { class: 'card' }, h('h2', {}, 'Sweeps'),
    h('table', { id: 'sweeps' }, h('thead', {}, h('tr', {},
      ['Sweep', 'State', 'Trials', 'Jobs by state', 'Metric', 'Created'].map((c) => h('th', {}, c)))),
    body)));
  v.poll(async () => {
    const sweeps = await loadSweepNames();
    body.replaceChildren(...sweeps.map((s) => h('tr', {},
      h('td', {}, h('a', { href: `#/sweeps/${s.id}` }, s.name)), h('td', {}, stateBadge(s.state)),
      h('td', { class: 'num' }, s.n_trials),
      h('td', {}, Object.entries(s.jobs_by_state || {}).map(([k, n]) => `${k} ${n}`).join(', ')),
      h('td', {}, `${s.metric.name} (${s.metric.mode})`), h('td', {}, fmtTime(s.created_at)))));
    if (!sweeps.length) body.append(h('tr', {}, h('td', { colspan: 6, class: 'muted' }, 'No sweeps yet.')));
  }, 5000);
  return v;
}

function sweepView(id) {
  const v = makeView();
  const head = h('div', { class: 'toolbar' }, h('h2', {}, 'Sweep'));
  const thead = h('thead');
  const body = h('tbody');
  const charts = h('div', { class: 'charts' });
  main.replaceChildren(h('section', { class: 'card' }, head,
    h('div', { class: 'scroll' }, h('table', { id: 'trials', class: 'sortable' }, thead, body))),
  h('section', { class: 'card' }, charts));
  let sort = { key: 'index', dir: 1 };
  let rows = [];
  let best = null;
  let paramNames = [];
  let rule = null; // the sweep's early-stopping rule, null without one
  let chart = null;
  const series = new Map();

  const columns = () => [
    ['index', '#'], ['name', 'Trial'], ['state', 'State'], ['step', 'Step'],
    ...paramNames.map((p) => [`p:${p}`, p]),
    ['best', 'Best'], ...(rule ? [['rungs', 'Rungs']] : []), ['loss', 'Loss'],
    ['val_loss', 'Val loss'], ['accuracy', 'Accuracy'], ['val_accuracy', 'Val acc.'],
    ['slowdown', 'Slowdown'],
  ];
  // rungs sort by how far a trial got, so the survivors gather at one end
  const value = (r, k) => (k.startsWith('p:') ? (r.params || {})[k.slice(2)] :
    k === 'rungs' ? r.rungs.length : r[k]);
  const render = () => {
    thead.replaceChildren(h('tr', {}, columns().map(([k, label]) => h('th', {
      'data-key': k, class: sort.key === k ? (sort.dir > 0 ? 'asc' : 'desc') : null,
      onclick: () => {
        sort = { key: k, dir: sort.key === k ? -sort.dir : 1 };
        render();
      },
    }, label))));
    const sorted = [...rows].sort((a, b) => {
      const x = value(a, sort.key);
      const y = value(b, sort.key);
      if (x === y) return a.index - b.index;
      if (x === null || x === undefined) return 1;
      if (y === null || y === undefined) return -1;
      return (x < y ? -1 : 1) * sort.dir;
    });
    body.replaceChildren(...sorted.map((r) => h('tr', {
      class: best && best.index === r.index ? 'best' : null, 'data-trial': r.index },
    columns().map(([k]) => {
      const val = value(r, k);
      if (k === 'name') return h('td', {}, h('a', { href: `#/jobs/${r.job_id}` }, r.name));
      if (k === 'state') return h('td', { class: 'state' }, stateBadge(r.state), earlyStopped(r));
      if (k === 'rungs') return h('td', { class: 'rungs' }, rungCells(r.rungs, rule));
      return h('td', { class: 'num' }, fmt(val));
    }))));
  };

  v.poll(async () => {
    const [s, jobs] = await Promise.all([api(`/v1/sweeps/${id}`),
      api(`/v1/jobs?sweep_id=${id}&limit=200`)]);
    best = s.best_trial;
    const es = s.spec && s.spec.early_stopping;
    rule = es && typeof es === 'object' ? es : null;
    head.replaceChildren(h('h2', {}, s.name), stateBadge(s.state),
      h('span', { class: 'muted' }, `${s.n_trials} trials, ranked by ${s.metric.name} (${s.metric.mode})`,
        rule ? `; ASHA early stopping on ${rule.metric} (${rule.mode}), rungs at steps ` +
          `${rungSteps(rule).join(', ')}` : ''),
      h('span', { class: 'spacer' }),
      h('a', { href: `#/jobs?sweep=${id}` }, 'jobs'));
    const byId = new Map(jobs.jobs.map((j) => [j.id, j]));
    paramNames = [...new Set(s.trials.flatMap((t) => Object.keys(t.params || {})))].sort();
    rows = s.trials.map((t) => {
      const j = byId.get(t.job_id) || {};
      return { index: t.index, job_id: t.job_id, name: t.name, state: t.state, step: t.step,
        params: t.params, best: t.best ? t.best.value : null, rungs: t.rungs || [],
        end_reason: t.end_reason || null, loss: metricOf(j, 'loss'),
        val_loss: metricOf(j, 'val_loss'), accuracy: metricOf(j, 'accuracy'),
        val_accuracy: metricOf(j, 'val_accuracy'), slowdown: j.slowdown ?? null };
    });
    render();
    // overlaid loss curves of the first trials, new points only
    const shown = s.trials.slice(0, COLORS.length);
    for (const t of shown) if (!series.has(t.job_id)) series.set(t.job_id, new Series(t.job_id, ['loss']));
    for (const t of shown) await series.get(t.job_id).pull();
    const steps = [...new Set(shown.flatMap((t) => series.get(t.job_id).steps()))].sort((a, b) => a - b);
    if (!chart) {
      chart = new Chart(charts, 'Training loss by trial', shown.map((t) => ({ label: t.name })),
        { id: 'sweep-loss', height: 260 });
      v.charts.push(chart);
    }
    const cols = shown.map((t) => {
      const m = new Map(series.get(t.job_id).points.map((p) => [p.step, p.loss]));
      return steps.map((x) => (m.has(x) ? m.get(x) : null));
    });
    chart.set([steps, ...cols]);
  }, 3000);
  return v;
}

// Rung r of an ASHA rule lies at step grace_steps * reduction_factor^r
// (docs/api.md, "Early stopping (ASHA)").
function rungSteps(rule) {
  const out = [];
  for (let r = 0, st = rule.grace_steps; r < rule.max_rungs && Number.isSafeInteger(st);
    r++, st *= rule.reduction_factor) out.push(st);
  return out;
}

// A trial's rung history in one cell, oldest first: "r0 0.412 ✓ · r1 0.38 ✗",
// with the step, metric and decision time on hover.  A stop is final, so a
// ✗ is always the last rung shown.
function rungCells(rungs, rule) {
  if (!rungs.length) return h('span', { class: 'muted' }, '—');
  const what = rule ? rule.metric : 'metric';
  return rungs.map((g, i) => [i ? ' · ' : null, h('span', {
    class: `rung ${g.decision === 'stop' ? 'stop' : 'go'}`, 'data-rung': g.rung,
    title: `rung ${g.rung} at step ${g.step}: ${what} ${g.metric} → ${g.decision}` +
      ` (${fmtTime(g.decided_at)})` },
  `r${g.rung} ${fmt(g.metric)} ${g.decision === 'stop' ? '✗' : '✓'}`)]);
}

// The marker of a trial the early-stopping rule ended: its state alone
// ("completed") would pass it off as one that trained all its steps.
function earlyStopped(r) {
  if (r.end_reason !== 'early_stopped') return null;
  const at = r.rungs.find((g) => g.decision === 'stop');
  return h('span', { class: 'badge early-stopped', title: at ?
    `stopped by ASHA at rung ${at.rung} (step ${at.step}); left its array at step ${r.step}` :
    'stopped by ASHA' }, 'early stopped');
}

function clusterView() {
  const v = makeView();
  const summary = h('div', { class: 'tiles' });
  const arrays = h('tbody');
  const tenants = h('tbody');
  const workers = h('div');
  main.replaceChildren(h('section', { class: 'card' }, h('h2', {}, 'Cluster'), summary),
    h('section', { class: 'card' }, h('h2', {}, 'Arrays'),
      h('div', { class: 'scroll' }, h('table', { id: 'arrays' }, h('thead', {}, h('tr', {},
        ['Array', 'State', 'Worker', 'Devices', 'Members', 'Tenants', 'Time share', 'Samples/s',
          'Step time'].map((c) => h('th', {}, c)))), arrays))),
    h('section', { class: 'card' }, h('h2', {}, 'Workers and devices'), workers),
    h('section', { class: 'card' }, h('h2', {}, 'Tenants'),
      h('table', { id: 'tenants' }, h('thead', {}, h('tr', {}, ['Tenant', 'Weight', 'Fair share',
        'Devices in use', 'Actual share', 'Active jobs', 'Queued'].map((c) => h('th', {}, c)))),
      tenants)));
  const tile = (label, val, id) => h('div', { class: 'tile', id },
    h('div', { class: 'tile-v' }, val), h('div', { class: 'muted small' }, label));
  v.poll(async () => {
    const [c, w] = await Promise.all([api('/v1/cluster'), api('/v1/workers')]);
    const sd = c.slowdown || {};
    summary.replaceChildren(
      tile('workers ready', `${c.workers.ready} / ${c.workers.total}`),
      tile('devices busy', `${c.devices.busy} / ${c.devices.total}`),
      tile('utilization', `${fmt(100 * (c.utilization || 0), 3)}%`),
      tile('arrays running', `${c.groups.running}`),
      tile('mean array size', fmt(c.groups.mean_members, 3)),
      tile('jobs queued / running', `${c.jobs.queued} / ${c.jobs.running}`),
      tile('max slowdown', fmt(sd.max, 3), 'max-slowdown'),
      tile('mean slowdown', fmt(sd.mean, 3), 'mean-slowdown'));

    // one color per array, the same in its row and on every device it shares
    const color = new Map(c.arrays.map((a, i) => [a.id, COLORS[i % COLORS.length]]));
    const byId = new Map(c.arrays.map((a) => [a.id, a]));
    arrays.replaceChildren(...c.arrays.map((a) => h('tr', { 'data-array': a.id },
      h('td', {}, h('span', { class: 'swatch', style: `background:${color.get(a.id)}` }),
        h('code', { title: a.id }, short(a.id))),
      h('td', {}, stateBadge(a.state)),
      h('td', {}, a.worker || 'gone'),
      h('td', {}, a.devices.join(', ')),
      h('td', { class: 'num members' }, a.members),
      h('td', { class: 'tenants' }, tenantsOf(a)),
      h('td', { class: 'num share' }, fmtShare(a.time_share)),
      h('td', { class: 'num' }, fmt(a.samples_per_s)),
      h('td', {}, stepTime(a.breakdown)))));
    if (!c.arrays.length)
      arrays.append(h('tr', {}, h('td', { colspan: 9, class: 'muted' }, 'No arrays are training.')));

    const wsum = c.tenants.reduce((a, t) => a + t.weight, 0) || 1;
    const dsum = c.tenants.reduce((a, t) => a + t.devices_in_use, 0);
    tenants.replaceChildren(...c.tenants.map((t) => h('tr', {}, h('td', {}, t.name),
      h('td', { class: 'num' }, fmt(t.weight)),
      h('td', { class: 'num' }, `${fmt((100 * t.weight) / wsum, 3)}%`),
      h('td', { class: 'num' }, t.devices_in_use),
      h('td', { class: 'num' }, dsum ? `${fmt((100 * t.devices_in_use) / dsum, 3)}%` : '—'),
      h('td', { class: 'num' }, t.active_jobs), h('td', { class: 'num' }, t.queued_jobs))));

    workers.replaceChildren(...(w.workers.length ? w.workers.map((wk) => h('div', {
      class: 'worker', 'data-worker': wk.name },
    h('h3', {}, wk.name, ' ', stateBadge(wk.state),
      h('span', { class: 'muted small' }, ` ${wk.backend} ${wk.version}, last seen ${fmtTime(wk.last_seen_at)}`)),
    h('table', {}, h('thead', {}, h('tr', {}, ['Device', 'Kind', 'Name', 'Memory', 'Utilization',
      'Arrays and time shares'].map((x) => h('th', {}, x)))), h('tbody', {}, wk.devices.map((d) =>
      h('tr', { 'data-device': `${wk.name}/${d.index}` },
        h('td', { class: 'num' }, d.index), h('td', {}, d.kind), h('td', {}, d.name),
        h('td', { class: 'num' }, fmtBytes(d.memory_bytes)),
        h('td', {}, progressPct(d.utilization)),
        h('td', {}, deviceArrays(d.arrays, color, byId)))))))) :
      [h('p', { class: 'muted' }, 'No workers have registered yet; jobs wait in the queue.')]));
  }, 3000);
  return v;
}

const fmtShare = (x) => `${fmt(100 * x, 3)}%`;
const tenantCount = (n) => `${n} other tenant${n === 1 ? '' : 's'}`;
const deviceNames = (a) => `${a.worker || 'a worker that is gone'} device ${a.devices.join(', ')}`;

// The tenants of an array the caller may see by name, and a count of the rest.
function tenantsOf(a) {
  const names = a.tenants.map((t) => t.name);
  if (a.other_tenants) names.push(tenantCount(a.other_tenants));
  return names.join(', ') || '—';
}

// Mean step time and, on hover, its parts.
function stepTime(b) {
  if (!b) return '—';
  const parts = [['compute', b.compute_ms], ['comm', b.comm_ms], ['I/O', b.io_ms],
    ['idle', b.idle_ms]].filter(([, ms]) => typeof ms === 'number');
  const total = parts.reduce((a, [, ms]) => a + ms, 0);
  return h('span', { title: parts.map(([k, ms]) => `${k} ${fmt(ms, 3)} ms`).join(', ') },
    `${fmt(total, 3)} ms`, h('span', { class: 'muted small' },
      total > 0 ? ` (${fmt((100 * (b.idle_ms || 0)) / total, 2)}% idle)` : ''));
}

// A device's arrays: a bar split by time share, then one line per array.
function deviceArrays(list, color, byId) {
  if (!list.length) return h('span', { class: 'muted' }, 'idle');
  return h('div', { class: 'dev-arrays' },
    h('div', { class: 'sharebar' }, list.map((a) => h('div', {
      style: `width:${(100 * a.time_share).toFixed(1)}%;background:${color.get(a.id) || '#9ca3af'}`,
      title: `${short(a.id)}: ${fmtShare(a.time_share)}` }))),
    list.map((a) => {
      const full = byId.get(a.id);
      return h('div', { class: 'dev-array', 'data-array': a.id },
        h('span', { class: 'swatch', style: `background:${color.get(a.id) || '#9ca3af'}` }),
        h('code', { title: a.id }, short(a.id)), ` ×${a.members} `,
        h('span', { class: 'share' }, fmtShare(a.time_share)),
        full ? h('span', { class: 'muted small' }, ` ${tenantsOf(full)}`) : null);
    }));
}

function progressPct(u) {
  const pct = Math.max(0, Math.min(100, 100 * (u || 0)));
  return h('div', { class: 'progress' }, h('div', { class: 'bar', style: `width:${pct.toFixed(1)}%` }),
    h('span', {}, `${pct.toFixed(0)}%`));
}

// ---- sign-in and routing ----------------------------------------------------

function signInView(message) {
  leaveView();
  $('#nav').hidden = true;
  $('#signout').hidden = true;
  $('#who').textContent = '';
  const form = $('#signin-tpl').content.firstElementChild.cloneNode(true);
  main.replaceChildren(form);
  const err = $('#signin-error', form);
  if (message) {
    err.textContent = message;
    err.hidden = false;
  }
  form.addEventListener('submit', async (e) => {
    e.preventDefault();
    const k = $('#key', form).value.trim();
    err.hidden = true;
    try {
      tenant = await api('/v1/tenant', k);
    } catch (x) {
      err.textContent = x.status === 401 ? `That key was not accepted: ${x.message}` :
        x.status === 0 ? 'The server cannot be reached.' : `Sign-in failed: ${x.message}`;
      err.hidden = false;
      return;
    }
    sessionStorage.setItem(KEY_STORE, k);
    route();
  });
  $('#key', form).focus();
}

function signOut(message) {
  sessionStorage.removeItem(KEY_STORE);
  tenant = null;
  signInView(message);
}

async function route() {
  if (!key()) {
    signInView();
    return;
  }
  if (!tenant) {
    try {
      tenant = await api('/v1/tenant');
    } catch (e) {
      if (e.status === 401) {
        signOut('Your key is no longer accepted. Sign in again.');
        return;
      }
      setBanner('Server unreachable; retrying in 5 s.');
      setTimeout(route, 5000);
      return;
    }
  }
  $('#nav').hidden = false;
  $('#signout').hidden = false;
  $('#who').textContent = tenant.name;
  leaveView();
  const [path, query] = (location.hash.slice(1) || '/jobs').split('?');
  const params = new URLSearchParams(query || '');
  const parts = path.split('/').filter(Boolean);
  const view = parts[0] || 'jobs';
  for (const a of document.querySelectorAll('#nav a')) a.classList.toggle('on', a.dataset.view === view);
  if (view === 'jobs' && parts[1]) current = jobView(parts[1]);
  else if (view === 'sweeps' && parts[1]) current = sweepView(parts[1]);
  else if (view === 'sweeps') current = sweepsView();
  else if (view === 'cluster') current = clusterView();
  else current = jobsView(params);
  window.scrollTo(0, 0);
}

$('#signout').addEventListener('click', () => signOut());
window.addEventListener('hashchange', route);
let resizeTimer = null;
window.addEventListener('resize', () => {
  clearTimeout(resizeTimer);
  resizeTimer = setTimeout(() => current && current.charts.forEach((c) => c.resize()), 150);
});
route();

// The fusebox dashboard: a few views over the public REST API (docs/api.md),
// routed by the URL hash.  Each view polls only what it shows, one request
// at a time, asks for new metric points only (since_step), backs off on
// errors and says when the server cannot be reached.  Charts are uPlot,
// served by fuseboxd from the build; without it the tables still work.

import {
  $, COLORS, Chart, Series, api, fmt, fmtBytes, fmtMs, fmtShare, fmtTime, h, hooks, key, kv, main,
  makeView, metricOf, progress, put, setBanner, short, stateBadge, sweepLabel, KEY_STORE,
} from './lib.js';
import { cancelButton, submitView } from './actions.js';
import { compareView, sweepView } from './sweep.js';

// ---- views ------------------------------------------------------------------

let current = null; // {stop()} of the view on screen
let tenant = null;
let sweepNames = new Map();

function leaveView() {
  if (current) current.stop();
  current = null;
  setBanner('');
}

async function loadSweepNames() {
  const r = await api('/v1/sweeps?limit=200');
  sweepNames = new Map(r.sweeps.map((s) => [s.id, s]));
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
          'Val acc.', 'Samples/s (job)', 'Samples/s (array)', 'Slowdown'].map((c) => h('th', {}, c)))),
        body))));

  v.poll(async () => {
    const sweeps = await loadSweepNames();
    if (sweepSel.options.length !== sweeps.length + 1) {
      sweepSel.replaceChildren(h('option', { value: '' }, 'any sweep'),
        sweeps.map((s) => h('option', { value: s.id, selected: s.id === sweep }, sweepLabel(s))));
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
    const listed = new Map();
    for (const j of r.jobs) if (j.group_id) listed.set(j.group_id, (listed.get(j.group_id) || 0) + 1);
    body.replaceChildren(...r.jobs.map((j) => h('tr', { 'data-job': j.id },
      h('td', {}, h('a', { href: `#/jobs/${j.id}` }, j.name)),
      h('td', {}, stateBadge(j.state),
        j.queue ? h('div', { class: 'muted small' }, j.queue.reason,
          j.queue.position ? ` (#${j.queue.position})` : '') : null),
      // GET /v1/jobs lists the caller's own jobs only, so their tenant is the one signed in
      h('td', { class: 'tenant' }, tenant ? tenant.name : '—'),
      h('td', {}, j.sweep_id ? h('a', { href: `#/sweeps/${j.sweep_id}`, title: j.sweep_id },
        sweepNames.has(j.sweep_id) ? `${sweepNames.get(j.sweep_id).name} · ${short(j.sweep_id)}` :
          short(j.sweep_id)) : '—'),
      h('td', { class: 'array' }, arrayCell(j.group_id, arrays.get(j.group_id))),
      h('td', {}, progress(j.step, j.steps)),
      h('td', { class: 'num' }, fmt(metricOf(j, 'loss'))),
      h('td', { class: 'num val-acc' }, fmt(metricOf(j, 'val_accuracy'))),
      throughput(j, arrays.get(j.group_id), listed.get(j.group_id)),
      h('td', { class: 'num slowdown' }, fmt(j.slowdown, 3)))));
    if (!r.jobs.length)
      body.append(h('tr', {}, h('td', { colspan: 11, class: 'muted' }, 'No jobs yet.')));
  });
  return v;
}

// A job's throughput and its array's, apart.  A job's samples_per_s is its
// array's (samples x members per second, docs/jobspec.md#metrics), and the
// members of an array share one batch size (it is in the fusion key), so a
// member trains the array's rate over its member count: the array's size from
// GET /v1/cluster while it trains, else the members of it this list shows.
function throughput(j, a, listed) {
  const total = metricOf(j, 'samples_per_s');
  const n = a ? a.members : listed || 1;
  const why = total === null ? null : a ? `the array's ${fmt(total)} samples/s over its ${n} members` :
    `the array's ${fmt(total)} samples/s over the ${n} of its members listed here`;
  return [h('td', { class: 'num sps-job', title: why }, total === null ? '—' : fmt(total / n)),
    h('td', { class: 'num sps-array' }, fmt(total))];
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
  const time = new Chart(charts, 'Step time', [
    { label: 'idle', color: '#9ca3af', fill: '#e5e7eb' },
    { label: 'I/O wait', color: '#d97706', fill: '#fde68a' },
    { label: 'comm', color: '#7c3aed', fill: '#ddd6fe' },
    { label: 'compute', color: '#2563eb', fill: '#bfdbfe' }], {
    id: 'breakdown', unit: fmtMs, value: (si, i) => (raw[si - 1] ? raw[si - 1][i] : null) });
  v.charts.push(loss, acc, slow, time);

  const series = new Series(id, null);
  let job = null;
  let cancel = null;
  const poller = v.poll(async () => {
    job = await api(`/v1/jobs/${id}`);
    const live = ['queued', 'scheduled', 'running'].includes(job.state);
    if (live && !cancel) {
      cancel = cancelButton({ id: 'cancel-job', label: 'Cancel job', title: `Cancel ${job.name}?`,
        text: 'The job stops where it is and leaves its array; its checkpoints stay. ' +
          'This cannot be undone.', path: `/v1/jobs/${id}/cancel`, done: () => poller.now() });
    }
    // a job of no sweep says so: its sweep_id and trial_index are null
    if (job.sweep_id && !sweepNames.has(job.sweep_id)) await loadSweepNames();
    const sw = job.sweep_id ? sweepNames.get(job.sweep_id) : null;
    put(head, h('h2', {}, job.name), stateBadge(job.state),
      h('span', { class: 'spacer' }), live && cancel ? cancel : null,
      job.sweep_id ? h('a', { href: `#/sweeps/${job.sweep_id}`, id: 'job-sweep' },
        `trial ${job.trial_index ?? '?'} of sweep ${sw ? sw.name : short(job.sweep_id)}`) : null);
    const lm = job.latest_metrics || {};
    const q = job.queue;
    facts.replaceChildren(kv([
      ['id', h('code', {}, job.id)],
      ['sweep', job.sweep_id ? h('a', { href: `#/sweeps/${job.sweep_id}` }, sw ? sw.name : short(job.sweep_id)) :
        'none (a job of its own)'],
      ['queue', q ? `${q.reason || 'queued'}${q.position ? ` (#${q.position})` : ''}` : '—'],
      ['progress', progress(job.step, job.steps)],
      ['loss', fmt(lm.loss)],
      ['samples/s (array)', fmt(lm.samples_per_s)],
      ['slowdown', h('span', { id: 'job-slowdown' }, fmt(job.slowdown, 3))],
      ['array', job.group_id ? short(job.group_id) : 'not placed'],
      ['dataset', job.dataset],
      ['restarts', `${job.restarts} / ${job.max_restarts}`],
      ['submitted', fmtTime(job.created_at)],
      ['error', job.error || '—'],
    ]));
  });
  v.poll(async () => {
    if (!(await series.pull()) && series.points.length > 0) return;
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
      ['Sweep', 'Id', 'State', 'Trials', 'Jobs by state', 'Metric', 'Created'].map((c) => h('th', {}, c)))),
    body)));
  v.poll(async () => {
    const sweeps = await loadSweepNames();
    // sweeps may share a name: the short id and the creation time tell them apart
    body.replaceChildren(...sweeps.map((s) => h('tr', { 'data-sweep': s.id },
      h('td', {}, h('a', { href: `#/sweeps/${s.id}` }, s.name)),
      h('td', {}, h('code', { title: s.id }, short(s.id))), h('td', {}, stateBadge(s.state)),
      h('td', { class: 'num' }, s.n_trials),
      h('td', {}, Object.entries(s.jobs_by_state || {}).map(([k, n]) => `${k} ${n}`).join(', ')),
      h('td', {}, `${s.metric.name} (${s.metric.mode})`), h('td', {}, fmtTime(s.created_at)))));
    if (!sweeps.length) body.append(h('tr', {}, h('td', { colspan: 7, class: 'muted' }, 'No sweeps yet.')));
  }, 5000);
  return v;
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
  return h('span', { class: 'step-time', title: parts.map(([k, ms]) => `${k} ${fmtMs(ms)}`).join(', ') },
    fmtMs(total), h('span', { class: 'muted small' },
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
  else if (view === 'sweeps' && parts[1] && parts[2] === 'compare') current = compareView(parts[1], params);
  else if (view === 'sweeps' && parts[1]) current = sweepView(parts[1]);
  else if (view === 'submit') current = submitView(parts[1] === 'sweep' ? 'sweep' : 'job');
  else if (view === 'sweeps') current = sweepsView();
  else if (view === 'cluster') current = clusterView();
  else current = jobsView(params);
  window.scrollTo(0, 0);
}

hooks.signOut = signOut;
$('#signout').addEventListener('click', () => signOut());
window.addEventListener('hashchange', route);
let resizeTimer = null;
window.addEventListener('resize', () => {
  clearTimeout(resizeTimer);
  resizeTimer = setTimeout(() => current && current.charts.forEach((c) => c.resize()), 150);
});
route();

// The views of one sweep: its trials (sortable, the best one as the API
// names it, ASHA rungs), every trial's curves, the sweep's metric against
// each swept parameter (scatter), parallel coordinates over the parameters
// coloured by the metric, and a compare view overlaying 2 to 4 trials.

import { cancelButton } from './actions.js';
import {
  Chart, Series, api, colorOf, fmt, fmtTime, h, main, makeView, metricOf, overlay, short,
  put, stateBadge, svg,
} from './lib.js';

const FINAL = new Set(['completed', 'failed', 'cancelled']);
const MAX_COMPARE = 4;

// ---- scales ---------------------------------------------------------------

// A scale for the values of one parameter or metric: 'category' when some are
// not numbers, 'log' when all are positive and span more than a decade (a
// learning rate), else 'linear'.  at(v) maps a value to [0, 1]; ticks are
// [value, label] pairs.
export function scaleOf(values) {
  const vals = values.filter((v) => v !== null && v !== undefined);
  if (vals.some((v) => typeof v !== 'number')) {
    const cats = [...new Set(vals.map(String))].sort();
    const at = (v) => (cats.length > 1 ? cats.indexOf(String(v)) / (cats.length - 1) : 0.5);
    return { kind: 'category', at, ticks: cats.map((c) => [c, c]) };
  }
  if (!vals.length) return { kind: 'linear', at: () => 0.5, ticks: [] };
  const lo = Math.min(...vals);
  const hi = Math.max(...vals);
  if (lo > 0 && hi / lo > 10) {
    const l0 = Math.log10(lo);
    const l1 = Math.log10(hi);
    const ticks = [];
    for (let e = Math.ceil(l0 - 1e-9); e <= Math.floor(l1 + 1e-9); e++) ticks.push([10 ** e, fmt(10 ** e)]);
    return { kind: 'log', at: (v) => (Math.log10(v) - l0) / (l1 - l0), ticks };
  }
  if (hi === lo) {
    return { kind: 'linear', at: () => 0.5, ticks: [[lo, fmt(lo)]] };
  }
  const step = niceStep((hi - lo) / 4);
  const ticks = [];
  for (let t = Math.ceil(lo / step) * step; t <= hi + step * 1e-9; t += step) ticks.push([t, fmt(Number(t.toPrecision(12)))]);
  return { kind: 'linear', at: (v) => (v - lo) / (hi - lo), ticks };
}

function niceStep(raw) {
  const p = 10 ** Math.floor(Math.log10(raw));
  const m = raw / p;
  return (m <= 1 ? 1 : m <= 2 ? 2 : m <= 5 ? 5 : 10) * p;
}

// Where a trial's metric lies between the worst (0) and the best (1) of the
// sweep, by its mode, and a color for it: red the worst, blue the best.
function goodness(values, mode) {
  const vals = values.filter((v) => typeof v === 'number');
  const lo = Math.min(...vals);
  const hi = Math.max(...vals);
  return (v) => {
    if (typeof v !== 'number') return null;
    if (hi === lo) return 1;
    const t = (v - lo) / (hi - lo);
    return mode === 'min' ? 1 - t : t;
  };
}
const heat = (g) => (g === null ? '#9ca3af' : `hsl(${Math.round(220 * g)}, 70%, 45%)`);

// ---- plots ------------------------------------------------------------------

// One scatter per swept parameter: x the trial's value of it, y the trial's
// best value of the sweep's metric (the API's `best`); the best trial ringed.
// Each svg says its parameter, x scale and point count (data-param,
// data-scale, data-points).
function scatters(box, trials, params, metric, bestIndex) {
  const W = 300;
  const H = 210;
  const m = { l: 56, r: 12, t: 10, b: 38 };
  const withY = trials.filter((t) => t.best);
  const ys = scaleOf(withY.map((t) => t.best.value));
  box.replaceChildren(...params.map((p) => {
    const xs = scaleOf(withY.map((t) => (t.params || {})[p]));
    const X = (v) => m.l + xs.at(v) * (W - m.l - m.r);
    const Y = (v) => H - m.b - ys.at(v) * (H - m.t - m.b);
    const pts = withY.filter((t) => (t.params || {})[p] !== undefined);
    return h('figure', { class: 'plot' }, svg('svg', { viewBox: `0 0 ${W} ${H}`, width: W, height: H,
      class: 'scatter', 'data-param': p, 'data-scale': xs.kind, 'data-points': String(pts.length) },
    svg('line', { x1: m.l, y1: H - m.b, x2: W - m.r, y2: H - m.b, class: 'axis' }),
    svg('line', { x1: m.l, y1: m.t, x2: m.l, y2: H - m.b, class: 'axis' }),
    xs.ticks.map(([v, label]) => svg('text', { x: X(v), y: H - m.b + 14, class: 'tick', 'text-anchor': 'middle' }, label)),
    ys.ticks.map(([v, label]) => svg('text', { x: m.l - 4, y: Y(v) + 4, class: 'tick', 'text-anchor': 'end' }, label)),
    svg('text', { x: (m.l + W - m.r) / 2, y: H - 4, class: 'label', 'text-anchor': 'middle' },
      `${p}${xs.kind === 'log' ? ' (log)' : ''}`),
    pts.map((t) => svg('circle', { cx: X(t.params[p]), cy: Y(t.best.value), r: t.index === bestIndex ? 6 : 4,
      class: t.index === bestIndex ? 'pt best' : 'pt', 'data-trial': t.index },
    svg('title', {}, `${t.name}: ${p} ${fmt(t.params[p])}, ${metric} ${fmt(t.best.value)}`)))),
    h('figcaption', { class: 'muted small' }, `best ${metric} by ${p}`));
  }));
  if (!params.length) box.replaceChildren(h('p', { class: 'muted' }, 'This sweep varies no parameter.'));
  else if (!withY.length) box.replaceChildren(h('p', { class: 'muted' }, `No trial has a ${metric} yet.`));
}

// Parallel coordinates: one vertical axis per swept parameter and one for the
// metric, one line per trial through its values, coloured by the metric (red
// the worst, blue the best; grey before a trial has one); the best trial on top.
function parallel(box, trials, params, metric, mode, bestIndex) {
  const axes = [...params.map((p) => ({ name: p, get: (t) => (t.params || {})[p] })),
    { name: metric, get: (t) => (t.best ? t.best.value : undefined) }];
  const W = Math.max(480, 150 * axes.length);
  const H = 260;
  const m = { l: 40, r: 60, t: 24, b: 28 };
  const scales = axes.map((a) => scaleOf(trials.map(a.get)));
  const xAt = (i) => m.l + (axes.length > 1 ? (i * (W - m.l - m.r)) / (axes.length - 1) : 0);
  const yAt = (i, v) => H - m.b - scales[i].at(v) * (H - m.t - m.b);
  const good = goodness(trials.map((t) => (t.best ? t.best.value : null)), mode);
  const drawn = trials.filter((t) => axes.every((a) => a.get(t) !== undefined && a.get(t) !== null));
  const order = [...drawn].sort((a, b) => (a.index === bestIndex) - (b.index === bestIndex));
  box.replaceChildren(svg('svg', { viewBox: `0 0 ${W} ${H}`, width: W, height: H, class: 'parcoords',
    'data-lines': String(drawn.length), 'data-axes': String(axes.length) },
  order.map((t) => svg('polyline', {
    points: axes.map((a, i) => `${xAt(i).toFixed(1)},${yAt(i, a.get(t)).toFixed(1)}`).join(' '),
    class: t.index === bestIndex ? 'line best' : 'line', stroke: heat(good(t.best ? t.best.value : null)),
    'data-trial': t.index }, svg('title', {}, `${t.name}: ${metric} ${fmt(t.best ? t.best.value : null)}`))),
  axes.map((a, i) => svg('g', { class: 'pc-axis', 'data-axis': a.name },
    svg('line', { x1: xAt(i), y1: m.t, x2: xAt(i), y2: H - m.b, class: 'axis' }),
    scales[i].ticks.map(([v, label]) => svg('text', { x: xAt(i) - 4, y: yAt(i, v) + 4, class: 'tick',
      'text-anchor': 'end' }, label)),
    svg('text', { x: xAt(i), y: 14, class: 'label', 'text-anchor': 'middle' },
      `${a.name}${scales[i].kind === 'log' ? ' (log)' : ''}`)))),
  h('p', { class: 'muted small' }, `Colour: best ${metric} of the trial, `,
    h('span', { style: `color:${heat(0)}` }, 'worst'), ' to ', h('span', { style: `color:${heat(1)}` }, 'best'),
    ` (${mode}); `, `${drawn.length} of ${trials.length} trials have a value yet.`));
}

// ---- the sweep view ---------------------------------------------------------

// The best trial as the API names it (best_trial: by the sweep's own metric
// and mode, the one ASHA ranks by), with its value, step and parameters.
function bestTrial(s) {
  const best = s.best_trial;
  const bt = best && s.trials.find((t) => t.index === best.index);
  if (!bt) return h('p', { class: 'muted best-trial' }, `No trial has a ${s.metric.name} yet.`);
  return h('p', { class: 'best-trial' }, 'Best trial by ', h('b', {}, s.metric.name),
    ` (${s.metric.mode}): `, h('a', { href: `#/jobs/${bt.job_id}`, 'data-trial': bt.index }, bt.name),
    ` — ${fmt(best.value)}${bt.best ? ` at step ${bt.best.step}` : ''}`,
    Object.keys(bt.params || {}).length ? h('span', { class: 'muted' }, ` (${Object.entries(bt.params)
      .map(([k, x]) => `${k} ${fmt(x)}`).join(', ')})`) : null);
}

// The sweep's metric ranks its trials; its training loss is drawn, and the
// metric's own curve where it is another series.
function curveFields(metric) {
  return [...new Set(['loss', metric])];
}

export function sweepView(id) {
  const v = makeView();
  const head = h('div', { class: 'toolbar' }, h('h2', {}, 'Sweep'));
  const sub = h('div', { class: 'muted small', id: 'sweep-id' });
  const bestBox = h('div', { id: 'best' });
  const thead = h('thead');
  const body = h('tbody');
  const charts = h('div', { class: 'charts' });
  const scatterBox = h('div', { id: 'scatter', class: 'plots' });
  const pcBox = h('div', { id: 'parcoords', class: 'scroll' });
  const picked = new Set(); // trial indices chosen to compare
  const compare = h('a', { id: 'compare', class: 'button disabled', href: '#', 'aria-disabled': 'true' },
    'Compare chosen trials');
  const actions = h('span', { class: 'actions' });
  main.replaceChildren(h('section', { class: 'card' }, head, sub, bestBox,
    h('div', { class: 'toolbar' }, h('span', { class: 'muted small', id: 'compare-hint' },
      `Tick 2 to ${MAX_COMPARE} trials to compare their curves.`), compare),
    h('div', { class: 'scroll' }, h('table', { id: 'trials', class: 'sortable' }, thead, body))),
  h('section', { class: 'card' }, h('h2', {}, 'Curves of every trial'), charts),
  h('section', { class: 'card' }, h('h2', {}, 'Metric by parameter'), scatterBox),
  h('section', { class: 'card' }, h('h2', {}, 'Parallel coordinates'), pcBox));
  let sort = { key: 'index', dir: 1 };
  let rows = [];
  let best = null;
  let paramNames = [];
  let rule = null; // the sweep's early-stopping rule, null without one
  let curves = null; // {metric, charts: [[field, Chart]]}
  const series = new Map();
  const settled = new Set(); // trials pulled after they ended: their series is complete

  const updateCompare = () => {
    const n = picked.size;
    const ok = n >= 2 && n <= MAX_COMPARE;
    compare.classList.toggle('disabled', !ok);
    compare.setAttribute('aria-disabled', String(!ok));
    compare.href = ok ? `#/sweeps/${id}/compare?trials=${[...picked].sort((a, b) => a - b).join(',')}` : '#';
    for (const box of body.querySelectorAll('input.pick')) box.disabled = !box.checked && n >= MAX_COMPARE;
  };
  compare.addEventListener('click', (e) => {
    if (compare.classList.contains('disabled')) e.preventDefault();
  });
  const columns = () => [
    ['pick', ''], ['index', '#'], ['name', 'Trial'], ['state', 'State'], ['step', 'Step'],
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
      onclick: k === 'pick' ? null : () => {
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
      if (k === 'pick') {
        return h('td', {}, h('input', { type: 'checkbox', class: 'pick', 'aria-label': `compare ${r.name}`,
          checked: picked.has(r.index), onchange: (e) => {
            if (e.target.checked) picked.add(r.index);
            else picked.delete(r.index);
            updateCompare();
          } }));
      }
      if (k === 'name') return h('td', {}, h('a', { href: `#/jobs/${r.job_id}` }, r.name));
      if (k === 'state') return h('td', { class: 'state' }, stateBadge(r.state), earlyStopped(r));
      if (k === 'rungs') return h('td', { class: 'rungs' }, rungCells(r.rungs, rule));
      return h('td', { class: 'num' }, fmt(val));
    }))));
    updateCompare();
  };

  let cancel = null;
  const poller = v.poll(async () => {
    const [s, jobs] = await Promise.all([api(`/v1/sweeps/${id}`),
      api(`/v1/jobs?sweep_id=${id}&limit=200`)]);
    best = s.best_trial;
    const es = s.spec && s.spec.early_stopping;
    rule = es && typeof es === 'object' ? es : null;
    if (s.state === 'active' && !cancel) {
      cancel = cancelButton({ id: 'cancel-sweep', label: 'Cancel sweep', title: `Cancel ${s.name}?`,
        text: `The sweep and every trial of it that has not finished are cancelled; ` +
          `finished trials keep their results. This cannot be undone.`,
        path: `/v1/sweeps/${id}/cancel`, done: () => poller.now() });
    }
    put(actions, s.state === 'active' ? cancel : null);
    put(head, h('h2', {}, s.name), stateBadge(s.state),
      h('span', { class: 'muted' }, `${s.n_trials} trials, ranked by ${s.metric.name} (${s.metric.mode})`,
        rule ? `; ASHA early stopping on ${rule.metric} (${rule.mode}), rungs at steps ` +
          `${rungSteps(rule).join(', ')}` : ''),
      h('span', { class: 'spacer' }), actions,
      h('a', { href: `#/jobs?sweep=${id}` }, 'jobs'));
    sub.replaceChildren(h('code', { title: s.id }, short(s.id)), ` · created ${fmtTime(s.created_at)}`);
    bestBox.replaceChildren(bestTrial(s));
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
    scatters(scatterBox, s.trials, paramNames, s.metric.name, best ? best.index : null);
    parallel(pcBox, s.trials, paramNames, s.metric.name, s.metric.mode, best ? best.index : null);

    // every trial's curves, new points only; a trial that ended is pulled once more, then left
    const fields = curveFields(s.metric.name);
    for (const t of s.trials) if (!series.has(t.job_id)) series.set(t.job_id, new Series(t.job_id, fields));
    for (const t of s.trials) {
      if (settled.has(t.job_id)) continue;
      await series.get(t.job_id).pull();
      if (FINAL.has(t.state)) settled.add(t.job_id);
    }
    if (!curves) {
      const label = (f) => (f === 'loss' ? 'Training loss by trial' : `${f} by trial`);
      curves = fields.map((f) => {
        const c = new Chart(charts, label(f), s.trials.map((t) => ({ label: t.name })),
          { id: f === 'loss' ? 'sweep-loss' : 'sweep-metric', height: 260 });
        v.charts.push(c);
        return [f, c];
      });
    }
    const list = s.trials.map((t) => series.get(t.job_id));
    for (const [f, c] of curves) c.set(overlay(list, f));
  }, 3000);
  return v;
}

// ---- compare ------------------------------------------------------------------

const COMPARED = [['loss', 'Training loss'], ['val_loss', 'Validation loss'],
  ['accuracy', 'Training accuracy'], ['val_accuracy', 'Validation accuracy']];

// 2 to 4 trials of a sweep (by index, ?trials=0,3) side by side: their
// parameters and best values, and each curve with all of them overlaid.
export function compareView(id, params) {
  const v = makeView();
  const want = (params.get('trials') || '').split(',').filter((x) => /^\d+$/.test(x)).map(Number);
  const head = h('div', { class: 'toolbar' }, h('h2', {}, 'Compare trials'));
  const facts = h('div', { id: 'compare-facts' });
  const charts = h('div', { class: 'charts' });
  main.replaceChildren(h('section', { class: 'card' }, head, facts), h('section', { class: 'card' }, charts));
  if (want.length < 2 || want.length > MAX_COMPARE) {
    facts.replaceChildren(h('p', { class: 'error' }, `Choose 2 to ${MAX_COMPARE} trials to compare ` +
      `(got ${want.length}).`), h('a', { href: `#/sweeps/${id}` }, 'back to the sweep'));
    return v;
  }
  let made = null;
  const series = new Map();
  v.poll(async () => {
    const s = await api(`/v1/sweeps/${id}`);
    const chosen = want.map((i) => s.trials.find((t) => t.index === i)).filter(Boolean);
    if (chosen.length !== want.length) {
      throw new Error(`this sweep has trials 0 to ${s.n_trials - 1}; asked for ${want.join(', ')}`);
    }
    put(head, h('h2', {}, `Compare trials of ${s.name}`), h('span', { class: 'spacer' }),
      h('a', { href: `#/sweeps/${id}` }, 'back to the sweep'));
    const pnames = [...new Set(chosen.flatMap((t) => Object.keys(t.params || {})))].sort();
    facts.replaceChildren(h('table', { id: 'compared' }, h('thead', {}, h('tr', {},
      ['', 'Trial', 'State', 'Step', ...pnames, `Best ${s.metric.name}`].map((c) => h('th', {}, c)))),
    h('tbody', {}, chosen.map((t, i) => h('tr', { 'data-trial': t.index,
      class: s.best_trial && s.best_trial.index === t.index ? 'best' : null },
    h('td', {}, h('span', { class: 'swatch', style: `background:${colorOf(i)}` })),
    h('td', {}, h('a', { href: `#/jobs/${t.job_id}` }, t.name)), h('td', {}, stateBadge(t.state)),
    h('td', { class: 'num' }, t.step), pnames.map((p) => h('td', { class: 'num' }, fmt((t.params || {})[p]))),
    h('td', { class: 'num' }, fmt(t.best ? t.best.value : null)))))));
    for (const t of chosen) {
      if (!series.has(t.job_id)) series.set(t.job_id, new Series(t.job_id, ['loss', 'val_loss', 'accuracy', 'val_accuracy']));
    }
    for (const t of chosen) await series.get(t.job_id).pull();
    if (!made) {
      made = COMPARED.map(([f, title]) => {
        const c = new Chart(charts, title, chosen.map((t) => ({ label: t.name })), { id: `compare-${f}` });
        v.charts.push(c);
        return [f, c];
      });
    }
    const list = chosen.map((t) => series.get(t.job_id));
    for (const [f, c] of made) c.set(overlay(list, f));
  }, 3000);
  return v;
}

// ---- ASHA ---------------------------------------------------------------------

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


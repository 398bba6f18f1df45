// What the dashboard changes, with the signed-in key: cancelling a job or a
// sweep (each behind a confirmation dialog) and submitting a job or a sweep
// spec (pasted or read from a .json file), with the server's validation
// error shown next to the spec, naming its field.

import { $, ApiError, apiSend, h, main, makeView, put } from './lib.js';

// Asks before something that cannot be undone, in a modal <dialog> (so a
// page can be driven and read like any other, unlike window.confirm).
// Resolves true when the person confirmed, false when they kept things as
// they are (the "Keep" button, Escape or closing the dialog).
export function confirmAction(title, text, confirmLabel) {
  const dlg = h('dialog', { id: 'confirm', class: 'confirm', 'aria-labelledby': 'confirm-title' },
    h('form', { method: 'dialog' },
      h('h2', { id: 'confirm-title' }, title),
      h('p', {}, text),
      h('div', { class: 'toolbar' }, h('span', { class: 'spacer' }),
        h('button', { id: 'confirm-no', value: 'no', class: 'secondary' }, 'Keep'),
        h('button', { id: 'confirm-yes', value: 'yes', class: 'danger' }, confirmLabel))));
  document.body.append(dlg);
  return new Promise((resolve) => {
    dlg.addEventListener('close', () => {
      dlg.remove();
      resolve(dlg.returnValue === 'yes');
    });
    dlg.showModal();
    $('#confirm-no', dlg).focus();
  });
}

// A button that cancels what POST path cancels, after asking; the outcome
// (or the server's refusal) is written into the button's message element and
// done() runs after a cancel the server accepted (a poll, to show the new state).
export function cancelButton({ id, label, title, text, path, done }) {
  const msg = h('span', { class: 'action-msg', id: `${id}-msg`, role: 'status' });
  const btn = h('button', { id, class: 'danger', type: 'button', onclick: async () => {
    if (!(await confirmAction(title, text, label))) return;
    btn.disabled = true;
    msg.className = 'action-msg muted';
    msg.textContent = 'cancelling…';
    try {
      await apiSend('POST', path);
      msg.textContent = 'cancelled';
      await done();
    } catch (e) {
      msg.className = 'action-msg error';
      msg.textContent = `Not cancelled: ${e.message}`;
      btn.disabled = false;
    }
  } }, label);
  return h('span', { class: 'action' }, btn, msg);
}

const EXAMPLES = {
  job: {
    name: 'mnist-mlp', dataset: 'mnist', steps: 2000, batch_size: 64, eval_every: 500,
    model: { input: [1, 28, 28], layers: [{ type: 'flatten' }, { type: 'linear', out: 128 },
      { type: 'relu' }, { type: 'linear', out: 10 }] },
    optimizer: { type: 'adam', lr: 0.001 },
  },
  sweep: {
    name: 'lr-search',
    base: { dataset: 'mnist', steps: 2000, batch_size: 64, eval_every: 500,
      model: { input: [1, 28, 28], layers: [{ type: 'flatten' }, { type: 'linear', out: 128 },
        { type: 'relu' }, { type: 'linear', out: 10 }] },
      optimizer: { type: 'adam', lr: 0.001 } },
    search: { type: 'random', count: 8, seed: 1,
      params: { 'optimizer.lr': { distribution: 'log_uniform', low: 0.0001, high: 0.1 } } },
  },
};

// Where each JSON path of text is written: path ("base.optimizer.lr",
// "model.layers.2.out") -> [start, end) of its
// key, or of the value for an array element.  A small scanner of its own, so
// that the offsets are the text's; it stops at the first thing that is not
// JSON (then what it saw so far is returned).
function jsonPaths(text) {
  const at = new Map();
  let i = 0;
  const ws = () => {
    while (i < text.length && /\s/.test(text[i])) i++;
  };
  const string = () => {
    const start = i++;
    while (i < text.length && text[i] !== '"') i += text[i] === '\\' ? 2 : 1;
    i++;
    return [start, i];
  };
  const join = (path, k) => (path === '' ? String(k) : `${path}.${k}`);
  const value = (path) => {
    ws();
    const c = text[i];
    if (c === '{') {
      i++;
      for (;;) {
        ws();
        if (text[i] !== '"') break;
        const [s, e] = string();
        const name = JSON.parse(text.slice(s, e));
        at.set(join(path, name), [s, e]);
        ws();
        if (text[i++] !== ':') throw new Error('no colon');
        value(join(path, name));
        ws();
        if (text[i] !== ',') break;
        i++;
      }
      if (text[i++] !== '}') throw new Error('no close');
    } else if (c === '[') {
      i++;
      for (let k = 0; ; k++) {
        ws();
        if (text[i] === ']') break;
        const s = i;
        value(join(path, k));
        at.set(join(path, k), [s, i]);
        ws();
        if (text[i] !== ',') break;
        i++;
      }
      if (text[i++] !== ']') throw new Error('no close');
    } else if (c === '"') {
      string();
    } else {
      const s = i;
      while (i < text.length && !/[\s,\]}]/.test(text[i])) i++;
      if (i === s) throw new Error('no value');
    }
  };
  try {
    value('');
  } catch {
    // what was found before the text stopped being JSON stays
  }
  return at;
}

// Where a field the server named ("model.layers[2].out") is written in the
// pasted text: the range of
// its key (an array element: of its value), or of the nearest enclosing field
// the text has (a missing field: the object that lacks it); null without one.
export function fieldRange(text, field) {
  if (!field) return null;
  const at = jsonPaths(text);
  for (let parts = field.replace(/\[(\d+)\]/g, '.$1').split('.'); parts.length; parts.pop()) {
    const r = at.get(parts.join('.'));
    if (r) return r;
  }
  return null;
}

// The line and column of offset i of text, counted from 1.
function lineCol(text, i) {
  const before = text.slice(0, i).split('\n');
  return [before.length, before[before.length - 1].length + 1];
}

// The submit view: one kind ('job' or 'sweep'), a textarea and a file input;
// on success the page goes to what was created; otherwise the error says
// what is wrong and where, the field's name selected in the text.
export function submitView(kind) {
  const v = makeView();
  const what = kind === 'sweep' ? 'sweep' : 'job';
  const route = what === 'sweep' ? '/v1/sweeps' : '/v1/jobs';
  const text = h('textarea', { id: 'spec', rows: 22, spellcheck: 'false', 'aria-label': `${what} spec`,
    placeholder: JSON.stringify(EXAMPLES[what], null, 2) });
  const file = h('input', { id: 'spec-file', type: 'file', accept: '.json,application/json' });
  const err = h('div', { id: 'spec-error', class: 'field-error', role: 'alert', hidden: true });
  const submit = h('button', { id: 'spec-submit', type: 'submit' }, `Submit ${what}`);
  // one Idempotency-Key per text: a second click on the same spec does not submit it twice
  let idem = null;
  text.addEventListener('input', () => {
    idem = null;
  });
  const showError = (message, field, range) => {
    put(err, field ? h('code', { class: 'field' }, field) : null, field ? ': ' : null,
      h('span', { class: 'message' }, message),
      range ? h('span', { class: 'muted' }, ` (line ${lineCol(text.value, range[0]).join(', column ')})`) : null);
    err.dataset.field = field || '';
    err.hidden = false;
    text.classList.add('invalid');
    if (range) {
      text.focus();
      text.setSelectionRange(range[0], range[1]);
    }
  };
  file.addEventListener('change', async () => {
    const f = file.files && file.files[0];
    if (!f) return;
    text.value = await f.text();
    idem = null;
    err.hidden = true;
  });
  const form = h('form', { id: 'submit-form', class: 'card submit', onsubmit: async (e) => {
    e.preventDefault();
    err.hidden = true;
    text.classList.remove('invalid');
    let spec;
    try {
      spec = JSON.parse(text.value);
    } catch (x) {
      showError(`not valid JSON: ${x.message}; nothing was sent`, null, null);
      return;
    }
    if (!idem) idem = crypto.randomUUID();
    submit.disabled = true;
    try {
      const made = await apiSend('POST', route, JSON.stringify(spec), { 'Idempotency-Key': idem });
      location.hash = `#/${what === 'sweep' ? 'sweeps' : 'jobs'}/${made.id}`;
    } catch (x) {
      const field = x instanceof ApiError ? x.field : null;
      showError(`${x.message}${x.code && x.status ? ` (${x.status} ${x.code})` : ''}`, field,
        fieldRange(text.value, field));
    } finally {
      submit.disabled = false;
    }
  } },
  h('div', { class: 'toolbar' }, h('h2', {}, `Submit a ${what}`),
    h('a', { href: '#/submit/job', class: what === 'job' ? 'on' : null }, 'job'),
    h('a', { href: '#/submit/sweep', class: what === 'sweep' ? 'on' : null }, 'sweep'),
    h('span', { class: 'spacer' }),
    h('a', { href: '#', id: 'spec-example', onclick: (e) => {
      e.preventDefault();
      text.value = JSON.stringify(EXAMPLES[what], null, 2);
      idem = null;
    } }, 'fill in an example')),
  h('p', { class: 'muted' }, `Paste the ${what} spec as JSON (docs/`,
    what === 'sweep' ? 'api.md, "Sweeps"' : 'jobspec.md', ') or read it from a file: ', file),
  text, err, h('div', { class: 'toolbar' }, submit));
  main.replaceChildren(form);
  return v;
}

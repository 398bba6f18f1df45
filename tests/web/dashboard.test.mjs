// The dashboard in a real browser: headless Chromium (Debian's, driven by
// playwright-core) against the real fuseboxd on loopback, on a fresh
// database of the PostgreSQL of FUSEBOX_TEST_DATABASE_URL, with a real
// fusebox-worker (one CPU device) training a small shard dataset that
// fusebox-data imports from CSV.  Two tenants' arrays share the worker's
// device, so the cluster view has time shares to show and a tenant to hide.
// Screenshots go to FB_BINARY_DIR/tests/web/artifacts/.  Exit 0 when every
// check passed, 1 when some failed, 77 (skipped) without a database,
// Chromium or `npm ci` in tests/web (1 under FUSEBOX_TEST_STRICT=1).
import { execFileSync, spawn } from 'node:child_process';
import crypto from 'node:crypto';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { actionChecks } from './actions.mjs';

const here = path.dirname(fileURLToPath(import.meta.url));
// A missing prerequisite skips the test, except under FUSEBOX_TEST_STRICT=1
// (scripts/test, which installs all of them): there it fails (tests/check.h).
const skip = (why) => {
  if (process.env.FUSEBOX_TEST_STRICT === '1') {
    console.log(`FAILED: a prerequisite is missing under FUSEBOX_TEST_STRICT=1: ${why}`);
    process.exit(1);
  }
  console.log(`SKIPPED: ${why}`);
  process.exit(77);
};

const baseUrl = process.env.FUSEBOX_TEST_DATABASE_URL;
if (!baseUrl) skip('FUSEBOX_TEST_DATABASE_URL is not set (scripts/test sets it)');
const chromiumPath = process.env.FUSEBOX_CHROMIUM || '/usr/bin/chromium';
if (!fs.existsSync(chromiumPath)) skip(`no Chromium at ${chromiumPath} (apt-get install chromium)`);
let chromium;
try {
  ({ chromium } = await import(path.join(here, 'node_modules/playwright-core/index.mjs')));
} catch {
  skip('playwright-core is missing: run `npm ci` in tests/web');
}
const binDir = process.env.FB_BINARY_DIR;
if (!binDir) skip('FB_BINARY_DIR is not set; run the test through ctest');
if (!fs.existsSync(path.join(binDir, 'web/www/uPlot.esm.js')))
  skip('the build has no uPlot: run `npm ci` in web/ and build again');
const exe = {
  server: path.join(binDir, 'server/fuseboxd'),
  worker: path.join(binDir, 'workers/fusebox-worker'),
  data: path.join(binDir, 'workers/data/fusebox-data'),
};
for (const [what, file] of Object.entries(exe)) {
  if (!fs.existsSync(file)) {
    console.log(`FAIL setup: ${file} is missing; build the ${what} first`);
    process.exit(1);
  }
}

const artifacts = path.join(binDir, 'tests/web/artifacts');
fs.mkdirSync(artifacts, { recursive: true });

// ---- results ---------------------------------------------------------------

let passed = 0;
let failed = 0;
let onFail = null; // saves what the page shows when a check fails
async function check(name, fn) {
  const t0 = Date.now();
  try {
    await fn();
    passed++;
    console.log(`ok   ${name} (${Date.now() - t0} ms)`);
  } catch (e) {
    failed++;
    console.log(`FAIL ${name}: ${e.stack || e}`);
    if (onFail) await onFail(`failed-${failed}`).catch(() => {});
  }
}
function expect(cond, what) {
  if (!cond) throw new Error(what);
}
async function until(what, fn, ms = 10000) {
  const t0 = Date.now();
  let last;
  for (;;) {
    try {
      last = await fn();
      if (last) return last;
    } catch (e) {
      last = e;
    }
    if (Date.now() - t0 > ms) throw new Error(`timed out waiting for ${what} (last: ${last})`);
    await new Promise((r) => setTimeout(r, 100));
  }
}

// ---- database, dataset, server and worker -----------------------------------

const dbName = `fbw_${process.pid}_${crypto.randomBytes(4).toString('hex')}`;
const dbUrl = new URL(baseUrl);
dbUrl.pathname = `/${dbName}`;
const psql = (url, sql) =>
  execFileSync('psql', [url, '-v', 'ON_ERROR_STOP=1', '-qAt', '-c', sql], { encoding: 'utf8' }).trim();

const root = fs.mkdtempSync(path.join(os.tmpdir(), 'fbw-'));
const dataDir = path.join(root, 'server');
const datasets = path.join(root, 'datasets');
let server = null;
let worker = null;
let port = 0;
let browser = null;

// A learnable 4-class problem over F features (the label is the argmax of a
// fixed linear map of x), imported as the shard dataset "synth" with a train
// and a test split (validation holds out a tenth of train), so accuracy well above chance
// on held-out records means real training.
const F = 128;
function importSynth() {
  let s = 12345;
  const rnd = () => {
    s = (Math.imul(s, 1103515245) + 12345) >>> 0;
    return (s / 2 ** 32) * 2 - 1;
  };
  const map = Array.from({ length: F }, () => [rnd(), rnd(), rnd(), rnd()]);
  fs.mkdirSync(datasets);
  for (const [split, n] of [['train', 2048], ['test', 512]]) {
    const lines = [`${Array.from({ length: F }, (_, i) => `x${i}`).join(',')},label`];
    for (let i = 0; i < n; i++) {
      const x = Array.from({ length: F }, rnd);
      const score = [0, 1, 2, 3].map((k) => x.reduce((a, v, f) => a + v * map[f][k], 0));
      lines.push(`${x.map((v) => v.toFixed(4)).join(',')},${score.indexOf(Math.max(...score))}`);
    }
    const csv = path.join(root, `${split}.csv`);
    fs.writeFileSync(csv, `${lines.join('\n')}\n`);
    execFileSync(exe.data, ['import', 'csv', csv, '--label-column', 'label', '--out',
      path.join(datasets, 'synth'), '--name', 'synth', '--split', split], { stdio: 'pipe' });
  }
}

async function startServer() {
  const portFile = path.join(dataDir, 'port');
  const workerPortFile = path.join(dataDir, 'worker-port');
  fs.rmSync(portFile, { force: true });
  const log = fs.openSync(path.join(root, 'fuseboxd.log'), 'a');
  // Fast heartbeats and ticks keep the test short; the long heartbeat timeout
  // lets the test pause the worker (SIGSTOP) without the server losing it.
  server = spawn(exe.server, ['--database-url', dbUrl.toString(), '--data-dir', dataDir,
    '--port', '0', '--port-file', portFile, '--listen', '127.0.0.1',
    '--worker-listen', 'tcp://127.0.0.1:0', '--worker-port-file', workerPortFile,
    '--heartbeat-ms', '200', '--heartbeat-timeout-ms', '30000', '--tick-ms', '100',
    // the worker's synthetic dataset, public to every tenant like a built-in
    '--public-datasets', 'synth'],
  { stdio: ['ignore', log, log] });
  await until('the port file', () => fs.existsSync(portFile) &&
    (port = Number(fs.readFileSync(portFile, 'utf8'))) > 0, 30000);
  await until('/readyz', async () => (await fetch(`http://127.0.0.1:${port}/readyz`)).ok, 30000);
  return Number(await until('the worker port', () => fs.existsSync(workerPortFile) &&
    fs.readFileSync(workerPortFile, 'utf8').trim(), 10000));
}

async function stopServer() {
  if (!server || server.exitCode !== null) return;
  const done = new Promise((r) => server.once('exit', r));
  server.kill('SIGTERM');
  await Promise.race([done, new Promise((r) => setTimeout(r, 10000))]);
  if (server.exitCode === null) server.kill('SIGKILL');
}

// The worker's test step hook (docs/worker.md): an array whose member's name has a hold file
// waits at that step, so that what the page is checked on is still running however fast or
// loaded the machine is, and no job is sized from the machine's speed.
const hookDir = path.join(root, 'hooks');
fs.mkdirSync(hookDir);
function hold(name, step) {
  const tmp = path.join(hookDir, '.hold.tmp');
  fs.writeFileSync(tmp, `${step}\n`);
  fs.renameSync(tmp, path.join(hookDir, `hold-${name}`));
}
function release(name) {
  for (const kind of ['hold', 'held']) fs.rmSync(path.join(hookDir, `${kind}-${name}`), { force: true });
}

function startWorker(workerPort, key) {
  const log = fs.openSync(path.join(root, 'worker.log'), 'a');
  worker = spawn(exe.worker, ['--server', `tcp://127.0.0.1:${workerPort}`,
    '--server-key', path.join(dataDir, 'server.key.pub'), '--key', key, '--name', 'cpu-node-1',
    '--cpu-devices', '1', '--threads-per-device', '1', '--data-dir', datasets,
    '--heartbeat-ms', '200', '--progress-ms', '200', '--test-step-hook', hookDir],
  { stdio: ['ignore', log, log], env: { ...process.env, FUSEBOX_TEST_HOOKS: '1' } });
}

async function stopWorker() {
  if (!worker || worker.exitCode !== null || worker.signalCode) return;
  const done = new Promise((r) => worker.once('exit', r));
  worker.kill('SIGCONT');
  worker.kill('SIGKILL');
  await Promise.race([done, new Promise((r) => setTimeout(r, 5000))]);
}

async function call(method, p, key, body) {
  const res = await fetch(`http://127.0.0.1:${port}${p}`, {
    method,
    headers: { Authorization: `Bearer ${key}`, ...(body ? { 'Content-Type': 'application/json' } : {}) },
    body: body ? JSON.stringify(body) : undefined,
  });
  const json = await res.json();
  if (!res.ok) throw new Error(`${method} ${p}: ${res.status} ${JSON.stringify(json)}`);
  return json;
}

// What the page shows for a number (lib.js's fmt) and for a time share.
function fmt(v, digits = 4) {
  if (v === null || v === undefined || Number.isNaN(v)) return '—';
  if (v !== 0 && (Math.abs(v) >= 1e5 || Math.abs(v) < 1e-3)) {
    return v.toExponential(2).replace(/\.?0+e/, 'e');
  }
  return String(Number(v.toPrecision(digits)));
}
const share = (x) => `${fmt(100 * x, 3)}%`;

const model = (hidden) => ({ input: [F], layers: [{ type: 'linear', out: hidden }, { type: 'relu' },
  { type: 'linear', out: 4 }] });

// ---- the test ---------------------------------------------------------------

const t0 = Date.now();
try {
  psql(baseUrl, `CREATE DATABASE ${dbName}`);
  fs.mkdirSync(dataDir, { mode: 0o700 });
  importSynth();
  const workerKey = path.join(root, 'worker.key');
  const workerPub = execFileSync(exe.worker, ['--gen-key', workerKey], { encoding: 'utf8' }).trim();
  fs.writeFileSync(path.join(dataDir, 'worker-keys'), `# the test's worker\n${workerPub}\n`);
  const workerPort = await startServer();
  const admin = fs.readFileSync(path.join(dataDir, 'admin.key'), 'utf8').trim();
  const tenant = await call('POST', '/v1/tenants', admin, { name: 'alice', weight: 2 });
  const key = (await call('POST', `/v1/tenants/${tenant.id}/keys`, admin)).key;
  const bob = await call('POST', '/v1/tenants', admin, { name: 'bob', weight: 1 });
  const bobKey = (await call('POST', `/v1/tenants/${bob.id}/keys`, admin)).key;

  browser = await chromium.launch({
    executablePath: chromiumPath,
    args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
      '--disable-background-networking', '--disable-component-update', '--disable-sync'],
  });
  const context = await browser.newContext({ viewport: { width: 1280, height: 900 }, acceptDownloads: true });
  const page = await context.newPage();
  const pageErrors = [];
  page.on('pageerror', (e) => pageErrors.push(String(e)));
  const requests = [];
  page.on('request', (r) => requests.push(r.url()));
  const statuses = []; // [url, status] of every answer the page got
  page.on('response', (r) => statuses.push([r.url(), r.status()]));
  const base = `http://127.0.0.1:${port}`;
  const shot = (name) => page.screenshot({ path: path.join(artifacts, `${name}.png`), fullPage: true });
  onFail = shot;
  const text = (sel) => page.locator(sel).first().innerText({ timeout: 2000 });
  // pixels of a chart's canvas that are not transparent, and a hash of them
  const canvas = (chart) => page.evaluate((c) => {
    const cv = document.querySelector(`[data-chart="${c}"] canvas`);
    if (!cv) return { ink: 0, hash: '' };
    const d = cv.getContext('2d').getImageData(0, 0, cv.width, cv.height).data;
    let ink = 0;
    let hash = 0;
    for (let i = 3; i < d.length; i += 4) {
      if (d[i]) ink++;
      hash = (hash * 31 + d[i - 3] + d[i]) | 0;
    }
    return { ink, hash: String(hash) };
  }, chart);
  const arrays = async () => (await call('GET', '/v1/cluster', admin)).arrays;

  await check('a wrong key is refused with a clear message', async () => {
    await page.goto(base);
    await page.fill('#key', 'fbk_0123456789abcdef_notavalidsecret');
    await page.click('#signin button[type=submit]');
    const msg = await until('the error', async () => (await page.locator('#signin-error').isVisible()) &&
      text('#signin-error'));
    expect(/not accepted/.test(msg), `message: ${msg}`);
    expect(await page.evaluate(() => sessionStorage.getItem('fusebox.key')) === null, 'bad key stored');
    await shot('01-wrong-key');
  });

  // alice's trials wait at step `held` (a hold set before they exist) until the page has seen
  // them running beside bob's array; released, they train the rest and finish.  Sizing them
  // from the machine's speed failed both ways: on a quiet machine 4000 steps ended before bob's
  // array had reported twice, and 12000 did not end within 180 s under ASan on a loaded one.
  const steps = 2500;
  const held = 2000;
  const trialNames = [0, 1, 2].map((i) => `lr-grid-${i}`);
  const releaseTrials = () => trialNames.forEach(release);
  let sweep;
  await check('sign in and see the trials of a sweep wait for a worker', async () => {
    await page.fill('#key', key);
    await page.click('#signin button[type=submit]');
    await until('the jobs table', () => page.locator('#jobs').isVisible());
    expect((await text('#who')) === 'alice', 'tenant name shown');
    trialNames.forEach((n) => hold(n, held));
    sweep = await call('POST', '/v1/sweeps', key, {
      name: 'lr-grid',
      base: { dataset: 'synth', model: model(512), batch_size: 32, steps, eval_every: 1000,
        optimizer: { type: 'adam', lr: 0.001 }, seed: 3 },
      search: { type: 'grid', params: { 'optimizer.lr': { values: [0.01, 0.003, 0.001] } } },
    });
    await until('three trial rows', async () => (await page.locator('#jobs tr[data-job]').count()) === 3);
    const row = await until('the planner\'s reason', async () => {
      const r = await text('#jobs tbody tr');
      return /waiting for workers/.test(r) && r;
    });
    expect(/queued/.test(row) && /lr-grid/.test(row) && /alice/.test(row), `row: ${row}`);
    await shot('02-jobs-queued');
  });

  const jobs = sweep.trials.map((t) => t.job_id);
  let mine;
  let theirs;
  let bobJob;
  let paused = false;
  await check('a worker trains the sweep as one array, sharing its device with bob\'s', async () => {
    startWorker(workerPort, workerKey);
    mine = await until('alice\'s array reporting progress', async () =>
      (await arrays()).find((a) => a.members === 3 && a.samples_per_s !== null), 30000);
    // bob's small model trains fast: many steps, so that it still runs when the page is
    // checked (cancelled once alice's trials are let finish)
    bobJob = await call('POST', '/v1/jobs', bobKey, { name: 'bob-1', dataset: 'synth', model: model(64),
      batch_size: 16, steps: 10000000, eval_every: 10000000, checkpoint_every: 10000000,
      optimizer: { type: 'adam', lr: 0.003 } });
    // both arrays have reported; pause the worker so that neither ends while the page is checked
    [mine, theirs] = await until('both arrays reporting progress', async () => {
      const all = await arrays();
      const a = all.find((x) => x.id === mine.id);
      const b = all.find((x) => x.id !== mine.id);
      return a && b && a.samples_per_s !== null && b.samples_per_s !== null && [a, b];
    }, 20000);
    worker.kill('SIGSTOP');
    paused = true;
    [mine, theirs] = await (async () => {
      const all = await arrays();
      return [all.find((x) => x.id === mine.id), all.find((x) => x.id === theirs.id)];
    })();
    expect(mine.state === 'running' && mine.worker === 'cpu-node-1' && mine.devices.join() === '0',
      `alice's array: ${JSON.stringify(mine)}`);
    expect(theirs.devices.join() === '0' && theirs.members === 1, `bob's array: ${JSON.stringify(theirs)}`);
  });

  await check('the cluster view shows the worker, its device and the arrays on it with their shares', async () => {
    await page.goto(`${base}/#/cluster`);
    const dev = page.locator('[data-worker="cpu-node-1"] tr[data-device="cpu-node-1/0"]');
    await until('the device row', () => dev.isVisible());
    expect(/cpu0/.test(await dev.innerText()), 'device name');
    const onDev = async (a) => (await dev.locator(`.dev-array[data-array="${a.id}"]`).innerText()).trim();
    const m = await until('alice\'s array on the device', () => onDev(mine));
    expect(m.includes('×3') && m.includes(share(mine.time_share)) && m.includes('alice'),
      `alice's array on cpu0: ${m} (share ${mine.time_share})`);
    const b = await onDev(theirs);
    expect(b.includes('×1') && b.includes(share(theirs.time_share)) && b.includes('1 other tenant'),
      `bob's array on cpu0: ${b} (share ${theirs.time_share})`);
    const row = page.locator(`#arrays tr[data-array="${mine.id}"]`);
    expect((await row.locator('td.members').innerText()) === '3', 'members in the arrays table');
    expect((await row.locator('td.share').innerText()) === share(mine.time_share), 'share in the table');
    expect((await row.locator('td.tenants').innerText()) === 'alice', 'tenants of alice\'s array');
    expect((await page.locator(`#arrays tr[data-array="${theirs.id}"] td.tenants`).innerText()) ===
      '1 other tenant', 'bob is only counted');
    expect(!/bob/.test(await text('main')), 'another tenant\'s name is not shown');
    // durations in a unit that reads (never "5.47e-4 ms")
    const times = await page.locator('#arrays .step-time').allInnerTexts();
    expect(times.length >= 1 && times.every((x) => /^\d+(\.\d+)? (ns|µs|ms|s)\b/.test(x)), `step times: ${times}`);
    const hover = await page.locator('#arrays .step-time').first().getAttribute('title');
    expect(/^compute \d+(\.\d+)? (ns|µs|ms|s), /.test(hover) && !/\de-\d/.test(hover), `parts: ${hover}`);
    expect(!/\de-\d+ ms/.test(await text('main')), 'a duration in exponent notation');
    // slowdown as the control loop measured it (alice's array ran alone first: its profile)
    const c = await call('GET', '/v1/cluster', key);
    expect(typeof c.slowdown.max === 'number' && c.slowdown.max > 0, `cluster slowdown ${JSON.stringify(c.slowdown)}`);
    await until('max slowdown', async () => /^\d+(\.\d+)?$/.test(await text('#max-slowdown .tile-v')));
    await shot('03-cluster');
  });

  await check('running trials show their array from the API, progress, loss and slowdown', async () => {
    await page.goto(`${base}/#/jobs`);
    const measured = (await call('GET', `/v1/jobs/${jobs[0]}`, key)).slowdown;
    expect(typeof measured === 'number' && measured > 0, `measured slowdown ${measured}`);
    await until('a measured slowdown', async () => (await page.locator('#jobs td.slowdown').allInnerTexts())
      .some((t) => /^\d+(\.\d+)?$/.test(t)));
    const row = await until('the array column', async () => {
      const r = await text(`#jobs tr[data-job="${jobs[0]}"]`);
      return r.includes(`×3 ${share(mine.time_share)}`) && r;
    });
    expect(/running/.test(row) && row.includes(` / ${steps}`) && /alice/.test(row), `row: ${row}`);
    // the array's samples/s and the member's (a third of it: three members of one batch size)
    const lm = (await call('GET', `/v1/jobs/${jobs[0]}`, key)).latest_metrics;
    const r0 = page.locator(`#jobs tr[data-job="${jobs[0]}"]`);
    await until('the throughputs', async () =>
      (await r0.locator('td.sps-array').innerText()) === fmt(lm.samples_per_s) &&
      (await r0.locator('td.sps-job').innerText()) === fmt(lm.samples_per_s / 3));
    // the state filter asks the server
    await page.selectOption('#f-state', 'queued');
    await until('no queued jobs', async () => /No jobs yet/.test(await text('#jobs tbody')));
    await page.selectOption('#f-state', 'running');
    await until('three running', async () => (await page.locator('#jobs tr[data-job]').count()) === 3);
    expect(requests.some((u) => u.includes('state=running')), 'state filter sent to the API');
    await shot('04-jobs-running');
  });

  await check('a job\'s charts update as the worker trains on', async () => {
    await page.goto(`${base}/#/jobs/${jobs[0]}`);
    const before = await until('a drawn loss curve', async () => {
      const c = await canvas('loss');
      return c.ink > 200 && c;
    });
    const n0 = Number(await page.getAttribute('[data-chart=loss]', 'data-points'));
    expect((await canvas('breakdown')).ink > 200, 'time breakdown drawn');
    await shot('05-job-paused');
    const r0 = requests.length;
    worker.kill('SIGCONT');
    paused = false;
    releaseTrials();
    await until('more points', async () =>
      Number(await page.getAttribute('[data-chart=loss]', 'data-points')) > n0, 20000);
    await until('a changed loss curve', async () => (await canvas('loss')).hash !== before.hash);
    const metricUrls = requests.slice(r0).filter((u) => u.includes('/metrics?'));
    expect(metricUrls.length > 0 && metricUrls.every((u) => !u.includes('since_step=-1')),
      `only new points asked for: ${metricUrls.slice(0, 3).join(' ')}`);
    await shot('05-job-training');
  });

  await check('the trials complete and show their validation accuracy', async () => {
    if (paused) worker.kill('SIGCONT');
    releaseTrials();
    if (bobJob) await call('POST', `/v1/jobs/${bobJob.id}/cancel`, bobKey, {});
    const done = await until('three completed trials', async () => {
      const r = await call('GET', `/v1/jobs?sweep_id=${sweep.id}`, key);
      return r.jobs.every((j) => j.state === 'completed') && r.jobs;
    }, 180000); // a liveness bound: the 500 steps after the hold, under ASan, are seconds
    await page.goto(`${base}/#/jobs?sweep=${sweep.id}`);
    await until('completed rows', async () => (await page.locator('#jobs tr[data-job] .s-completed').count()) === 3);
    for (const j of done) {
      const acc = j.latest_metrics.val_accuracy;
      expect(acc > 0.5, `${j.name}: validation accuracy ${acc} is not above chance (0.25)`);
      const cell = await until(`${j.name}'s accuracy`, async () =>
        (await page.locator(`#jobs tr[data-job="${j.id}"] td.val-acc`).innerText()).trim());
      expect(cell === fmt(acc), `${j.name}: shows ${cell}, the API says ${acc}`);
    }
    await shot('06-jobs-completed');
  });

  await check('the sweep view ranks trials, highlights the best and overlays curves', async () => {
    await page.goto(`${base}/#/sweeps/${sweep.id}`);
    const s = await call('GET', `/v1/sweeps/${sweep.id}`, key);
    expect(s.best_trial !== null, 'a best trial');
    await until('trial rows', async () => (await page.locator('#trials tr[data-trial]').count()) === 3);
    await until('best trial', async () =>
      (await page.locator('#trials tr.best').getAttribute('data-trial')) === String(s.best_trial.index));
    await page.click('#trials th[data-key="slowdown"]');
    await page.click('#trials th[data-key="slowdown"]');
    // descending by the slowdowns the API reports (members of one array may tie)
    const slow = new Map();
    for (const t of s.trials) slow.set(String(t.index), (await call('GET', `/v1/jobs/${t.job_id}`, key)).slowdown ?? -1);
    const order = await page.locator('#trials tbody tr').evaluateAll((rs) => rs.map((r) => r.dataset.trial));
    const vals = order.map((i) => slow.get(i));
    expect(vals.every((x, i) => i === 0 || vals[i - 1] >= x), `sorted by slowdown descending: ${order} ${vals}`);
    await until('overlaid curves', async () => (await canvas('sweep-loss')).ink > 200);
    await shot('07-sweep');
  });

  await check('a completed job lists its final checkpoint and its model downloads', async () => {
    await page.goto(`${base}/#/jobs/${jobs[0]}`);
    await until('the final checkpoint', async () => /final/.test(await text('#checkpoints tbody')), 15000);
    // the job no longer changes: the page's polls revalidate it (304, no body) and it stays drawn
    const jobUrl = `${base}/v1/jobs/${jobs[0]}`;
    await until('a 304 for the unchanged job', async () =>
      statuses.some(([u, st]) => u === jobUrl && st === 304), 15000);
    expect(/completed/.test(await text('#main')), 'the job is still shown after a 304');
    const [dl] = await Promise.all([page.waitForEvent('download'), page.click('#download')]);
    const file = path.join(artifacts, dl.suggestedFilename());
    await dl.saveAs(file);
    expect(dl.suggestedFilename() === 'lr-grid-0.safetensors', `name ${dl.suggestedFilename()}`);
    const bytes = fs.readFileSync(file);
    const res = await fetch(`${base}/v1/jobs/${jobs[0]}/model`, { headers: { Authorization: `Bearer ${key}` } });
    expect(bytes.equals(Buffer.from(await res.arrayBuffer())), 'the download differs from the API\'s');
    // safetensors: an 8-byte header length, then the header naming the tensors
    const header = JSON.parse(bytes.subarray(8, 8 + Number(bytes.readBigUInt64LE(0))).toString());
    expect(['0.weight', '0.bias', '2.weight', '2.bias'].every((n) => header[n]),
      `tensors: ${Object.keys(header).join(', ')}`);
    expect(header['0.weight'].shape.join() === `512,${F}`, `0.weight ${header['0.weight'].shape}`);
    await shot('08-job-completed');
  });

  // Trial 1's learning rate is far better than the others', so whichever of
  // 0 and 2 reports last at rung 0 (the array reports its members in one
  // order, forwards or backwards) is the third result there and not the
  // best: ASHA stops it.  The survivors go on alone to rung 1 (two results
  // there, too few to stop anyone) and finish; their steps are many more
  // than the rungs', so the stopped trial leaves its array before its end
  // (one that reaches its last step first just finishes, end_reason null).
  let asha;
  await check('the sweep view shows each trial\'s ASHA rungs and marks the early-stopped ones', async () => {
    asha = await call('POST', '/v1/sweeps', key, {
      name: 'lr-asha',
      base: { dataset: 'synth', model: model(64), batch_size: 32, steps: 3000, eval_every: 100,
        optimizer: { type: 'adam', lr: 0.001 }, seed: 5 },
      search: { type: 'grid', params: { 'optimizer.lr': { values: [2e-5, 0.01, 1e-5] } } },
      early_stopping: { type: 'asha', metric: 'val_loss', mode: 'min', grace_steps: 100,
        reduction_factor: 3, max_rungs: 2 },
    });
    const s = await until('the ASHA trials to finish with a stop', async () => {
      const x = await call('GET', `/v1/sweeps/${asha.id}`, key);
      const rungs = x.trials.map((t) => `${t.index} ${t.state} ${t.end_reason} ` +
        t.rungs.map((g) => `r${g.rung}@${g.step}=${g.decision}`).join(','));
      if (!x.trials.every((t) => t.state === 'completed' && t.rungs.length) ||
          !x.trials.some((t) => t.end_reason === 'early_stopped'))
        throw new Error(rungs.join('; '));
      return x;
    }, 40000);
    const stopped = s.trials.filter((t) => t.end_reason === 'early_stopped');
    expect(stopped.length === 1 && stopped[0].index !== 1 && stopped[0].step < 3000 &&
      stopped[0].rungs.map((g) => g.decision).join() === 'stop',
    `one trial stopped at rung 0, not the best: ${JSON.stringify(s.trials)}`);
    await page.goto(`${base}/#/sweeps/${asha.id}`);
    await until('trial rows', async () => (await page.locator('#trials tr[data-trial]').count()) === 3);
    expect(/ASHA early stopping on val_loss \(min\), rungs at steps 100, 300/.test(await text('#main .toolbar')),
      'the rule in the heading');
    for (const t of s.trials) {
      const row = page.locator(`#trials tr[data-trial="${t.index}"]`);
      const want = t.rungs.map((g) => `r${g.rung} ${fmt(g.metric)} ${g.decision === 'stop' ? '✗' : '✓'}`)
        .join(' · ');
      const got = await until(`trial ${t.index}'s rungs`, async () =>
        (await row.locator('td.rungs').innerText()).trim());
      expect(got === want, `trial ${t.index}: shows "${got}", the API says "${want}"`);
      expect((await row.locator('td.rungs .rung.stop').count()) === (t.end_reason ? 1 : 0),
        `trial ${t.index}: stop marks`);
      const marker = row.locator('td.state .early-stopped');
      expect((await marker.count()) === (t.end_reason === 'early_stopped' ? 1 : 0),
        `trial ${t.index} (${t.end_reason}): early-stopped marker`);
      if (t.end_reason) {
        const title = await marker.getAttribute('title');
        expect(title.includes(`rung 0 (step ${t.rungs[0].step})`), `marker title: ${title}`);
      }
    }
    // a sweep without an early-stopping rule has no rungs column
    await page.goto(`${base}/#/sweeps/${sweep.id}`);
    await until('trial rows', async () => (await page.locator('#trials tr[data-trial]').count()) === 3);
    expect((await page.locator('#trials th[data-key="rungs"]').count()) === 0, 'rungs column on lr-grid');
    await page.goto(`${base}/#/sweeps/${asha.id}`);
    await until('the rungs', () => page.locator('#trials td.rungs .rung.stop').isVisible());
    await until('overlaid curves', async () => (await canvas('sweep-loss')).ink > 200);
    await shot('09-sweep-asha');
  });

  await actionChecks({ page, base, key, call, check, expect, until, text, canvas, shot, model, fmt });

  await check('an unreachable server is reported, and polling backs off', async () => {
    await page.goto(`${base}/#/jobs`);
    // every job of alice's: the sweeps' trials and the one submitted from the page
    const all = (await call('GET', '/v1/jobs?limit=200', key)).jobs.length;
    await until('jobs', async () => (await page.locator('#jobs tr[data-job]').count()) === all);
    await stopServer();
    // fuseboxd exits 0 on SIGTERM (under ASan: without leaks or errors)
    expect(server.exitCode === 0, `fuseboxd exit status ${server.exitCode} ${server.signalCode || ''}`);
    const msg = await until('the banner', async () => (await page.locator('#banner').isVisible()) &&
      text('#banner'), 15000);
    expect(/unreachable/i.test(msg), `banner: ${msg}`);
    await shot('10-unreachable');
  });

  await check('no script errors in the page', async () => {
    expect(pageErrors.length === 0, pageErrors.join('\n'));
  });
} catch (e) {
  failed++;
  console.log(`FAIL setup: ${e.stack || e}`);
} finally {
  if (browser) await browser.close().catch(() => {});
  await stopWorker();
  await stopServer();
  try {
    psql(baseUrl, `DROP DATABASE IF EXISTS ${dbName} WITH (FORCE)`);
  } catch (e) {
    console.log(`could not drop ${dbName}: ${e}`);
  }
  if (failed) {
    for (const name of ['fuseboxd.log', 'worker.log']) {
      const log = path.join(root, name);
      if (fs.existsSync(log))
        console.log(`== ${name}\n${fs.readFileSync(log, 'utf8').split('\n').slice(-40).join('\n')}`);
    }
  } else {
    fs.rmSync(root, { recursive: true, force: true });
  }
}
console.log(`${passed} passed, ${failed} failed (${((Date.now() - t0) / 1000).toFixed(1)} s;` +
  ` screenshots in ${artifacts})`);
process.exit(failed ? 1 : 0);

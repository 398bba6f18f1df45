// The dashboard in a real browser: headless Chromium (Debian's, driven by
// playwright-core) against the real fuseboxd on loopback, on a fresh
// database of the PostgreSQL of FUSEBOX_TEST_DATABASE_URL.  Until workers
// exist, what they would record (metrics, groups, checkpoints, a worker and
// its devices) is inserted with psql, the way tests/server does with libpq.
// Screenshots go to FB_BINARY_DIR/tests/web/artifacts/.  Exit 0 when every
// check passed, 1 when some failed, 77 (skipped) without a database,
// Chromium or `npm ci` in tests/web.
import { execFileSync, spawn } from 'node:child_process';
import crypto from 'node:crypto';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const here = path.dirname(fileURLToPath(import.meta.url));
const skip = (why) => {
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

const artifacts = path.join(binDir, 'tests/web/artifacts');
fs.mkdirSync(artifacts, { recursive: true });

// ---- results ---------------------------------------------------------------

let passed = 0;
let failed = 0;
async function check(name, fn) {
  const t0 = Date.now();
  try {
    await fn();
    passed++;
    console.log(`ok   ${name} (${Date.now() - t0} ms)`);
  } catch (e) {
    failed++;
    console.log(`FAIL ${name}: ${e.stack || e}`);
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

// ---- database and server ---------------------------------------------------

const dbName = `fbw_${process.pid}_${crypto.randomBytes(4).toString('hex')}`;
const dbUrl = new URL(baseUrl);
dbUrl.pathname = `/${dbName}`;
const psql = (url, sql) =>
  execFileSync('psql', [url, '-v', 'ON_ERROR_STOP=1', '-qAt', '-c', sql], { encoding: 'utf8' }).trim();
const sql = (text) => psql(dbUrl.toString(), text);

const dataDir = fs.mkdtempSync(path.join(os.tmpdir(), 'fbw-data-'));
let server = null;
let port = 0;
let browser = null;

async function startServer() {
  const portFile = path.join(dataDir, 'port');
  fs.rmSync(portFile, { force: true });
  const log = fs.openSync(path.join(dataDir, 'fuseboxd.log'), 'a');
  server = spawn(path.join(binDir, 'server/fuseboxd'), ['--database-url', dbUrl.toString(),
    '--data-dir', dataDir, '--port', '0', '--port-file', portFile, '--listen', '127.0.0.1',
     '--worker-listen', 'tcp://127.0.0.1:0'],
  { stdio: ['ignore', log, log] });
  await until('the port file', () => fs.existsSync(portFile) &&
    (port = Number(fs.readFileSync(portFile, 'utf8'))) > 0, 30000);
  await until('/readyz', async () => (await fetch(`http://127.0.0.1:${port}/readyz`)).ok, 30000);
}

async function stopServer() {
  if (!server || server.exitCode !== null) return;
  const done = new Promise((r) => server.once('exit', r));
  server.kill('SIGTERM');
  await Promise.race([done, new Promise((r) => setTimeout(r, 10000))]);
  if (server.exitCode === null) server.kill('SIGKILL');
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

// Metric rows for steps [from, to] of a job: loss falling at a per-trial rate.
function metricRows(jobId, trial, from, to) {
  const rows = [];
  for (let s = from; s <= to; s++) {
    const loss = 2.3 * Math.exp(-s / (20 + 10 * trial)) + 0.1 * (trial + 1);
    const ev = s % 10 === 0 ? `${(loss * 1.05).toFixed(5)}, ${(1 - loss / 3).toFixed(5)}` : 'NULL, NULL';
    rows.push(`('${jobId}', ${s}, ${loss.toFixed(5)}, ${(1 - loss / 2.5).toFixed(5)}, ${ev},` +
      ` ${900 + 10 * trial}, ${(1 + 0.02 * s / (trial + 1)).toFixed(4)}, 6, 1.5, 0.8, 0.4)`);
  }
  return 'INSERT INTO job_metrics (job_id, step, loss, accuracy, eval_loss, eval_accuracy,' +
    ' samples_per_s, slowdown, compute_ms, comm_ms, io_ms, wait_ms) VALUES ' + rows.join(', ');
}

function latest(jobId, step, trial, slowdown) {
  const loss = 2.3 * Math.exp(-step / (20 + 10 * trial)) + 0.1 * (trial + 1);
  return `UPDATE jobs SET step = ${step}, slowdown = ${slowdown}, latest_metrics =` +
    ` '{"loss": ${loss.toFixed(5)}, "samples_per_s": ${900 + 10 * trial}}' WHERE id = '${jobId}'`;
}

// ---- the test ---------------------------------------------------------------

const t0 = Date.now();
try {
  psql(baseUrl, `CREATE DATABASE ${dbName}`);
  await startServer();
  const admin = fs.readFileSync(path.join(dataDir, 'admin.key'), 'utf8').trim();
  const tenant = await call('POST', '/v1/tenants', admin, { name: 'alice', weight: 2 });
  const key = (await call('POST', `/v1/tenants/${tenant.id}/keys`, admin)).key;

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
  const base = `http://127.0.0.1:${port}`;
  const shot = (name) => page.screenshot({ path: path.join(artifacts, `${name}.png`), fullPage: true });
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

  let sweep;
  await check('sign in and see the trials of a sweep submitted through the API', async () => {
    await page.fill('#key', key);
    await page.click('#signin button[type=submit]');
    await until('the jobs table', () => page.locator('#jobs').isVisible());
    expect((await text('#who')) === 'alice', 'tenant name shown');
    sweep = await call('POST', '/v1/sweeps', key, {
      name: 'lr-grid',
      base: { dataset: 'fashion-mnist', model: { input: [1, 28, 28], layers: [{ type: 'flatten' },
        { type: 'linear', out: 10 }] }, batch_size: 32, steps: 200, optimizer: { type: 'adamw', lr: 0.001 } },
      search: { type: 'grid', params: { 'optimizer.lr': { values: [0.03, 0.01, 0.003] } } },
      early_stopping: { type: 'asha', metric: 'eval_loss', grace_steps: 20 },
    });
    await until('three trial rows', async () => (await page.locator('#jobs tr[data-job]').count()) === 3);
    const row = await text('#jobs tbody tr');
    expect(/queued/.test(row) && /waiting for (devices|workers)/.test(row) && /lr-grid/.test(row), `row: ${row}`);
    await shot('02-jobs-queued');
  });

  const jobs = sweep.trials.map((t) => t.job_id);
  await check('running trials show their array, progress, loss and slowdown', async () => {
    sql("INSERT INTO groups (id, fusion_key, state, n_members) VALUES ('00000000-0000-4000-8000-000000000001'," +
      " 'fk', 'running', 3)");
    sql(`UPDATE jobs SET state = 'running', group_id = '00000000-0000-4000-8000-000000000001',` +
      ` queue_reason = NULL, started_at = now() WHERE sweep_id = '${sweep.id}'`);
    jobs.forEach((j, i) => sql(metricRows(j, i, 1, 50)));
    jobs.forEach((j, i) => sql(latest(j, 50, i, 1.25 + i / 10)));
    await until('slowdown 1.25', async () => (await page.locator('#jobs td.slowdown').allInnerTexts())
      .includes('1.25'));
    const row = await text(`#jobs tr[data-job="${jobs[0]}"]`);
    expect(/running/.test(row) && /×3/.test(row) && /50 \/ 200/.test(row), `row: ${row}`);
    // the state filter asks the server for running jobs only
    await page.selectOption('#f-state', 'queued');
    await until('no queued jobs', async () => /No jobs yet/.test(await text('#jobs tbody')));
    await page.selectOption('#f-state', 'running');
    await until('three running', async () => (await page.locator('#jobs tr[data-job]').count()) === 3);
    expect(requests.some((u) => u.includes('state=running')), 'state filter sent to the API');
    await shot('03-jobs-running');
  });

  await check('the sweep view ranks trials, highlights the best and overlays curves', async () => {
    await page.goto(`${base}/#/sweeps/${sweep.id}`);
    await until('trial rows', async () => (await page.locator('#trials tr[data-trial]').count()) === 3);
    // eval_loss is lowest for trial 0 (fastest decay, smallest offset)
    await until('best trial', async () => (await page.locator('#trials tr.best').getAttribute('data-trial')) === '0');
    await page.click('#trials th[data-key="slowdown"]');
    await page.click('#trials th[data-key="slowdown"]');
    const first = await page.locator('#trials tbody tr').first().getAttribute('data-trial');
    expect(first === '2', `sorted by slowdown descending, first is trial ${first}`);
    await until('overlaid curves', async () => (await canvas('sweep-loss')).ink > 500);
    await shot('04-sweep');
  });

  await check('a job shows loss, slowdown and step-time charts that update', async () => {
    await page.goto(`${base}/#/jobs/${jobs[0]}`);
    await until('50 points', async () => (await page.getAttribute('[data-chart=loss]', 'data-points')) === '50');
    const before = await until('a drawn loss curve', async () => {
      const c = await canvas('loss');
      return c.ink > 500 && c;
    });
    expect((await canvas('breakdown')).ink > 500, 'time breakdown drawn');
    expect((await canvas('slowdown')).ink > 500, 'slowdown drawn');
    await until('slowdown 1.25', async () => (await text('#job-slowdown')) === '1.25');
    await shot('05-job-before');
    const n0 = requests.length;
    sql(metricRows(jobs[0], 0, 51, 120));
    sql(latest(jobs[0], 120, 0, 1.6));
    await until('120 points', async () => (await page.getAttribute('[data-chart=loss]', 'data-points')) === '120');
    await until('slowdown 1.6', async () => (await text('#job-slowdown')) === '1.6');
    const after = await canvas('loss');
    expect(after.hash !== before.hash, 'the loss curve changed');
    const metricUrls = requests.slice(n0).filter((u) => u.includes('/metrics?'));
    expect(metricUrls.length > 0 && metricUrls.every((u) => !u.includes('since_step=-1')),
      `only new points asked for: ${metricUrls.slice(0, 3).join(' ')}`);
    await shot('05-job-after');
  });

  await check('a checkpoint appears and the model downloads', async () => {
    const bytes = Buffer.concat([Buffer.from([8, 0, 0, 0, 0, 0, 0, 0]), Buffer.from('{}      ')]);
    fs.mkdirSync(path.join(dataDir, 'artifacts', jobs[0]), { recursive: true });
    fs.writeFileSync(path.join(dataDir, 'artifacts', jobs[0], 'final.safetensors'), bytes);
    sql(`INSERT INTO checkpoints (job_id, step, path, bytes, is_final) VALUES ('${jobs[0]}', 120,` +
      ` '${jobs[0]}/final.safetensors', ${bytes.length}, true)`);
    sql(`INSERT INTO job_events (job_id, kind, message) VALUES ('${jobs[0]}', 'checkpoint',` +
      ` 'final checkpoint at step 120')`);
    await until('the checkpoint row', async () => /final/.test(await text('#checkpoints tbody')), 15000);
    await until('the event row', async () => /final checkpoint/.test(await text('#events tbody')), 15000);
    const [dl] = await Promise.all([page.waitForEvent('download'), page.click('#download')]);
    const file = path.join(artifacts, dl.suggestedFilename());
    await dl.saveAs(file);
    expect(dl.suggestedFilename() === 'lr-grid-0.safetensors', `name ${dl.suggestedFilename()}`);
    expect(fs.readFileSync(file).equals(bytes), 'downloaded bytes differ');
    await shot('06-job-checkpoint');
  });

  await check('the cluster view shows devices, tenant shares and slowdown', async () => {
    sql("INSERT INTO workers (id, name, state) VALUES ('00000000-0000-4000-8000-0000000000aa', 'cpu-node-1', 'ready')");
    sql("INSERT INTO devices (worker_id, idx, kind, name, memory_bytes, utilization, group_id, tenant_id) VALUES" +
      " ('00000000-0000-4000-8000-0000000000aa', 0, 'cpu', 'cpu0', 17179869184, 0.82," +
      ` '00000000-0000-4000-8000-000000000001', '${tenant.id}'),` +
      " ('00000000-0000-4000-8000-0000000000aa', 1, 'cpu', 'cpu1', 17179869184, 0.1, NULL, NULL)");
    await page.goto(`${base}/#/cluster`);
    await until('max slowdown', async () => /1\.6/.test(await text('#max-slowdown')));
    const tenants = await text('#tenants tbody');
    expect(/alice/.test(tenants), `tenants: ${tenants}`);
    expect(/cpu-node-1/.test(await text('main')), 'worker listed');
    await shot('07-cluster');
  });

  await check('an unreachable server is reported, and polling backs off', async () => {
    await page.goto(`${base}/#/jobs`);
    await until('jobs', async () => (await page.locator('#jobs tr[data-job]').count()) === 3);
    await stopServer();
    // fuseboxd exits 0 on SIGTERM (under ASan: without leaks or errors)
    expect(server.exitCode === 0, `fuseboxd exit status ${server.exitCode} ${server.signalCode || ''}`);
    const msg = await until('the banner', async () => (await page.locator('#banner').isVisible()) &&
      text('#banner'), 15000);
    expect(/unreachable/i.test(msg), `banner: ${msg}`);
    await shot('08-unreachable');
  });

  await check('no script errors in the page', async () => {
    expect(pageErrors.length === 0, pageErrors.join('\n'));
  });
} catch (e) {
  failed++;
  console.log(`FAIL setup: ${e.stack || e}`);
} finally {
  if (browser) await browser.close().catch(() => {});
  await stopServer();
  try {
    psql(baseUrl, `DROP DATABASE IF EXISTS ${dbName} WITH (FORCE)`);
  } catch (e) {
    console.log(`could not drop ${dbName}: ${e}`);
  }
  if (failed) {
    const log = path.join(dataDir, 'fuseboxd.log');
    if (fs.existsSync(log)) console.log(fs.readFileSync(log, 'utf8').split('\n').slice(-40).join('\n'));
  } else {
    fs.rmSync(dataDir, { recursive: true, force: true });
  }
}
console.log(`${passed} passed, ${failed} failed (${((Date.now() - t0) / 1000).toFixed(1)} s;` +
  ` screenshots in ${artifacts})`);
process.exit(failed ? 1 : 0);

// The dashboard's actions and sweep views, checked in the browser of
// dashboard.test.mjs against its fuseboxd and worker (that file starts them
// and passes what it holds in t): submitting a job and a sweep (a bad spec
// shows the server's error at its field and creates nothing), cancelling a
// job and a sweep behind a confirmation dialog, every trial's curves, the
// scatter per parameter, parallel coordinates, the best trial, the compare
// view, dots for a series of few points, and sweeps of one name told apart.
// Every wait is for a condition, never for a time.

export async function actionChecks(t) {
  const { page, base, key, call, check, expect, until, text, canvas, shot, model, fmt } = t;
  const posts = []; // URLs of the POSTs the page sent
  page.on('request', (r) => {
    if (r.method() === 'POST') posts.push(r.url());
  });
  const countJobs = async () => (await call('GET', '/v1/jobs?limit=200', key)).jobs.length;
  const countSweeps = async () => (await call('GET', '/v1/sweeps?limit=200', key)).sweeps.length;
  // What the API itself answers a spec: the test compares the page with it.
  const refusal = async (route, spec) => {
    const res = await fetch(`${base}${route}`, { method: 'POST', body: JSON.stringify(spec),
      headers: { Authorization: `Bearer ${key}`, 'Content-Type': 'application/json' } });
    const body = await res.json();
    expect(res.status === 400 && body.error && body.error.field,
      `${route} should refuse ${JSON.stringify(spec).slice(0, 200)}: ${res.status} ${JSON.stringify(body)}`);
    return body.error;
  };
  const fill = (spec) => page.fill('#spec', typeof spec === 'string' ? spec : JSON.stringify(spec, null, 2));
  const selected = () => page.evaluate(() => {
    const ta = document.querySelector('#spec');
    return [ta.value.slice(ta.selectionStart, ta.selectionEnd), ta.selectionStart];
  });
  // Submits the spec in the form and waits for the error naming want.field; at, when
  // given, is where in the text its name must be selected.
  const refusedAt = async (spec, want, at) => {
    await fill(spec);
    await page.click('#spec-submit');
    const got = await until(`the error at ${want.field}`, async () =>
      (await page.locator('#spec-error').isVisible()) &&
      (await page.getAttribute('#spec-error', 'data-field')) === want.field && text('#spec-error'));
    expect(got.includes(want.field) && got.includes(want.message), `shown: "${got}", the API: ${JSON.stringify(want)}`);
    const last = want.field.replace(/\[\d+\]/g, '').split('.').pop();
    const [sel, start] = await selected();
    expect(sel === JSON.stringify(last), `the field's name selected in the spec: "${sel}"`);
    if (at) {
      const where = at(JSON.stringify(spec, null, 2));
      expect(start === where, `${want.field} selected at ${start}, written at ${where}`);
    }
  };
  const dialogOpen = () => page.evaluate(() => !!document.querySelector('dialog#confirm[open]'));

  await check('durations read in ns, µs, ms or s, never as "5.47e-4 ms"', async () => {
    const cases = [[5.47e-4, '547 ns'], [0.25, '250 µs'], [0.999, '999 µs'], [1, '1 ms'],
      [12.345, '12.3 ms'], [999, '999 ms'], [1500, '1.5 s'], [61234, '61.2 s'], [0, '0 ms'], [null, '—']];
    const got = await page.evaluate(async (xs) => {
      const { fmtMs } = await import('/static/lib.js');
      return xs.map(([ms]) => fmtMs(ms));
    }, cases);
    const wrong = cases.map(([ms, want], i) => (got[i] === want ? null : `${ms}: ${got[i]} (want ${want})`))
      .filter(Boolean);
    expect(!wrong.length, wrong.join('; '));
  });

  const job = { name: 'web-job', dataset: 'synth', model: model(32), batch_size: 16, steps: 10000000,
    eval_every: 10000000, checkpoint_every: 10000000, optimizer: { type: 'adam', lr: 0.001 } };
  await check('a bad job spec shows the server\'s error at its field, and nothing is created', async () => {
    await page.goto(`${base}/#/submit/job`);
    await until('the submit form', () => page.locator('#spec').isVisible());
    const n0 = await countJobs();
    const p0 = posts.length;
    await fill('{"name": "half a spec",');
    await page.click('#spec-submit');
    const msg = await until('the JSON error', async () => (await page.locator('#spec-error').isVisible()) &&
      text('#spec-error'));
    expect(/not valid JSON/.test(msg) && /nothing was sent/.test(msg), `message: ${msg}`);
    expect(posts.length === p0, `no POST for text that is not JSON: ${posts.slice(p0)}`);
    const bad = [
      { ...job, steps: -5 },
      { ...job, optimizer: { type: 'adam', lr: 'fast' } },
      { ...job, batch_size: 0 },
      { ...job, colour: 'blue' },
    ];
    for (const spec of bad) await refusedAt(spec, await refusal('/v1/jobs', spec));
    // a field inside a list: the third layer's "out", not the first one's
    const layers = { ...job, model: { ...job.model, layers: [...job.model.layers.slice(0, 2),
      { type: 'linear', out: -4 }] } };
    const want = await refusal('/v1/jobs', layers);
    expect(want.field === 'model.layers[2].out', `the API names ${want.field}`);
    await refusedAt(layers, want, (t) => t.lastIndexOf('"out"'));
    expect(posts.filter((u) => u.endsWith('/v1/jobs')).length === bad.length + 1, 'one POST per bad spec');
    expect(await countJobs() === n0, 'a refused spec created a job');
    expect(/#\/submit\/job$/.test(page.url()), `still on the form: ${page.url()}`);
    await shot('11-submit-job-refused');
  });

  let webJob;
  await check('a job submitted from the page opens its page, which shows no "null"', async () => {
    const n0 = await countJobs();
    await fill(job);
    await page.click('#spec-submit');
    const id = await until('the new job\'s page', () => {
      const m = /#\/jobs\/([0-9a-f-]{36})$/.exec(page.url());
      return m && m[1];
    });
    webJob = await call('GET', `/v1/jobs/${id}`, key);
    expect(webJob.name === 'web-job' && webJob.sweep_id === null, `job ${JSON.stringify(webJob).slice(0, 300)}`);
    expect(await countJobs() === n0 + 1, 'exactly one job created');
    await until('its header', async () => (await text('#main h2')) === 'web-job');
    await until('its facts', async () => /a job of its own/.test(await text('#main .kv')));
    const all = await text('#main');
    expect(!/\bnull\b|undefined|NaN/.test(all), `the job page shows: ${all.slice(0, 400)}`);
    await shot('12-job-submitted');
  });

  await check('cancelling a job asks first; "Keep" changes nothing, confirming cancels it', async () => {
    await until('the cancel button', () => page.locator('#cancel-job').isVisible());
    await page.click('#cancel-job');
    await until('the dialog', dialogOpen);
    expect(/Cancel web-job\?/.test(await text('dialog#confirm')), 'the dialog names the job');
    await shot('13-cancel-job-dialog');
    await page.click('#confirm-no');
    await until('the dialog closed', async () => !(await dialogOpen()));
    expect(!posts.some((u) => u.endsWith(`/v1/jobs/${webJob.id}/cancel`)), 'Keep sent a cancel');
    const kept = (await call('GET', `/v1/jobs/${webJob.id}`, key)).state;
    expect(kept !== 'cancelled', `kept job is ${kept}`);
    await page.click('#cancel-job');
    await until('the dialog', dialogOpen);
    await page.click('#confirm-yes');
    await until('the job cancelled in the API', async () =>
      (await call('GET', `/v1/jobs/${webJob.id}`, key)).state === 'cancelled', 20000);
    await until('the page shows it', async () => (await page.locator('#main .toolbar .s-cancelled').count()) === 1);
    expect((await page.locator('#cancel-job').count()) === 0, 'no cancel button on a cancelled job');
    await shot('14-job-cancelled');
  });

  // 4 learning rates (three decades: a log axis) by 4 seeds (a linear one), 16 trials in
  // one array; evaluated once, at the last step, so every validation series is one point.
  const grid = {
    name: 'grid16',
    base: { dataset: 'synth', model: model(16), batch_size: 32, steps: 300, eval_every: 300,
      checkpoint_every: 300, optimizer: { type: 'adam', lr: 0.001 } },
    search: { type: 'grid', params: { 'optimizer.lr': { values: [1e-4, 1e-3, 1e-2, 1e-1] },
      seed: { values: [1, 2, 3, 4] } } },
  };
  let sweep;
  await check('a bad sweep spec is refused at its field; a good one, read from a file, opens the sweep', async () => {
    await page.goto(`${base}/#/submit/sweep`);
    await until('the submit form', async () => /Submit a sweep/.test(await text('#submit-form h2')));
    const j0 = await countJobs();
    const s0 = await countSweeps();
    const bad = [
      { ...grid, metric: 'test_loss' },
      { ...grid, base: { ...grid.base, steps: -1 } },
      { ...grid, search: { ...grid.search, type: 'spiral' } },
    ];
    for (const spec of bad) await refusedAt(spec, await refusal('/v1/sweeps', spec));
    expect(await countSweeps() === s0 && await countJobs() === j0, 'a refused sweep created something');
    await shot('15-submit-sweep-refused');
    await page.setInputFiles('#spec-file', { name: 'grid16.json', mimeType: 'application/json',
      buffer: Buffer.from(JSON.stringify(grid, null, 2)) });
    await until('the file in the form', async () => (await page.inputValue('#spec')).includes('"grid16"'));
    await page.click('#spec-submit');
    const id = await until('the new sweep\'s page', () => {
      const m = /#\/sweeps\/([0-9a-f-]{36})$/.exec(page.url());
      return m && m[1];
    });
    sweep = await call('GET', `/v1/sweeps/${id}`, key);
    expect(sweep.name === 'grid16' && sweep.n_trials === 16, `sweep ${sweep.name} ${sweep.n_trials}`);
    expect(await countSweeps() === s0 + 1 && await countJobs() === j0 + 16, 'one sweep of 16 jobs');
  });

  await check('the sweep view draws all 16 trials, the scatter, parallel coordinates and the best trial', async () => {
    sweep = await until('the 16 trials to complete', async () => {
      const s = await call('GET', `/v1/sweeps/${sweep.id}`, key);
      return s.trials.every((x) => x.state === 'completed' && x.best) && s.best_trial && s;
    }, 180000);
    await until('16 trial rows', async () => (await page.locator('#trials tr[data-trial]').count()) === 16);
    expect((await page.getAttribute('[data-chart=sweep-loss]', 'data-series')) === '16', 'a curve per trial');
    await until('every curve drawn', async () => {
      // the last trial's points are in: each trial reports 300 steps
      const n = Number(await page.getAttribute('[data-chart=sweep-loss]', 'data-points'));
      const ink = (await canvas('sweep-loss')).ink;
      const dots = await page.getAttribute('[data-chart=sweep-metric]', 'data-dots');
      if (n > 0 && ink > 200 && dots.split(',').length === 16) return true;
      throw new Error(`points ${n}, ink ${ink}, dots "${dots}"`);
    }, 20000);
    const lr = page.locator('svg.scatter[data-param="optimizer.lr"]');
    await until('the scatter of all 16', async () => (await lr.getAttribute('data-points')) === '16');
    expect((await lr.locator('circle.pt').count()) === 16, 'points in the lr scatter');
    expect((await lr.getAttribute('data-scale')) === 'log', 'a log axis for the learning rate');
    const seed = page.locator('svg.scatter[data-param="seed"]');
    expect((await seed.getAttribute('data-scale')) === 'linear' && (await seed.locator('circle.pt').count()) === 16,
      'the seed scatter');
    const b = sweep.best_trial;
    expect((await lr.locator('circle.best').getAttribute('data-trial')) === String(b.index), 'best ringed');
    const pc = page.locator('#parcoords svg.parcoords');
    expect((await pc.getAttribute('data-lines')) === '16' && (await pc.locator('polyline.line').count()) === 16,
      'a line per trial in the parallel coordinates');
    expect((await pc.getAttribute('data-axes')) === '3', 'lr, seed and the metric as axes');
    const best = await until('the best trial', async () => {
      const a = page.locator('#best a[data-trial]');
      return (await a.count()) && (await a.getAttribute('data-trial')) === String(b.index) && text('#best');
    });
    expect(best.includes(sweep.metric.name) && best.includes(fmt(b.value)), `best: ${best}, the API: ${JSON.stringify(b)}`);
    expect((await page.locator('#trials tr.best').getAttribute('data-trial')) === String(b.index), 'best row');
    await shot('16-sweep-16');
  });

  await check('the compare view overlays the chosen trials (2 to 4)', async () => {
    const pick = (i) => page.locator(`#trials tr[data-trial="${i}"] input.pick`);
    expect((await page.getAttribute('#compare', 'aria-disabled')) === 'true', 'compare off with none chosen');
    for (const i of [0, 5, 10, 15]) await pick(i).check();
    expect(await pick(3).isDisabled(), 'a fifth trial cannot be chosen');
    await pick(10).uncheck();
    expect(!(await pick(3).isDisabled()), 'again once one is let go');
    await page.click('#compare');
    await until('the compare view', () => /#\/sweeps\/[0-9a-f-]+\/compare\?trials=0,5,15$/.test(page.url()));
    await until('the chosen trials', async () => (await page.locator('#compared tbody tr').count()) === 3);
    for (const f of ['loss', 'val_loss', 'accuracy', 'val_accuracy'])
      expect((await page.getAttribute(`[data-chart=compare-${f}]`, 'data-series')) === '3', `${f}: 3 series`);
    await until('overlaid loss', async () => (await canvas('compare-loss')).ink > 200);
    const names = await page.locator('#compared tbody tr td:nth-child(2)').allInnerTexts();
    const want = [0, 5, 15].map((i) => sweep.trials.find((x) => x.index === i).name);
    expect(names.join() === want.join(), `compared ${names}, chosen ${want}`);
    await shot('17-compare');
  });

  await check('an evaluation recorded at one step is drawn as a dot', async () => {
    const t0 = sweep.trials[0];
    await page.goto(`${base}/#/jobs/${t0.job_id}`);
    await until('the val dot', async () => (await page.getAttribute('[data-chart=loss]', 'data-dots')).split(',')
      .includes('val') && (await canvas('loss')).ink > 200);
    const pts = (await call('GET', `/v1/jobs/${t0.job_id}/metrics?fields=val_loss&limit=1000`, key)).points
      .filter((p) => typeof p.val_loss === 'number');
    expect(pts.length === 1, `one validation point: ${JSON.stringify(pts)}`);
    expect(/trial 0 of sweep grid16/.test(await text('#job-sweep')), 'the trial\'s sweep in its header');
    await shot('18-one-eval');
  });

  await check('two sweeps of one name are told apart; cancelling a sweep asks first', async () => {
    const twin = await call('POST', '/v1/sweeps', key, { ...grid, base: { ...grid.base, steps: 10000000,
      eval_every: 10000000, checkpoint_every: 10000000 },
    search: { type: 'grid', params: { 'optimizer.lr': { values: [1e-3, 1e-2] } } } });
    await page.goto(`${base}/#/sweeps`);
    const rows = page.locator('#sweeps tbody tr', { hasText: 'grid16' });
    await until('both grid16 rows', async () => (await rows.count()) === 2);
    const [r1, r2] = await rows.allInnerTexts();
    expect(r1 !== r2 && [sweep, twin].every((s) => (r1 + r2).includes(s.id.slice(0, 8))),
      `rows: "${r1}" / "${r2}"`);
    await page.goto(`${base}/#/sweeps/${twin.id}`);
    await until('the cancel button', () => page.locator('#cancel-sweep').isVisible());
    expect((await text('#sweep-id')).includes(twin.id.slice(0, 8)), 'the short id under the name');
    await page.click('#cancel-sweep');
    await until('the dialog', dialogOpen);
    await page.click('#confirm-no');
    await until('the dialog closed', async () => !(await dialogOpen()));
    expect((await call('GET', `/v1/sweeps/${twin.id}`, key)).state === 'active', 'Keep cancelled the sweep');
    await page.click('#cancel-sweep');
    await until('the dialog', dialogOpen);
    await shot('19-cancel-sweep-dialog');
    await page.click('#confirm-yes');
    const s = await until('the sweep cancelled in the API', async () => {
      const x = await call('GET', `/v1/sweeps/${twin.id}`, key);
      return x.state === 'cancelled' && x.trials.every((tr) => tr.state === 'cancelled') && x;
    }, 20000);
    expect(s.trials.length === 2, 'both trials');
    await until('the page shows it', async () => (await page.locator('#main .toolbar .s-cancelled').count()) === 1);
    await shot('20-sweep-cancelled');
  });
}

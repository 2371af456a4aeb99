// The web view (docs/web-ui.md) in a real browser: Debian's chromium driven
// by playwright-core, against the real `respcoord serve --web-ui` and calls
// made with the real `respcoordctl`. Run by scripts/test-browser.sh:
//   node --test tests/browser/
// Binaries: RESPCOORD_SERVER_BIN / RESPCOORDCTL_BIN (default target/debug);
// browser: CHROMIUM_BIN (default /usr/bin/chromium). Timings are printed,
// never asserted.
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { mkdirSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import net from 'node:net';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { chromium } from 'playwright-core';

const root = fileURLToPath(new URL('../..', import.meta.url));
const SERVER_BIN = process.env.RESPCOORD_SERVER_BIN || path.join(root, 'target/debug/respcoord');
const CTL_BIN = process.env.RESPCOORDCTL_BIN || path.join(root, 'target/debug/respcoordctl');
const CHROMIUM = process.env.CHROMIUM_BIN || '/usr/bin/chromium';
const OUT = path.join(root, 'target/browser');
const WAIT = 10_000; // how long a live update may take before the test fails
mkdirSync(OUT, { recursive: true });
for (const name of readdirSync(OUT)) {
  if (name.startsWith('failure-')) rmSync(path.join(OUT, name));
}

const now = () => performance.timeOrigin + performance.now(); // wall clock, ms, fractional

// ------------------------------------------------------------------ processes

const children = new Set();
process.on('exit', () => {
  for (const child of children) child.kill('SIGKILL');
});

async function freePort() {
  const server = net.createServer();
  await new Promise((resolve, reject) => {
    server.once('error', reject);
    server.listen(0, '127.0.0.1', resolve);
  });
  const { port } = server.address();
  await new Promise((resolve) => server.close(resolve));
  return port;
}

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

/**
 * `respcoord serve --web-ui` on free loopback ports (or the given ones: a
 * restart), ready (/readyz 200).
 */
async function startServer(extraArgs = [], ports = {}) {
  const grpcPort = ports.grpcPort ?? await freePort();
  const httpPort = ports.httpPort ?? await freePort();
  const args = [
    'serve',
    '--listen', `127.0.0.1:${grpcPort}`,
    '--metrics-listen', `127.0.0.1:${httpPort}`,
    '--web-ui',
    '--log-format', 'json',
    ...extraArgs,
  ];
  const child = spawn(SERVER_BIN, args, { stdio: ['ignore', 'pipe', 'pipe'] });
  children.add(child);
  let log = '';
  const keep = (chunk) => { log = (log + chunk).slice(-20_000); };
  child.stdout.on('data', keep);
  child.stderr.on('data', keep);
  const exited = new Promise((resolve) => child.once('exit', (code, signal) => {
    children.delete(child);
    resolve({ code, signal });
  }));
  const server = {
    grpc: `http://127.0.0.1:${grpcPort}`,
    http: `http://127.0.0.1:${httpPort}`,
    ui: `http://127.0.0.1:${httpPort}/ui/`,
    log: () => log,
    restart: async () => {
      await server.stop();
      return startServer(extraArgs, { grpcPort, httpPort });
    },
    async stop() {
      if (child.exitCode != null || child.signalCode != null) return;
      child.kill('SIGTERM');
      const timer = setTimeout(() => child.kill('SIGKILL'), 5_000);
      await exited;
      clearTimeout(timer);
    },
  };
  const deadline = Date.now() + 30_000;
  for (;;) {
    if (child.exitCode != null) throw new Error(`respcoord exited (${child.exitCode}):\n${log}`);
    try {
      const res = await fetch(`${server.http}/readyz`);
      if (res.status === 200) return server;
    } catch { /* not listening yet */ }
    if (Date.now() > deadline) {
      await server.stop();
      throw new Error(`respcoord not ready after 30 s:\n${log}`);
    }
    await sleep(50);
  }
}

/**
 * One respcoordctl command with `-o json`. Resolves with the parsed output
 * and `at`, when its output arrived (the call has returned by then; process
 * exit comes later and is not counted).
 */
function ctl(server, args, { token, raw = false } = {}) {
  const env = { ...process.env, RESPCOORDCTL_ENDPOINT: server.grpc };
  delete env.RESPCOORDCTL_TOKEN;
  if (token) env.RESPCOORDCTL_TOKEN = token;
  return new Promise((resolve, reject) => {
    const child = spawn(CTL_BIN, ['-o', 'json', ...args], { env, stdio: ['ignore', 'pipe', 'pipe'] });
    children.add(child);
    let out = '';
    let err = '';
    let at = null;
    child.stdout.on('data', (chunk) => {
      at ??= now();
      out += chunk;
    });
    child.stderr.on('data', (chunk) => { err += chunk; });
    child.once('error', reject);
    child.once('exit', (code) => {
      children.delete(child);
      if (code !== 0) {
        reject(new Error(`respcoordctl ${args.join(' ')} exited ${code}: ${err.trim()}`));
        return;
      }
      if (raw) {
        resolve({ out, at });
        return;
      }
      try {
        // Ids are strings in respcoordctl's JSON, as in the web API (64-bit:
        // beyond a JS number).
        resolve({ ...JSON.parse(out), at });
      } catch (error) {
        reject(new Error(`respcoordctl ${args.join(' ')}: not JSON: ${out}${err}`, { cause: error }));
      }
    });
  });
}

// -------------------------------------------------------------------- browser

let browser;

before(async () => {
  browser = await chromium.launch({
    executablePath: CHROMIUM,
    args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-background-networking',
      '--disable-quic', '--no-first-run', '--disable-component-update', '--disable-sync'],
  });
});

after(async () => {
  await browser?.close();
});

/** A fresh context (its own sessionStorage) and page, closed after the test. */
async function openPage(t) {
  const context = await browser.newContext({ viewport: { width: 1280, height: 900 } });
  t.after(() => context.close());
  const page = await context.newPage();
  const problems = [];
  page.on('pageerror', (error) => problems.push(`pageerror: ${error.message}`));
  page.on('console', (msg) => {
    // A 401/403/404 answer is logged by chromium as a failed resource load.
    if (msg.type() === 'error' && !/status of 40[134]/.test(msg.text())) problems.push(`console: ${msg.text()}`);
  });
  return { page, problems };
}

/** Retries `check` (which throws an assertion) until it passes or time runs out. */
async function eventually(check, timeout = WAIT) {
  const deadline = Date.now() + timeout;
  for (;;) {
    try {
      return await check();
    } catch (error) {
      if (Date.now() > deadline) throw error;
      await sleep(50);
    }
  }
}

/** On failure, a screenshot and the server's log: the test's own error stays first. */
async function diagnose(t, page, server, fn) {
  try {
    await fn();
  } catch (error) {
    const name = t.name.replace(/\W+/g, '-');
    await page?.screenshot({ path: path.join(OUT, `failure-${name}.png`), fullPage: true }).catch(() => {});
    // Its warnings, errors and anything not a log line (a panic): not INFO.
    const log = server.log().split('\n').filter((line) => !/"level":"(INFO|DEBUG|TRACE)"/.test(line));
    error.message += `\n--- server log (tail, no INFO) ---\n${log.join('\n').slice(-4000)}`;
    throw error;
  }
}

const bars = (page) => page.locator('[data-testid="response-bar"]').evaluateAll((els) => els.map((el) => ({
  id: el.dataset.responseId, status: el.dataset.status, reason: el.dataset.reason,
  supersededBy: el.dataset.supersededBy, label: el.closest('li')?.querySelector('[data-testid="response-label"]')?.textContent,
})));
const arrows = (page) => page.locator('[data-testid="supersede-arrow"]').evaluateAll((els) => els.map((el) => ({
  from: el.dataset.from, to: el.dataset.to,
})));
const events = (page) => page.locator('[data-testid="event-row"]').evaluateAll((els) => els.map((el) => ({
  kind: el.dataset.kind, revision: Number(el.dataset.revision), text: el.textContent,
})));
const sessionRows = (page) => page.locator('[data-testid="session-row"]').evaluateAll((els) => els.map((el) => ({
  id: el.dataset.sessionId, phase: el.dataset.phase,
})));

/** The server's open Watch streams by scope, from its /metrics. */
async function watchers(server) {
  const text = await (await fetch(`${server.http}/metrics`)).text();
  const count = (scope) => Number(new RegExp(`^respcoord_watchers\\{scope="${scope}"\\} (\\d+)`, 'm').exec(text)?.[1]);
  return { all: count('all'), session: count('session') };
}

function percentile(sorted, p) {
  return sorted[Math.max(0, Math.ceil((p / 100) * sorted.length) - 1)];
}
const ms = (value) => `${value.toFixed(1)} ms`;

// ---------------------------------------------------------------------- tests

let server;
before(async () => {
  server = await startServer(['--bookmark-interval', '1s']);
});
after(async () => {
  await server?.stop();
});

test('the session page and the sessions page follow a supersede and a cancel live', { timeout: 120_000 }, async (t) => {
  const { page, problems } = await openPage(t);
  const { page: list } = await openPage(t);
  const session = 'gw-1/call 42'; // a slash and a space: the id travels percent-encoded
  await diagnose(t, page, server, async () => {
    // Both pages open before the session exists.
    await list.goto(`${server.ui}?prefix=${encodeURIComponent('gw-1/')}`);
    await list.waitForSelector('main[data-snapshot="rendered"]');
    await page.goto(`${server.ui}?session=${encodeURIComponent(session)}`);
    await page.waitForFunction(() => document.querySelector('main[data-snapshot="rendered"]')
      || document.querySelector('[data-testid="error"]:not([hidden])'));
    await page.evaluate(() => { window.__notReloaded = true; });

    const first = await ctl(server, ['start', session, '--source', 'client']);
    await eventually(async () => {
      assert.deepEqual(await sessionRows(list), [{ id: session, phase: 'active' }]);
    });
    const second = await ctl(server, ['start', session, '--source', 'vad']);
    assert.equal(second.superseded_response_id, first.response_id);
    const cancel = await ctl(server, ['cancel', session, '--source', 'vad']);
    assert.equal(cancel.cancelled_response_id, second.response_id);

    await eventually(async () => {
      const shown = await bars(page);
      assert.deepEqual(shown.map(({ label, ...rest }) => rest), [
        { id: first.response_id, status: 'cancelled', reason: 'superseded', supersededBy: second.response_id },
        { id: second.response_id, status: 'cancelled', reason: 'requested', supersededBy: '' },
      ]);
      assert.match(shown[0].label, new RegExp(`^#${first.response_id} client · superseded by #${second.response_id} \\(vad\\) after (\\d+ ms|\\d+\\.\\d\\d s)$`));
      // Who cancelled: the Cancel's source, on its cancel_requested event.
      assert.equal(shown[1].label, `#${second.response_id} vad · cancelled: requested by vad`);
    });
    assert.deepEqual(await arrows(page), [{ from: second.response_id, to: first.response_id }]);
    await eventually(async () => {
      const kinds = (await events(page)).map((e) => e.kind);
      // PROTOCOL.md: a supersede is cancel_requested, ended, started; a Cancel
      // is cancel_requested, ended.
      assert.deepEqual(kinds, ['started', 'cancel_requested', 'ended', 'started', 'cancel_requested', 'ended']);
    });
    const rows = await events(page);
    assert.deepEqual(rows.map((e) => e.revision), [1, 2, 3, 4, 5, 6]);
    assert.match(rows[1].text, /superseded/);
    assert.match(rows[4].text, /requested/);
    assert.equal(await page.getByTestId('state-phase').getAttribute('data-phase'), 'idle');
    assert.equal(await page.getByTestId('state-live').textContent(), '—');
    assert.equal(await page.evaluate(() => window.__notReloaded), true, 'the page was reloaded');
    await eventually(async () => {
      assert.deepEqual(await sessionRows(list), [{ id: session, phase: 'idle' }]);
    });
    // The prefix filter restarts the feed.
    const filter = list.getByTestId('prefix-filter');
    await filter.fill('gw-2/');
    await eventually(async () => assert.equal(await list.getByTestId('session-count').getAttribute('data-count'), '0'));
    await filter.fill('gw-1/call');
    await eventually(async () => assert.deepEqual(await sessionRows(list), [{ id: session, phase: 'idle' }]));
    // The reloaded snapshot says when each session last changed: a time,
    // not "—" until the session changes again.
    await eventually(async () => {
      const changed = list.locator('[data-testid="session-row"] td:last-child');
      assert.deepEqual(await changed.locator('time').count(), 1, `last change: ${await changed.allTextContents()}`);
    });

    // From the list to the session page by its link: leaving the list ends
    // its feed (a watch-all on the server), then a completed and a live
    // response for the screenshot.
    await eventually(async () => assert.deepEqual(await watchers(server), { all: 1, session: 1 }));
    await list.getByRole('link', { name: session }).click();
    await list.waitForSelector('main[data-snapshot="rendered"]');
    assert.equal(new URL(list.url()).searchParams.get('session'), session);
    await eventually(async () => assert.deepEqual(await watchers(server), { all: 0, session: 2 }));
    assert.equal(await list.locator('[data-testid="response-bar"]').count(), 2);
    assert.equal(await list.getByTestId('state-responses-started').textContent(), '2');
    const third = await ctl(server, ['start', session, '--source', 'client']);
    await sleep(600);
    await ctl(server, ['finish', session, String(third.response_id)]);
    await sleep(300);
    const fourth = await ctl(server, ['start', session, '--source', 'vad']);
    await eventually(async () => {
      const shown = await bars(page);
      assert.equal(shown.length, 4);
      assert.equal(shown[2].status, 'completed');
      assert.match(shown[2].label, new RegExp(`^#${third.response_id} client · completed (\\d+ ms|\\d+\\.\\d\\d s)$`));
      assert.deepEqual({ id: shown[3].id, status: shown[3].status }, { id: fourth.response_id, status: 'live' });
    });
    // A live bar grows while nothing happens.
    const width = () => page.locator(`[data-testid="response-bar"][data-response-id="${fourth.response_id}"]`)
      .evaluate((el) => el.getBoundingClientRect().width);
    const before = await width();
    await sleep(1200);
    assert.ok(await width() > before, 'the live bar did not grow');
    await page.screenshot({ path: path.join(OUT, 'timeline.png'), fullPage: true });
    assert.deepEqual(problems, []);
  });
});

test('with --auth-tokens the page asks for a token and shows only its scope', { timeout: 120_000 }, async (t) => {
  const tokens = path.join(OUT, `tokens-${process.pid}.txt`);
  const tenantA = 'tenant-a-token-0123456789abcdef';
  const admin = 'admin-token-0123456789abcdef01234';
  writeFileSync(tokens, `# browser test\n${tenantA} tenant-a/\n${admin} *\n`, { mode: 0o600 });
  t.after(() => rmSync(tokens, { force: true }));
  const secured = await startServer(['--auth-tokens', tokens]);
  t.after(() => secured.stop());
  const { page, problems } = await openPage(t);
  await diagnose(t, page, secured, async () => {
    assert.equal((await fetch(`${secured.http}/api/v1/sessions`)).status, 401);
    assert.equal((await fetch(`${secured.ui}app.js`)).status, 200, 'the assets need no token');
    await ctl(secured, ['start', 'tenant-a/call-1'], { token: admin });
    await ctl(secured, ['start', 'tenant-b/call-1'], { token: admin });

    await page.goto(secured.ui);
    const form = page.getByTestId('token-form');
    await form.waitFor();
    await form.getByLabel(/token/i).fill('wrong-token-000000000000');
    await form.getByRole('button').click();
    await eventually(async () => {
      assert.match(await page.getByTestId('token-message').textContent(), /refused/);
    });
    await page.getByTestId('token-form').getByLabel(/token/i).fill(tenantA);
    await page.getByTestId('token-form').getByRole('button').click();
    await page.waitForSelector('main[data-snapshot="rendered"]');
    assert.deepEqual(await sessionRows(page), [{ id: 'tenant-a/call-1', phase: 'active' }]);
    assert.equal(await page.evaluate(() => sessionStorage.getItem('respcoord.token')), tenantA);
    assert.equal(await page.evaluate(() => localStorage.length), 0);

    // Live: the out-of-scope change comes first, so it would show by the time
    // the in-scope one does.
    await ctl(secured, ['start', 'tenant-b/call-2'], { token: admin });
    await ctl(secured, ['start', 'tenant-a/call-2'], { token: admin });
    await eventually(async () => {
      assert.deepEqual((await sessionRows(page)).map((r) => r.id), ['tenant-a/call-1', 'tenant-a/call-2']);
    });

    // A session outside the scope: 403, said plainly; the token is kept.
    await page.goto(`${secured.ui}?session=${encodeURIComponent('tenant-b/call-1')}`);
    const error = page.getByTestId('error');
    await error.waitFor();
    assert.match(await error.textContent(), /403/);
    assert.equal(await page.getByTestId('token-form').count(), 0);
    assert.equal(await page.locator('[data-testid="response-bar"]').count(), 0);
    assert.deepEqual(problems, []);
  });
});

test('after a server restart the session page reconnects and reloads', { timeout: 120_000 }, async (t) => {
  let restarted = await startServer(['--bookmark-interval', '1s']);
  t.after(() => restarted.stop());
  const { page, problems } = await openPage(t);
  const session = 'restart/1';
  await diagnose(t, page, restarted, async () => {
    const before = await ctl(restarted, ['start', session]);
    await page.goto(`${restarted.ui}?session=${encodeURIComponent(session)}`);
    await page.waitForSelector(`[data-testid="response-bar"][data-response-id="${before.response_id}"]`);
    await page.evaluate(() => { window.__notReloaded = true; });
    // The memory backend forgets everything: the feed ends, the reconnect
    // finds no session (404) and waits for it.
    restarted = await restarted.restart();
    const error = page.getByTestId('error');
    await eventually(async () => assert.match(await error.textContent(), /404/), 20_000);
    const after = await ctl(restarted, ['start', session, '--source', 'vad']);
    await eventually(async () => {
      assert.deepEqual((await bars(page)).map((b) => [b.id, b.status]), [[after.response_id, 'live']]);
      assert.deepEqual((await events(page)).map((e) => [e.kind, e.revision]), [['started', 1]]);
    }, 20_000);
    assert.equal(await error.isVisible(), false);
    assert.equal(await page.evaluate(() => window.__notReloaded), true, 'the page was reloaded');
    assert.deepEqual(problems.filter((p) => !/ERR_CONNECTION_REFUSED|ERR_EMPTY_RESPONSE|network/.test(p)), []);
  });
});

test('after a server restart the sessions page reconnects and reloads', {
  timeout: 120_000,
}, async (t) => {
  let restarted = await startServer(['--bookmark-interval', '1s']);
  t.after(() => restarted.stop());
  const { page } = await openPage(t);
  await diagnose(t, page, restarted, async () => {
    await ctl(restarted, ['start', 'restart/before']);
    await page.goto(restarted.ui);
    await page.waitForSelector('[data-testid="session-row"]');
    restarted = await restarted.restart();
    await ctl(restarted, ['start', 'restart/after']);
    await eventually(async () => {
      assert.deepEqual((await sessionRows(page)).map((r) => r.id), ['restart/after']);
    }, 12_000);
  });
});

test('the events table shows each event\'s seq exactly', {
  timeout: 60_000,
}, async (t) => {
  const { page } = await openPage(t);
  const session = 'seq/1';
  await diagnose(t, page, server, async () => {
    await ctl(server, ['start', session]);
    await ctl(server, ['start', session]);
    const { out } = await ctl(server, ['watch', session, '--from-start', '--limit', '4'], { raw: true });
    const seqs = out.trim().split('\n').map((line) => JSON.parse(line).seq);
    assert.ok(seqs.every((seq) => typeof seq === 'string'), 'seqs are strings, exact past 2^53');
    assert.equal(seqs.length, 4);
    await page.goto(`${server.ui}?session=${encodeURIComponent(session)}`);
    await page.waitForSelector('main[data-snapshot="rendered"]');
    const shown = await page.locator('[data-testid="event-row"] td:nth-child(2)').allTextContents();
    assert.deepEqual(shown, seqs);
  });
});

test('timings: page load and live-update latency (printed, not asserted)', { timeout: 300_000 }, async (t) => {
  const { page, problems } = await openPage(t);
  const session = 'latency/1';
  await diagnose(t, page, server, async () => {
    await ctl(server, ['start', session]);
    await page.goto(`${server.ui}?session=${encodeURIComponent(session)}`);
    await page.waitForSelector('[data-testid="response-bar"]');
    await page.evaluate(() => {
      window.__barSeen = {};
      const seen = (el) => { window.__barSeen[el.dataset.responseId] ??= performance.timeOrigin + performance.now(); };
      new MutationObserver((mutations) => {
        for (const mutation of mutations) {
          for (const node of mutation.addedNodes) {
            if (node.nodeType !== 1) continue;
            if (node.matches('[data-testid="response-bar"]')) seen(node);
            node.querySelectorAll('[data-testid="response-bar"]').forEach(seen);
          }
        }
      }).observe(document.getElementById('app'), { childList: true, subtree: true });
    });

    const calls = 50;
    const returned = new Map();
    for (let i = 0; i < calls; i += 1) {
      const started = await ctl(server, ['start', session, '--source', i % 2 ? 'vad' : 'client']);
      returned.set(started.response_id, started.at);
      await page.waitForFunction((id) => window.__barSeen[id] != null, started.response_id, { timeout: WAIT });
    }
    const seen = await page.evaluate(() => window.__barSeen);
    // The events table followed: its newest row is in view.
    assert.ok(await page.locator('.events-wrap').evaluate((el) => el.scrollTop > 0
      && el.scrollTop + el.clientHeight >= el.scrollHeight - 2), 'the events table did not follow');
    const latency = [...returned].map(([id, at]) => seen[id] - at).sort((a, b) => a - b);
    // The same against the server's own commit time (the row's started_ms).
    const detail = await (await fetch(`${server.http}/api/v1/session?id=${encodeURIComponent(session)}`)).json();
    const commit = detail.responses
      .filter((r) => returned.has(r.response_id) && r.started_ms != null)
      .map((r) => seen[r.response_id] - r.started_ms)
      .sort((a, b) => a - b);

    // Reloaded, the history is the retained part (--session-history 64).
    await page.reload();
    await page.waitForSelector('main[data-snapshot="rendered"]');
    assert.match(await page.getByTestId('history-note').textContent(), /starts after revision \d+/);

    const loads = [];
    for (const url of [`${server.ui}?session=${encodeURIComponent(session)}`, server.ui]) {
      for (let i = 0; i < 5; i += 1) {
        await page.goto(url);
        await page.waitForSelector('main[data-snapshot="rendered"]');
        loads.push(await page.evaluate(() => performance.getEntriesByName('respcoord:snapshot-rendered')[0].startTime));
      }
    }
    const sessionLoads = loads.slice(0, 5).sort((a, b) => a - b);
    const listLoads = loads.slice(5).sort((a, b) => a - b);

    const report = [
      `page load, navigation start to first snapshot rendered (median of 5): session page ${ms(sessionLoads[2])}` +
        ` (${sessionLoads.map((v) => v.toFixed(0)).join(', ')}), sessions page ${ms(listLoads[2])}`,
      `live update, Start returned (respcoordctl output) to bar in the DOM, n=${latency.length}:` +
        ` p50 ${ms(percentile(latency, 50))}, p99 ${ms(percentile(latency, 99))}, max ${ms(latency.at(-1))}`,
      `live update, server commit (started_ms) to bar in the DOM, n=${commit.length}:` +
        ` p50 ${ms(percentile(commit, 50))}, p99 ${ms(percentile(commit, 99))}`,
    ];
    for (const line of report) t.diagnostic(line);
    writeFileSync(path.join(OUT, 'timings.txt'), `${report.join('\n')}\n`);
    assert.equal(latency.length, calls);
    assert.deepEqual(problems, []);
  });
});

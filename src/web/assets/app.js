// respcoord's read-only web view (docs/web-ui.md). No framework, no build
// step: served as-is under /ui/. Two views chosen by the query string: the
// sessions list (no `session`) and one session's timeline (`?session=ID`).
// Feeds are read with a streaming fetch (EventSource cannot send the
// Authorization header) and parsed here as text/event-stream.
'use strict';

(() => {
  const API = new URL('../api/v1/', document.baseURI);
  const TOKEN_KEY = 'respcoord.token';
  const MAX_EVENTS = 1000; // rows kept in the events table
  const MAX_RESPONSES = 512; // rows kept in the timeline, as the server's fold
  const ROW_H = 40; // timeline geometry, px; app.css's .tl-row and .tl-bar agree
  const BAR_TOP = 20;
  const BAR_H = 14;
  const dash = '—';

  const app = document.getElementById('app');
  const crumbs = document.getElementById('crumbs');
  const feedStatus = document.getElementById('feed-status');
  const forgetButton = document.getElementById('forget-token');
  let view = null; // the AbortController of the view on screen

  // ---------------------------------------------------------------- helpers

  function h(tag, attrs = {}, ...children) {
    const el = document.createElement(tag);
    for (const [key, value] of Object.entries(attrs)) {
      if (value == null || value === false) continue;
      if (key === 'class') el.className = value;
      else if (key.startsWith('on')) el.addEventListener(key.slice(2), value);
      else el.setAttribute(key, value === true ? '' : String(value));
    }
    for (const child of children.flat()) if (child != null) el.append(child);
    return el;
  }

  function svg(tag, attrs = {}) {
    const el = document.createElementNS('http://www.w3.org/2000/svg', tag);
    for (const [key, value] of Object.entries(attrs)) el.setAttribute(key, String(value));
    return el;
  }

  const secs = (ms) => (ms < 1000 ? `${Math.round(ms)} ms` : `${(ms / 1000).toFixed(2)} s`);
  const pad = (n, width = 2) => String(n).padStart(width, '0');
  const clock = (ms) => {
    const d = new Date(ms);
    return `${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}.${pad(d.getMilliseconds(), 3)}`;
  };
  // Response ids are decimal strings (64-bit, beyond a JSON number); "0" is none.
  const isId = (id) => id != null && String(id) !== '0';
  const byId = (a, b) => Number(BigInt(a) > BigInt(b)) - Number(BigInt(a) < BigInt(b));
  const responseText = (id) => (isId(id) ? `#${id}` : dash);
  const badge = (phase, testid) => h('span', { class: `badge phase-${phase}`, 'data-testid': testid }, phase);
  const th = (text, cls) => h('th', { scope: 'col', class: cls }, text);

  function ago(ms, now) {
    const s = Math.max(0, Math.round((now - ms) / 1000));
    if (s < 2) return 'just now';
    return s < 90 ? `${s} s ago` : s < 5400 ? `${Math.round(s / 60)} min ago` : `${Math.round(s / 3600)} h ago`;
  }

  // A controller aborted with its parent: a feed restarted inside a view.
  function childController(signal) {
    const child = new AbortController();
    signal.addEventListener('abort', () => child.abort(), { once: true });
    return child;
  }

  function every(signal, ms, fn) {
    const id = setInterval(fn, ms);
    signal.addEventListener('abort', () => clearInterval(id), { once: true });
  }

  const sleep = (ms, signal) => new Promise((resolve) => {
    const id = setTimeout(resolve, ms);
    signal.addEventListener('abort', () => { clearTimeout(id); resolve(); }, { once: true });
  });

  const setStatus = (state, text) => { feedStatus.dataset.state = state; feedStatus.textContent = text; };

  // For tests and timing: the first snapshot of this view is on screen.
  function markSnapshotRendered() {
    if (app.dataset.snapshot === 'rendered') return;
    app.dataset.snapshot = 'rendered';
    performance.mark('respcoord:snapshot-rendered');
  }

  function noticeBox() {
    const el = h('div', { class: 'notice error', role: 'alert', 'data-testid': 'error', hidden: true });
    const show = (text) => { el.textContent = text; el.hidden = !text; };
    return { el, show, clear: () => show('') };
  }

  // ------------------------------------------------------------ token, API

  const getToken = () => sessionStorage.getItem(TOKEN_KEY);
  forgetButton.addEventListener('click', () => { sessionStorage.removeItem(TOKEN_KEY); route(); });

  // An API answer other than 2xx: `status` and the server's message.
  const httpError = (status, message) => Object.assign(new Error(`${status}: ${message}`), { status });

  function apiUrl(path, params = {}) {
    const url = new URL(path, API);
    for (const [key, value] of Object.entries(params)) {
      if (value != null && value !== '') url.searchParams.set(key, value);
    }
    return url;
  }

  async function request(url, signal) {
    const headers = { Accept: 'text/event-stream' };
    const token = getToken();
    if (token) headers.Authorization = `Bearer ${token}`;
    const res = await fetch(url, { headers, signal, cache: 'no-store', credentials: 'omit' });
    if (res.ok) return res;
    let message = res.statusText || 'request failed';
    try {
      const body = await res.json();
      if (typeof body?.error === 'string') message = body.error;
    } catch { /* not JSON: keep the status text */ }
    throw httpError(res.status, message);
  }

  function errorText(err, what) {
    if (err.status == null) return `The feed failed: ${err.message}`;
    const name = { 400: 'Bad request', 403: `Forbidden: this token may not see ${what}`, 404: 'Not found', 503: 'The server is busy' };
    return `${name[err.status] || 'Error'} (${err.message})`;
  }

  function askToken(err) {
    view?.abort();
    const hadToken = Boolean(getToken());
    sessionStorage.removeItem(TOKEN_KEY);
    forgetButton.hidden = true;
    setStatus('stopped', 'token required');
    const form = document.getElementById('token-form-template').content.firstElementChild.cloneNode(true);
    form.querySelector('.token-message').textContent = hadToken
      ? `The token was refused (${err.message}). Enter another one.`
      : `This server asks for a bearer token (${err.message}).`;
    form.addEventListener('submit', (e) => {
      e.preventDefault();
      const token = form.elements.token.value.trim();
      if (!token) return;
      sessionStorage.setItem(TOKEN_KEY, token);
      route();
    });
    app.replaceChildren(form);
    form.elements.token.focus();
  }

  // Reads a text/event-stream body: `field: value` lines, a blank line ends a
  // message, `:` lines are comments (the server's bookmarks).
  async function readEvents(res, onMessage, onComment) {
    const reader = res.body.getReader();
    const decoder = new TextDecoder();
    let buffer = '';
    let msg = { event: '', id: null, data: [] };
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return;
      buffer += decoder.decode(value, { stream: true });
      let nl;
      while ((nl = buffer.indexOf('\n')) >= 0) {
        const line = buffer.slice(0, nl).replace(/\r$/, '');
        buffer = buffer.slice(nl + 1);
        if (line === '') {
          if (msg.data.length) onMessage({ event: msg.event || 'message', id: msg.id, data: msg.data.join('\n') });
          msg = { event: '', id: null, data: [] };
        } else if (line.startsWith(':')) {
          onComment(line.slice(1).trim());
        } else {
          const colon = line.indexOf(':');
          const field = colon < 0 ? line : line.slice(0, colon);
          const text = colon < 0 ? '' : line.slice(colon + 1).replace(/^ /, '');
          if (field === 'data') msg.data.push(text);
          else if (field === 'event' || field === 'id') msg[field] = text;
        }
      }
    }
  }

  // Follows a feed until `signal` aborts. When the stream ends or fails it
  // reconnects after a backoff (1 s growing to 10 s), resuming after the last
  // id; after an `event: error` it reloads the snapshot (no resume point).
  // `opts.message` handles a message and may return the resume point it
  // carries; otherwise its `id:` is (ids are exact text, JSON numbers not).
  async function follow(signal, opts) {
    let resume = null;
    let delay = 1000;
    while (!signal.aborted) {
      let reload = false;
      let wait = delay;
      let why = 'the feed ended';
      try {
        setStatus('connecting', resume == null ? 'loading…' : 'resuming…');
        const res = await request(opts.url(resume), signal);
        setStatus('live', 'live');
        opts.notice.clear();
        await readEvents(res, (msg) => {
          const next = opts.message(msg);
          if (msg.event === 'error') {
            reload = true;
            const error = JSON.parse(msg.data);
            why = `${error.code}: ${error.message}`;
            opts.notice.show(`The feed stopped (${why}); reloading.`);
          }
          resume = next ?? (msg.id || resume);
          delay = 1000;
        }, (comment) => { resume = opts.comment?.(comment) ?? resume; });
        if (opts.finished?.()) return setStatus('ended', 'ended');
      } catch (err) {
        if (signal.aborted) return;
        if (err.status === 401) return askToken(err);
        if (err.status === 404 && opts.notFound) {
          opts.notice.show(opts.notFound(err));
          resume = null;
          wait = Math.min(delay, 2000);
        } else {
          opts.notice.show(errorText(err, opts.what));
          if (err.status === 400 || err.status === 403) return setStatus('stopped', 'stopped');
        }
        why = err.message;
      }
      if (reload) {
        resume = null;
        wait = 1000;
      }
      setStatus('waiting', `${reload ? 'reloading' : 'reconnecting'} in ${wait / 1000} s (${why})`);
      await sleep(wait, signal);
      delay = Math.min(delay * 2, 10000);
    }
  }

  // -------------------------------------------------------- sessions page

  function sessionsView(signal, prefix) {
    document.title = 'Sessions · respcoord';
    crumbs.replaceChildren(h('span', { 'aria-current': 'page' }, 'Sessions'));
    const notice = noticeBox();
    const input = h('input', {
      id: 'prefix', type: 'search', value: prefix, autocomplete: 'off', spellcheck: 'false',
      placeholder: 'e.g. tenant-a/', 'data-testid': 'prefix-filter',
    });
    const count = h('p', { class: 'count', 'data-testid': 'session-count', 'aria-live': 'polite' });
    const tbody = h('tbody');
    app.replaceChildren(
      h('h1', {}, 'Sessions'),
      h('form', { class: 'filter', role: 'search', onsubmit: (e) => e.preventDefault() },
        h('label', { for: 'prefix' }, 'Session id prefix'), input),
      notice.el, count,
      h('div', { class: 'table-wrap' }, h('table', { class: 'sessions', 'data-testid': 'sessions-table' },
        h('thead', {}, h('tr', {}, th('Session'), th('Phase'), th('Live response', 'num'), th('Source'),
          th('Revision', 'num'), th('Last change', 'num'))),
        tbody)),
    );

    const rows = new Map(); // session id -> { tr, cells, changed }
    let truncated = false;
    let feed = null;

    function updateCount() {
      const n = rows.size;
      Object.assign(count.dataset, { count: n, truncated });
      count.textContent = `${n} session${n === 1 ? '' : 's'}${truncated ? ' (truncated: more match; narrow the prefix)' : ''}`;
    }

    function renderChanged(row, now) {
      const iso = row.changed == null ? null : new Date(row.changed).toISOString();
      row.cells.changed.replaceChildren(iso ? h('time', { datetime: iso, title: iso }, ago(row.changed, now)) : dash);
    }

    function upsert(s) {
      let row = rows.get(s.session_id);
      if (!row) {
        const cells = {
          phase: h('td'), live: h('td', { class: 'num mono' }), source: h('td'),
          revision: h('td', { class: 'num' }), changed: h('td', { class: 'num' }),
        };
        const link = h('a', { href: `?session=${encodeURIComponent(s.session_id)}`, 'data-nav': true }, s.session_id);
        row = { cells, changed: null };
        row.tr = h('tr', { 'data-testid': 'session-row', 'data-session-id': s.session_id },
          h('td', { class: 'mono' }, link), cells.phase, cells.live, cells.source, cells.revision, cells.changed);
        rows.set(s.session_id, row);
        // Sorted by id; the snapshot comes sorted, so this is one step there.
        let next = null;
        for (let tr = tbody.lastElementChild; tr && tr.dataset.sessionId > s.session_id; tr = tr.previousElementSibling) next = tr;
        tbody.insertBefore(row.tr, next);
      }
      row.tr.dataset.phase = s.phase;
      row.cells.phase.replaceChildren(badge(s.phase, 'session-phase'));
      row.cells.live.textContent = responseText(s.active_response_id);
      row.cells.source.textContent = isId(s.active_response_id) ? s.active_source : dash;
      row.cells.revision.textContent = String(s.revision);
      row.changed = s.changed_ms ?? row.changed;
      renderChanged(row, Date.now());
    }

    function start(p) {
      feed?.abort();
      feed = childController(signal);
      follow(feed.signal, {
        url: (after) => apiUrl('sessions/feed', { prefix: p, after_seq: after }),
        notice,
        what: 'these sessions',
        comment: (text) => /^bookmark (\d+)$/.exec(text)?.[1],
        message(msg) {
          if (msg.event === 'snapshot') {
            const snap = JSON.parse(msg.data);
            rows.clear();
            tbody.replaceChildren();
            truncated = Boolean(snap.truncated);
            for (const s of snap.sessions) upsert(s);
            updateCount();
            markSnapshotRendered();
            return null; // resume from its `id:`, the listing's seq as exact text
          }
          if (msg.event === 'change') {
            upsert(JSON.parse(msg.data).session);
            updateCount();
          }
          return null;
        },
      });
    }

    let debounce = null;
    input.addEventListener('input', () => {
      clearTimeout(debounce);
      debounce = setTimeout(() => {
        const url = new URL(location.href);
        if (input.value) url.searchParams.set('prefix', input.value);
        else url.searchParams.delete('prefix');
        history.replaceState(null, '', url);
        start(input.value);
      }, 250);
    });
    every(signal, 1000, () => {
      const now = Date.now();
      for (const row of rows.values()) renderChanged(row, now);
    });
    start(prefix);
  }

  // ------------------------------------------------------------- timeline

  // What a response row says, in words; nothing here decides a lifecycle.
  function outcome(r) {
    if (r.status == null) return r.cancel_requested_ms != null ? 'cancelling' : 'live';
    return r.status === 'cancelled' ? `cancelled-${r.reason || 'unspecified'}` : r.status;
  }

  // Who asked for a response's cancel, where its event says: " by vad".
  function by(r) {
    return r.cancel_source && r.cancel_source !== 'unspecified' ? ` by ${r.cancel_source}` : '';
  }

  function responseLabel(r, now) {
    const head = `#${r.response_id} ${r.source}`;
    const ran = r.duration_ms != null ? ` ${secs(r.duration_ms)}` : ''; // null when the start is not retained
    if (r.status == null) {
      if (r.cancel_requested_ms != null) return `${head} · cancel requested`;
      return `${head} · live${r.started_ms == null ? '' : ` ${secs(now - r.started_ms)}`}`;
    }
    if (r.status === 'cancelled' && r.reason === 'superseded' && isId(r.superseded_by)) {
      return `${head} · superseded by #${r.superseded_by} (${r.superseded_by_source || 'unspecified'})${ran && ` after${ran}`}`;
    }
    if (r.status === 'cancelled') return `${head} · cancelled: ${r.reason || 'unspecified'}${by(r)}`;
    return `${head} · ${r.status}${ran}`;
  }

  function ticks(span) {
    const pow = 10 ** Math.floor(Math.log10(span / 6));
    const step = [1, 2, 5, 10].map((m) => m * pow).find((s) => s >= span / 6);
    const digits = step >= 1000 ? 0 : step >= 100 ? 1 : step >= 10 ? 2 : 3;
    const label = (t) => (step >= 60000 ? `+${t / 60000} min` : `+${(t / 1000).toFixed(digits)} s`);
    const out = [];
    for (let t = 0; t <= span; t += step) out.push({ t, label: label(t) });
    return out;
  }

  function createTimeline() {
    const axis = h('div', { class: 'tl-axis', 'aria-hidden': 'true' });
    const grid = h('div', { class: 'tl-grid', 'aria-hidden': 'true' });
    const list = h('ol', { class: 'tl-rows', 'aria-label': 'Responses, oldest first' });
    const arrows = svg('svg', { class: 'tl-arrows', 'aria-hidden': 'true', height: 0 });
    const defs = arrows.appendChild(svg('defs'));
    const marker = defs.appendChild(svg('marker', {
      id: 'tl-arrowhead', viewBox: '0 0 10 10', refX: 9, refY: 5, markerWidth: 7, markerHeight: 7, orient: 'auto',
    }));
    marker.append(svg('path', { d: 'M0,0 L10,5 L0,10 z' }));
    const origin = h('figcaption', { class: 'tl-origin muted' });
    const root = h('figure', { class: 'timeline', 'data-testid': 'timeline' },
      axis, h('div', { class: 'tl-lanes' }, grid, list, arrows), origin);
    const rows = new Map(); // response id -> { li, bar, label }
    const lines = new Map(); // "from>to" -> svg line

    function rowFor(id) {
      if (rows.has(id)) return rows.get(id);
      const bar = h('div', { class: 'tl-bar', 'data-testid': 'response-bar', 'data-response-id': id });
      const label = h('span', { class: 'tl-label', 'data-testid': 'response-label' });
      const row = { li: h('li', { class: 'tl-row' }, label, bar), bar, label };
      rows.set(id, row);
      return row;
    }

    function draw(responses, now) {
      const sorted = [...responses.values()].sort((a, b) => byId(a.response_id, b.response_id));
      const times = sorted.flatMap((r) => [r.started_ms, r.cancel_requested_ms, r.ended_ms]).filter((t) => t != null);
      const live = sorted.some((r) => r.status == null);
      const t0 = times.length ? Math.min(...times) : now;
      const span = Math.max(Math.max(t0, ...times, live ? now : t0) - t0, 1000) * 1.02;
      const x = (t) => ((t - t0) / span) * 100; // percent of the lane

      for (const [id, row] of rows) if (!responses.has(id)) { row.li.remove(); rows.delete(id); }
      sorted.forEach((r, i) => {
        const row = rowFor(r.response_id);
        if (list.children[i] !== row.li) list.insertBefore(row.li, list.children[i] || null);
        const start = r.started_ms ?? t0; // started before the retained history: from the left edge
        const end = r.ended_ms ?? (r.status == null ? now : start);
        const left = x(start);
        const width = Math.max(x(end) - left, 0);
        const kind = outcome(r);
        Object.assign(row.bar.dataset, {
          status: r.status ?? 'live', reason: r.reason ?? '', supersededBy: r.superseded_by ?? '', outcome: kind,
        });
        row.bar.className = `tl-bar o-${kind}${r.started_ms == null ? ' clipped' : ''}`;
        Object.assign(row.bar.style, { left: `${left}%`, width: `${width}%` });
        row.bar.title = [
          `response #${r.response_id} (${r.source})`,
          `started ${r.started_ms == null ? 'before the retained history' : clock(r.started_ms)}`,
          r.cancel_requested_ms != null && `cancel requested ${clock(r.cancel_requested_ms)}${by(r)}`,
          r.ended_ms != null ? `ended ${clock(r.ended_ms)}: ${r.status}${r.reason ? ` (${r.reason})` : ''}` : 'live',
        ].filter(Boolean).join('\n');
        const text = responseLabel(r, now);
        if (row.label.textContent !== text) row.label.textContent = text;
        const flip = left > 55; // near the right edge: the label ends where the bar ends
        Object.assign(row.label.style, { left: flip ? '' : `${left}%`, right: flip ? `${100 - x(end)}%` : '' });
      });

      // Arrows: from the superseding Start up to the end of the response it stopped.
      const index = new Map(sorted.map((r, i) => [r.response_id, i]));
      const wanted = new Set();
      for (const r of sorted) {
        const by = responses.get(r.superseded_by);
        if (!by || r.ended_ms == null || by.started_ms == null) continue;
        const key = `${by.response_id}>${r.response_id}`;
        wanted.add(key);
        if (!lines.has(key)) {
          lines.set(key, arrows.appendChild(svg('line', {
            'data-testid': 'supersede-arrow', 'data-from': by.response_id, 'data-to': r.response_id,
            'marker-end': 'url(#tl-arrowhead)',
          })));
        }
        const down = index.get(by.response_id) < index.get(r.response_id);
        const line = lines.get(key);
        line.setAttribute('x1', `${x(by.started_ms)}%`);
        line.setAttribute('y1', index.get(by.response_id) * ROW_H + BAR_TOP + (down ? BAR_H : 0));
        line.setAttribute('x2', `${x(r.ended_ms)}%`);
        line.setAttribute('y2', index.get(r.response_id) * ROW_H + BAR_TOP + (down ? -1 : BAR_H + 1));
      }
      for (const [key, line] of lines) if (!wanted.has(key)) { line.remove(); lines.delete(key); }
      arrows.setAttribute('height', String(sorted.length * ROW_H));

      const marks = ticks(span);
      // Positions through the CSSOM: the server's CSP allows no inline style attributes.
      const at = (el, t) => { el.style.left = `${x(t0 + t)}%`; return el; };
      axis.replaceChildren(...marks.map(({ t, label }) => at(h('span', { class: 'tl-tick' }, label), t)));
      grid.replaceChildren(...marks.map(({ t }) => at(h('span'), t)));
      origin.textContent = sorted.length
        ? `Time from the first start (${clock(t0)})${live ? '; live responses run to now' : ''}.`
        : 'No responses retained yet.';
    }

    return { root, draw };
  }

  // --------------------------------------------------------- session page

  function sessionView(signal, id) {
    document.title = `${id} · respcoord`;
    crumbs.replaceChildren(h('a', { href: './', 'data-nav': true }, 'Sessions'), ' › ',
      h('span', { class: 'mono', 'aria-current': 'page' }, id));
    const notice = noticeBox();
    const dl = h('dl');
    const field = (label, testid, cls) => {
      const dd = h('dd', { 'data-testid': testid, class: cls });
      dl.append(h('div', {}, h('dt', {}, label), dd));
      return dd;
    };
    const phase = field('Phase', 'state-phase');
    const live = field('Live response', 'state-live', 'mono');
    const source = field('Source', 'state-source');
    const revision = field('Revision', 'state-revision', 'num');
    const started = field('Responses started', 'state-responses-started', 'num');
    const terminated = field('Terminated', 'state-terminated');
    const historyNote = h('p', { class: 'muted', 'data-testid': 'history-note' });
    const timeline = createTimeline();
    const tbody = h('tbody');
    const eventsWrap = h('div', { class: 'table-wrap events-wrap', tabindex: '0', role: 'region', 'aria-label': 'Events, newest last' },
      h('table', { class: 'events', 'data-testid': 'events-table' },
        h('thead', {}, h('tr', {}, th('Revision', 'num'), th('Seq', 'num'), th('Time', 'num'),
          th('Kind'), th('Response', 'num'), th('Source / status / reason'))),
        tbody));
    const body = h('div', { hidden: true }, // until the first snapshot
      h('section', { class: 'card state', 'aria-labelledby': 'state-h' }, h('h2', { id: 'state-h' }, 'State'), dl),
      h('section', { 'aria-labelledby': 'timeline-h' }, h('h2', { id: 'timeline-h' }, 'Timeline'), timeline.root),
      h('section', { 'aria-labelledby': 'events-h' }, h('h2', { id: 'events-h' }, 'Events'), historyNote, eventsWrap));
    app.replaceChildren(h('h1', {}, 'Session ', h('span', { class: 'mono', 'data-testid': 'session-id' }, id)), notice.el, body);

    let state = null;
    let countedAt = 0; // the revision whose state carried responses_started
    let ended = null; // { reason, time_ms, revision } once terminated
    const responses = new Map();
    let lastRevision = 0;

    function renderState() {
      phase.replaceChildren(badge(state.phase, 'state-phase-badge'));
      phase.dataset.phase = state.phase;
      live.textContent = responseText(state.active_response_id);
      source.textContent = isId(state.active_response_id) ? state.active_source : dash;
      revision.textContent = String(state.revision);
      // An event's `session` has no responses_started: say how old the count is.
      started.textContent = `${state.responses_started}${countedAt === state.revision ? '' : ` (at revision ${countedAt})`}`;
      terminated.textContent = ended ? `${ended.reason || 'yes'} at ${clock(ended.time_ms)}` : dash;
    }

    function upsertResponse(r) {
      responses.set(r.response_id, r);
      if (responses.size > MAX_RESPONSES) responses.delete([...responses.keys()].sort(byId)[0]);
    }

    function appendEvent(e) {
      if (e.revision <= lastRevision) return;
      lastRevision = e.revision;
      tbody.append(h('tr', { 'data-testid': 'event-row', 'data-kind': e.kind, 'data-revision': e.revision },
        h('td', { class: 'num' }, String(e.revision)),
        h('td', { class: 'num' }, String(e.seq)),
        h('td', { class: 'num' }, h('time', { datetime: new Date(e.time_ms).toISOString() }, clock(e.time_ms))),
        h('td', {}, e.kind),
        h('td', { class: 'num mono' }, e.response_id == null ? dash : `#${e.response_id}`),
        h('td', {}, [e.source, e.status, e.reason].filter(Boolean).join(' · ') || dash)));
      while (tbody.children.length > MAX_EVENTS) tbody.firstElementChild.remove();
    }

    // Keeps the newest row in view unless the reader scrolled up.
    function following(fn) {
      const atBottom = eventsWrap.scrollTop + eventsWrap.clientHeight >= eventsWrap.scrollHeight - 24;
      fn();
      if (atBottom) eventsWrap.scrollTop = eventsWrap.scrollHeight;
    }

    const redraw = () => timeline.draw(responses, Date.now());
    every(signal, 250, () => { // live bars run to "now"
      for (const r of responses.values()) if (r.status == null) return redraw();
    });

    follow(signal, {
      // The id goes in the query string: it may hold `/` (docs/web-ui.md).
      url: (after) => apiUrl('session/feed', { id, after_revision: after }),
      notice,
      what: `session ${id}`,
      notFound: (err) => `No session ${id} (404: ${err.message}); waiting for it to appear.`,
      finished: () => ended != null,
      message(msg) {
        if (msg.event === 'snapshot') {
          const snap = JSON.parse(msg.data);
          state = snap.state;
          countedAt = state.revision;
          ended = snap.terminated;
          responses.clear();
          for (const r of snap.responses) upsertResponse(r);
          lastRevision = 0;
          body.hidden = false; // before scrolling to the newest event
          following(() => {
            tbody.replaceChildren();
            for (const e of snap.events) appendEvent(e);
          });
          historyNote.textContent = snap.oldest_revision > 0
            ? `The retained history starts after revision ${snap.oldest_revision}; older events are gone.` : '';
          renderState();
          redraw();
          markSnapshotRendered();
          return String(state.revision);
        }
        if (msg.event === 'event') {
          // The rows the event changed (a supersede's `started` changes two)
          // and the session as the event left it.
          const d = JSON.parse(msg.data);
          for (const r of d.responses) upsertResponse(r);
          state = { ...state, ...d.session };
          if ('responses_started' in d.session) countedAt = state.revision;
          ended = d.terminated;
          following(() => appendEvent(d.event));
          renderState();
          redraw();
          return String(d.event.revision);
        }
        return null;
      },
    });
  }

  // ----------------------------------------------------------------- router

  function route() {
    view?.abort();
    view = new AbortController();
    delete app.dataset.snapshot;
    forgetButton.hidden = !getToken();
    setStatus('connecting', '');
    const params = new URLSearchParams(location.search);
    const session = params.get('session');
    if (session) sessionView(view.signal, session);
    else sessionsView(view.signal, params.get('prefix') || '');
  }

  document.addEventListener('click', (e) => {
    const link = e.target.closest('a[data-nav]');
    if (!link || e.defaultPrevented || e.button !== 0 || e.metaKey || e.ctrlKey || e.shiftKey || e.altKey) return;
    e.preventDefault();
    history.pushState(null, '', link.href);
    route();
    app.focus();
  });
  window.addEventListener('popstate', route);
  route();
})();

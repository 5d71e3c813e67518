// chorus serve: the one-page dashboard. Pages (by the address's #):
//   #/                  the runs, by project and group, the newest first
//   #/run/PATH          a run: identity, ranks, config, summary, artifacts,
//                       its events (events.js, marked on its charts too), a chart
//                       per metric, its histograms, its images, text and tables
//                       (media.js), system metrics, the distributed view
//   #/group/PATH        a group's runs side by side, their metrics overlaid
//   #/compare/P1|P2...  any runs overlaid on the same charts
// With boot.js (the page's first request, asked early), format.js (values and units), charts.js (a chart), histograms.js (a
// histogram panel), media.js and events.js, loaded before it. Data comes from the server's JSON API (/api/...), live changes from its
// event stream (/api/events). Every text from a run is put in as text, never as HTML.
'use strict';

const chorus = (window.chorus = { charts: [], histograms: [], media: [], events: null, page: null });

// ---------- helpers ----------

function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const k in attrs) {
    const v = attrs[k];
    if (v === null || v === undefined || v === false) continue;
    if (k === 'class') el.className = v;
    else if (k === 'text') el.textContent = v;
    else if (k.startsWith('on')) el.addEventListener(k.slice(2), v);
    else el.setAttribute(k, v === true ? '' : v);
  }
  appendAll(el, children);
  return el;
}

// Appends `list`'s nodes and texts (lists within it flattened; null, undefined and false left out).
function appendAll(el, list) {
  for (const c of list) {
    if (c === null || c === undefined || c === false) continue;
    if (Array.isArray(c)) appendAll(el, c);
    else if (c instanceof Node) el.appendChild(c);
    else el.appendChild(document.createTextNode(String(c)));
  }
}

async function api(path, params) {
  const url = apiUrl(path, params);
  // The page's first request, asked by boot.js as the page loaded.
  const asked = early && early.url === url ? early.answer : null;
  if (asked) early.url = null;
  const res = await (asked || fetch(url, { credentials: 'same-origin' }));
  let body;
  try {
    body = await res.json();
  } catch (e) {
    body = { error: 'the server answered ' + res.status + ' ' + res.statusText };
  }
  if (!res.ok && !body.error) body.error = 'the server answered ' + res.status;
  body.httpStatus = res.status;
  return body;
}

// ---------- settings, shared by every chart ----------

const settings = Object.assign({ x: 'step', smooth: 0, log: false, ranks: true },
  JSON.parse(localStorage.getItem('chorus.settings') || '{}'));
function saveSettings() { localStorage.setItem('chorus.settings', JSON.stringify(settings)); }

function setupControls() {
  const x = document.getElementById('xaxis'), sm = document.getElementById('smooth');
  const smv = document.getElementById('smooth-value'), log = document.getElementById('logscale');
  const ranks = document.getElementById('ranks');
  x.value = settings.x; sm.value = settings.smooth; smv.textContent = settings.smooth;
  log.checked = settings.log; ranks.checked = settings.ranks;
  x.addEventListener('change', () => {
    settings.x = x.value; saveSettings();
    chorus.charts.forEach((c) => c.reset());
    chorus.histograms.forEach((p) => p.draw());
  });
  sm.addEventListener('input', () => {
    settings.smooth = Number(sm.value); smv.textContent = settings.smooth; saveSettings();
    chorus.charts.forEach((c) => c.draw());
  });
  log.addEventListener('change', () => { settings.log = log.checked; saveSettings(); chorus.charts.forEach((c) => c.draw()); });
  ranks.addEventListener('change', () => {
    settings.ranks = ranks.checked; saveSettings();
    chorus.charts.forEach((c) => { c.forced.clear(); c.draw(); });
  });
}

function setLive(on, text) {
  const el = document.getElementById('live');
  el.className = on === null ? '' : on ? 'on' : 'off';
  el.textContent = text || '';
}

// ---------- pages ----------

function clearPage() {
  if (chorus.page && chorus.page.close) chorus.page.close();
  chorus.charts.forEach((c) => c.destroy());
  chorus.charts = [];
  chorus.histograms.forEach((p) => p.destroy());
  chorus.histograms = [];
  chorus.media.forEach((p) => p.destroy());
  chorus.media = [];
  if (chorus.events) chorus.events.close();
  chorus.events = null;
  chorus.page = null;
  setLive(null);
}

function crumbs(...parts) {
  document.getElementById('crumbs').replaceChildren(...parts.flatMap((p, i) => [i ? ' / ' : '', p]));
}

function errorBox(text) { return h('div', { class: 'error', text }); }

// Follows runs' changes through the server's event stream.
function follow(runs, handlers) {
  const q = new URLSearchParams();
  runs.forEach((r) => q.append('run', r));
  const es = new EventSource('/api/events?' + q);
  es.onopen = () => setLive(true, 'live');
  es.onerror = () => setLive(false, 'reconnecting');
  for (const [name, fn] of Object.entries(handlers))
    es.addEventListener(name, (e) => { try { fn(JSON.parse(e.data)); } catch (err) { console.error(err); } });
  return es;
}

// --- the runs ---

// The runs list's columns and their widths (the same in each of its parts).
const runColumns = [['', '30px'], ['run', '22%'], ['state', '10%'], ['ranks', '6%'], ['started', '13%'], ['duration', '7%'],
  ['rows', '7%'], ['summary', 'auto']];
const partRows = 40;
// No row of the list is shorter than this (px): the rows down to a place in the window are counted by it.
const minRowPx = 20;

async function runsPage(view) {
  crumbs(h('span', { text: 'runs' }));
  const top = h('div', { class: 'toolbar' });
  const filter = h('input', { type: 'search', placeholder: 'filter: name, id, group, job type, notes, host', id: 'filter' });
  const state = h('select', { id: 'state-filter' }, ['all states', 'running', 'finished', 'failed', 'crashed', 'killed', 'unreadable']
    .map((s) => h('option', { value: s === 'all states' ? '' : s, text: s })));
  const compare = h('button', { id: 'compare', disabled: true, text: 'compare selected' });
  const count = h('span', { class: 'note' });
  top.append(filter, state, compare, count);
  const rootNote = h('p', { class: 'note' });
  // The list: a head, then the rows in parts of `partRows` (tables of one
  // set of columns), each laid out and painted only near the screen
  // (content-visibility): a list of thousands of runs shows at once.
  const table = h('div', { class: 'runs', id: 'runs' });
  view.replaceChildren(h('h1', { text: 'Runs' }), rootNote, top, table);
  const picked = new Set();
  let data = null;
  let renders = 0;
  const saved = JSON.parse(sessionStorage.getItem('chorus.filter') || '{}');
  filter.value = saved.text || '';
  state.value = saved.state || '';

  // The filter's test of a run, made once a render (a list of thousands is not filtered by nothing).
  const matcher = () => {
    const st = state.value;
    const words = filter.value.toLowerCase().split(/\s+/).filter(Boolean);
    if (!st && !words.length) return null;
    return (r) => {
      if (st && !(r.shown_state || '').startsWith(st) && r.state !== st) return false;
      const hay = [r.name, r.id, r.project, r.group, r.job_type, r.notes, r.host, r.mode, r.path].join(' ').toLowerCase();
      return words.every((w) => hay.includes(w));
    };
  };
  const render = () => {
    sessionStorage.setItem('chorus.filter', JSON.stringify({ text: filter.value, state: state.value }));
    if (!data) return;
    rootNote.textContent = 'under ' + data.root;
    // Runs the server's user may not read are left out: say how many, and why the first.
    if (data.not_shown) rootNote.append(h('span', { id: 'not-shown', title: data.not_shown_why || '',
      text: ` (${data.not_shown} ${data.not_shown === 1 ? 'run' : 'runs'} not shown: ${data.not_shown_why || ''})` }));
    // What the list shows, in order: a group's line, then its runs.
    const items = [];
    let shown = 0;
    // Groups by their newest run, the newest first.
    const groups = data.groups.slice().sort((a, b) => (b.runs[0].start_time || 0) - (a.runs[0].start_time || 0));
    const matches = matcher();
    for (const g of groups) {
      const runs = matches ? g.runs.filter(matches) : g.runs;
      if (!runs.length) continue;
      items.push({ g });
      for (const r of runs) items.push({ r });
      shown += runs.length;
    }
    const rowOf = ({ g, r }) => {
      if (g) {
        const m = g.manifest;
        return h('tr', { class: 'group' }, h('td', { colspan: 8 },
          g.project, g.group ? ' / ' : '', g.group ? h('a', { href: '#/group/' + encodeURI(g.path), text: g.group }) : '',
          m ? h('span', { class: 'note' }, '  ', badge(m.state), ` ${m.size} runs, ${m.mode}${m.scope ? ', ' + m.scope : ''}`) : '',
          g.error ? h('span', { class: 'note', text: '  group.json: ' + g.error }) : ''));
      }
      const summary = Object.entries(r.summary || {}).map(([k, v]) => `${k}=${fmtValue(k, v)}`).join('  ');
      return h('tr', { class: 'run', 'data-path': r.path },
        h('td', {}, h('input', { type: 'checkbox', 'data-path': r.path, checked: picked.has(r.path) })),
        h('td', {}, runLink(r.path, r.name || r.id), r.name && r.name !== r.id ? h('span', { class: 'note', text: ' ' + r.id }) : ''),
        h('td', {}, badge(r.shown_state), r.error || r.host_lost || r.files_cut ? h('div', { class: 'note', text: r.error || (r.host_lost ? 'its host was lost' : 'files cut short: chorus recover rebuilds them'), title: r.run_error || '' }) : ''),
        h('td', { class: 'num', text: (r.world_size ?? '') + (r.crashed_ranks ? ` (${r.crashed_ranks} crashed)` : '') }),
        h('td', { text: fmtTime(r.start_time) }),
        h('td', { class: 'num', text: fmtDuration(r.duration) }),
        h('td', { class: 'num', text: r.rows ?? '' }),
        h('td', { class: 'summary', text: summary }));
    };
    const part = (trs, head) => h('table', { class: 'runs-part' + (head ? ' runs-head' : '') },
      h('colgroup', {}, runColumns.map(([, w]) => h('col', { style: 'width:' + w }))), trs);
    const rowsFrom = (i) => h('div', { class: 'runs-rows', style: `contain-intrinsic-size:auto ${Math.min(partRows, items.length - i) * 29}px` },
      part(items.slice(i, i + partRows).map(rowOf)));
    // The parts down to the window's bottom (where it is scrolled to: a list
    // read again keeps its place) are built now; the others after the next
    // paint, a few milliseconds' worth a task, so that a list of thousands
    // shows at once. A newer render stops an older one's.
    const built = ++renders;
    const now = Math.ceil((window.scrollY + window.innerHeight) / minRowPx / partRows) * partRows;
    const parts = [part([h('tr', {}, runColumns.map(([t]) => h('th', { text: t })))], true)];
    let i = 0;
    for (; i < items.length && i < now; i += partRows) parts.push(rowsFrom(i));
    // The run at the window's top stays where it was: the parts above it are
    // new, and until drawn they are as tall as their rows would be at 29 px.
    const firstBelowTop = (els) => [...els].find((el) => el.getBoundingClientRect().bottom > 0);
    const shownPart = window.scrollY > 0 && firstBelowTop(table.querySelectorAll('.runs-rows'));
    const anchor = shownPart && firstBelowTop(shownPart.querySelectorAll('tr.run'));
    const was = anchor && anchor.getBoundingClientRect().top;
    table.replaceChildren(...parts);
    const same = anchor && table.querySelector(`tr.run[data-path="${CSS.escape(anchor.dataset.path)}"]`);
    if (same) window.scrollBy(0, same.getBoundingClientRect().top - was);
    const more = () => {
      if (built !== renders || !table.isConnected) return; // a newer render, or another page
      const batch = [];
      for (const t0 = performance.now(); i < items.length && performance.now() - t0 < 8; i += partRows) batch.push(rowsFrom(i));
      table.append(...batch);
      if (i < items.length) setTimeout(more, 0);
    };
    if (i < items.length) requestAnimationFrame(() => setTimeout(more, 0));
    count.textContent = `${shown} of ${data.count} runs`;
    if (!data.count) table.replaceChildren(h('p', { class: 'note', text: 'no runs under ' + data.root + ' yet' }));
  };
  // One listener for every row's box.
  table.addEventListener('change', (e) => {
    const path = e.target.matches('input[type=checkbox][data-path]') && e.target.dataset.path;
    if (!path) return;
    if (e.target.checked) picked.add(path); else picked.delete(path);
    compare.disabled = picked.size < 2;
    compare.textContent = 'compare selected' + (picked.size ? ` (${picked.size})` : '');
  });
  filter.addEventListener('input', render);
  state.addEventListener('change', render);
  compare.addEventListener('click', () => { location.hash = '#/compare/' + [...picked].map(encodeURIComponent).join('|'); });
  const load = async () => {
    const r = await api('runs');
    if (r.error) { view.prepend(errorBox(r.error)); return; }
    data = r;
    render();
  };
  await load();
  // The list is read again when the server tells it changed (a new run, a
  // run's state or summary, a running run's progress): nothing is asked
  // while nothing changes.
  const es = new EventSource('/api/runs/stream?' + new URLSearchParams({ since: (data && data.version) || '' }));
  es.onopen = () => setLive(true, 'live');
  es.onerror = () => setLive(false, 'reconnecting');
  es.addEventListener('changed', load);
  chorus.page = { close: () => es.close(), reload: load };
}

// --- a run ---

function kvTable(obj, cls) {
  const t = h('table', { class: 'kv ' + (cls || '') });
  for (const [k, v] of Object.entries(obj)) {
    if (v === '' || v === null || v === undefined) continue;
    t.append(h('tr', {}, h('td', { text: k }), h('td', {}, v instanceof Node ? v : String(v))));
  }
  return t;
}

function jsonTable(obj) {
  if (obj === null || obj === undefined) return h('p', { class: 'note', text: 'none' });
  if (typeof obj !== 'object' || Array.isArray(obj)) return h('pre', { text: JSON.stringify(obj, null, 2) });
  const t = h('table', { class: 'kv' });
  for (const [k, v] of Object.entries(obj))
    t.append(h('tr', {}, h('td', { text: k }), h('td', { text: typeof v === 'object' ? JSON.stringify(v) : fmtValue(k, v),
      title: typeof v === 'number' && timeKey(k) ? fmtExact(v) : null })));
  return t;
}

// summary.json, each value declared as a key's min, max or mean (not its last) saying so.
function summaryTable(run) {
  const t = jsonTable(run.summary);
  for (const tr of t.querySelectorAll('tr')) {
    const key = tr.firstChild.textContent, d = run.metrics && run.metrics[baseKey(key)];
    if (d && d.summary && d.summary !== 'last') tr.lastChild.append(h('span', { class: 'note', text: ` (${d.summary})` }));
  }
  return t;
}

function ranksTable(run) {
  const t = h('table', { id: 'ranks-table' }, h('tr', {}, ['rank', 'state', 'last step', 'exit code', 'host', 'message', 'holds others back'].map((x) => h('th', { text: x }))));
  const lag = new Map((run.laggards || []).map((l) => [l.rank, l.why]));
  for (const k of run.ranks || [])
    t.append(h('tr', { 'data-rank': k.rank, class: lag.has(k.rank) ? 'laggard' : '' }, h('td', { class: 'num', text: k.rank }), h('td', {}, badge(k.state)),
      h('td', { class: 'num', text: k.last_step < 0 ? '-' : k.last_step + (k.committed ? ' (committed)' : '') }),
      h('td', { class: 'num', text: k.exit_code ?? '' }), h('td', { text: k.host }), h('td', { text: k.message }),
      h('td', { class: 'lag', text: lag.has(k.rank) ? '⚑ ' + lag.get(k.rank) : '' })));
  return t;
}

// Barriers (barriers.jsonl): per rank its waits in all, then each barrier's
// wait per rank, the newest first; a rank that never reached one is marked.
function barriersView(run) {
  const b = run.barriers;
  if (!b || b.missing) return h('p', { class: 'note', text: 'no barrier released yet (barriers.jsonl)' });
  const out = h('div', { id: 'barriers' });
  if (b.error) out.append(errorBox(b.error));
  const ranks = [...new Set(b.records.flatMap((r) => r.ranks.map((k) => k.rank)))].sort((x, y) => x - y);
  const totals = h('table', { id: 'barrier-totals' }, h('tr', {}, ['rank', 'barriers', 'waited in all', 'came last', 'others waited for it', 'never reached'].map((x) => h('th', { text: x }))));
  const lag = new Set((run.laggards || []).map((l) => l.rank));
  for (const k of b.ranks)
    totals.append(h('tr', { 'data-rank': k.rank, class: lag.has(k.rank) ? 'laggard' : '' }, h('td', { class: 'num', text: k.rank }),
      h('td', { class: 'num', text: k.barriers }), h('td', { class: 'num', text: fmtSeconds(k.waited) }),
      h('td', { class: 'num', text: k.last }), h('td', { class: 'num', text: fmtSeconds(k.caused) }), h('td', { class: 'num', text: k.absent })));
  const t = h('table', { id: 'barrier-waits' }, h('tr', {}, ['#', 'barrier', 'step', 'released', ...ranks.map((r) => 'rank ' + r), 'error'].map((x) => h('th', { text: x }))));
  const most = Math.max(1e-9, ...b.records.flatMap((r) => r.ranks.map((k) => k.waited || 0)));
  for (const r of [...b.records].reverse()) {
    const cells = ranks.map((rank) => {
      const k = r.ranks.find((x) => x.rank === rank);
      if (!k) return h('td', {});
      if (k.arrived === null) return h('td', { class: 'num absent', text: 'never came' });
      const bar = h('span', { class: 'bar', style: `width:${Math.round(60 * k.waited / most)}px` });
      return h('td', { class: 'num', title: 'arrived ' + fmtTime(k.arrived) }, bar, fmtSeconds(k.waited));
    });
    t.append(h('tr', {}, h('td', { class: 'num', text: r.index }), h('td', { text: r.name }), h('td', { class: 'num', text: r.step }),
      h('td', { text: fmtTime(r.released) }), ...cells, h('td', { class: 'lag', text: r.error || '' })));
  }
  out.append(h('p', { class: 'note', text: `${b.total} barrier(s)` + (b.failed ? `, ${b.failed} with an error` : '') + ': how long each rank waited at each (from its arrival to the release)' +
    (b.records.length < b.total ? `; the last ${b.records.length} listed` : '') }), totals, t);
  return out;
}

function fmtSeconds(s) {
  if (s === null || s === undefined) return '';
  return s < 1 ? (s * 1000).toFixed(1) + ' ms' : s.toFixed(3) + ' s';
}

function identityTable(run) {
  return kvTable({
    id: run.id, name: run.name !== run.id ? run.name : '', project: run.project, group: run.group,
    'job type': run.job_type, notes: run.notes, mode: run.mode + (run.scope ? ', scope ' + run.scope : ''),
    host: run.host + (run.pid ? ` (pid ${run.pid})` : ''), launcher: run.launcher && run.launcher !== 'none' ? run.launcher + (run.job_id ? ', job ' + run.job_id : '') : '',
    started: fmtTime(run.start_time), ended: fmtTime(run.end_time), duration: fmtDuration(run.duration),
    state: badge(run.shown_state), error: run.run_error || '', rows: run.history ? run.history.rows : run.rows,
    'last step': run.history && run.history.last_step >= 0 ? run.history.last_step : '',
  }, 'identity');
}

// The charts of a run's metrics: a chart per key (its per-rank columns with
// it), in sections by the key's prefix.
function metricSections(keys) {
  const charts = new Map();
  for (const k of keys) {
    if (k.key.startsWith('_')) continue;
    const base = baseKey(k.key);
    if (!charts.has(base)) charts.set(base, []);
    charts.get(base).push(k.key);
  }
  const sections = new Map();
  for (const [base, ks] of charts) {
    const prefix = base.includes('/') ? base.slice(0, base.indexOf('/') + 1) : '(no prefix)';
    if (!sections.has(prefix)) sections.set(prefix, []);
    ks.sort((a, b) => (perRank(a) - perRank(b)) || ((rankOf(a) ?? -1) - (rankOf(b) ?? -1)));
    sections.get(prefix).push([base, ks]);
  }
  return sections;
}

function systemCharts(keys) {
  // system.NAME/node-N and system.NAME/rank-N: a chart per NAME, per node and per rank.
  const out = { node: new Map(), rank: new Map() };
  for (const k of keys) {
    const m = /^system\.(.+)\/(node|rank)-(\d+)$/.exec(k.key);
    if (!m) continue;
    const by = out[m[2]];
    if (!by.has(m[1])) by.set(m[1], []);
    by.get(m[1]).push(k.key);
  }
  return out;
}
const timeAxis = (x) => (x === 'step' || x === '_step' ? 'rel' : x);

async function runPage(view, path) {
  crumbs(h('a', { href: '#/', text: 'runs' }), h('span', { text: path }));
  let run = await api('run', { run: path });
  if (run.httpStatus >= 400) { view.replaceChildren(errorBox(run.error)); return; }
  const head = h('div', { id: 'run-head' });
  const problems = h('div', { id: 'problems' });
  const overview = h('div', { class: 'grid', id: 'overview' });
  const eventsBox = h('div', { id: 'events' });
  const metrics = h('div', { id: 'metrics' });
  const histHead = h('h2', { text: 'Histograms', id: 'histograms-head', hidden: true });
  const hists = h('div', { class: 'charts hists', id: 'histograms', hidden: true });
  const mediaHead = h('h2', { text: 'Media', id: 'media-head', hidden: true });
  const mediaBox = h('div', { id: 'media', hidden: true });
  const system = h('div', { id: 'system' });
  const dist = h('div', { id: 'distributed' });
  const barriersBox = h('div', { id: 'barriers-box' });
  view.replaceChildren(head, problems, overview, h('h2', { text: 'Events', id: 'events-head' }), eventsBox,
    h('h2', { text: 'Metrics' }), metrics, histHead, hists, mediaHead, mediaBox, h('h2', { text: 'System' }), system, h('h2', { text: 'Distributed' }), dist, h('h3', { text: 'Barriers' }), barriersBox);

  const renderHead = () => {
    head.replaceChildren(h('h1', {}, run.name || run.id, ' ', badge(run.shown_state)),
      h('p', { class: 'note', id: 'progress', text: (run.history.indexing ? 'about ' : '') + `${run.history.rows} rows, last step ${run.history.last_step}` +
        (run.history.indexing ? ' (indexing the history: the charts show an overview until it is done)' : '') +
        (run.history.unfinished ? ' (a row is being written)' : '') }));
    problems.replaceChildren(...(run.errors || []).map(errorBox), ...(run.warnings || []).map((w) => h('div', { class: 'warning', text: w })));
    const artifacts = h('table', { id: 'artifacts' }, h('tr', {}, ['artifact', 'type', 'size', 'rank', 'step', 'logged'].map((x) => h('th', { text: x }))));
    for (const a of run.artifacts || [])
      artifacts.append(h('tr', {}, h('td', {}, a.available ? h('a', { href: '/api/artifact?' + new URLSearchParams({ run: path, name: a.name }), text: a.name }) : a.name),
        h('td', { text: a.type }), h('td', { class: 'num', text: a.size }), h('td', { class: 'num', text: a.rank }),
        h('td', { class: 'num', text: a.step }), h('td', { text: fmtTime(a.timestamp) })));
    overview.replaceChildren(
      h('div', {}, h('h2', { text: 'Run' }), identityTable(run), run.group_path ? h('p', {}, 'group: ', h('a', { href: '#/group/' + encodeURI(run.group_path), text: run.group_path })) : ''),
      h('div', {}, h('h2', { text: `Ranks (${(run.ranks || []).length})` }), ranksTable(run)),
      h('div', {}, h('h2', { text: 'Config' }), jsonTable(run.config)),
      h('div', {}, h('h2', { text: 'Summary' }), summaryTable(run)),
      (run.artifacts || []).length ? h('div', {}, h('h2', { text: 'Artifacts' }), artifacts) : '');
    barriersBox.replaceChildren(barriersView(run));
  };
  renderHead();
  // The run's events: listed, and marked on the charts once they are loaded (start(), below).
  chorus.events = new RunEvents(eventsBox, path, () => run);

  let shownKeys = new Set();
  const addMetricCharts = () => {
    for (const [prefix, list] of metricSections(run.history.keys)) {
      let section = metrics.querySelector(`[data-prefix="${CSS.escape(prefix)}"]`);
      if (!section) {
        section = h('div', { class: 'charts', 'data-prefix': prefix });
        metrics.append(h('h3', { text: prefix }), section);
      }
      for (const [base, ks] of list) {
        const existing = chorus.charts.find((c) => c.kind === 'metric' && c.title === base);
        if (existing) {
          const fresh = ks.filter((k) => !existing.sources.some((s) => s.key === k));
          if (fresh.length) { existing.sources.push(...fresh.map((k) => ({ run: path, key: k, label: k, rankColumn: perRank(k) }))); existing.refresh(); }
          continue;
        }
        // A key's per-rank columns (key/rank-N) follow its declaration.
        const c = new Chart(section, base, ks.map((k) => ({ run: path, key: k, label: k, rankColumn: perRank(k) })),
          { xkey: () => declaredX([run], base), keyCounts: (k) => run.history.keys.find((x) => x.key === k) });
        c.kind = 'metric';
      }
    }
    run.history.keys.forEach((k) => shownKeys.add(k.key));
    if (!metrics.children.length) metrics.replaceChildren(h('p', { class: 'note', text: run.history.missing ? 'no history.jsonl yet' : 'no metrics' }));
    else metrics.querySelectorAll(':scope > p.note').forEach((n) => n.remove());
  };
  addMetricCharts();

  const addSystemCharts = () => {
    const sys = systemCharts(run.system.keys);
    for (const [kind, title] of [['node', 'per node'], ['rank', 'per rank']]) {
      if (!sys[kind].size) continue;
      let section = system.querySelector(`[data-kind="${kind}"]`);
      if (!section) {
        section = h('div', { class: 'charts', 'data-kind': kind });
        system.append(h('h3', { text: title }), section);
      }
      for (const [name, ks] of sys[kind]) {
        const existing = chorus.charts.find((c) => c.kind === 'system-' + kind && c.title === name);
        const src = ks.map((k) => ({ run: path, file: 'system', key: k, label: k.slice(k.lastIndexOf('/') + 1) }));
        if (existing) {
          const fresh = src.filter((s) => !existing.sources.some((e) => e.key === s.key));
          if (fresh.length) { existing.sources.push(...fresh); existing.refresh(); }
          continue;
        }
        const c = new Chart(section, name, src, { axis: timeAxis });
        c.kind = 'system-' + kind;
      }
    }
    if (!system.children.length) system.replaceChildren(h('p', { class: 'note', text: 'no system samples (system.jsonl)' }));
    else system.querySelectorAll(':scope > p.note').forEach((n) => n.remove());
  };
  addSystemCharts();

  // Histograms (histograms.jsonl): a panel per key, shown once there is one.
  const addHistograms = () => {
    const columns = (run.histograms && run.histograms.columns) || [];
    histHead.hidden = hists.hidden = !columns.length;
    histogramPanels(hists, path, columns);
  };
  addHistograms();

  // Images, text and tables (media.jsonl): a panel per key, shown once there is one.
  const addMedia = () => {
    const keys = (run.media && run.media.keys) || [];
    mediaHead.hidden = mediaBox.hidden = !keys.length;
    mediaPanels(mediaBox, path, keys);
  };
  addMedia();

  // The distributed view: each rank's progress over time, crashed ranks
  // marked at their last step, and rows some ranks did not contribute to.
  const addDistributed = () => {
    dist.replaceChildren();
    const keys = run.history.keys.map((k) => k.key);
    const progress = keys.filter((k) => k.startsWith('_progress/rank-')).sort((a, b) => rankOf(a) - rankOf(b));
    const sources = progress.length ? progress.map((k) => ({ run: path, key: k, label: 'rank ' + rankOf(k), noSmooth: true }))
      : keys.includes('_step') ? [{ run: path, key: '_step', label: 'run', noSmooth: true }] : [];
    const world = run.world_size || (run.ranks || []).length || 1;
    const section = h('div', { class: 'charts' });
    dist.append(h('p', { class: 'note', text: progress.length
      ? 'each rank\'s step over time, from the rows where it has a per-rank value (key/rank-N); ✕ marks a crashed rank at its last step'
      : 'the run\'s step over time (no per-rank columns to tell the ranks apart); ✕ marks a crashed rank at its last step' }), section);
    if (sources.length) {
      const c = new Chart(section, 'progress: step over time', sources, {
        axis: timeAxis,
        annotate: (chart) => {
          const notes = [];
          for (const k of run.ranks || []) {
            if (k.state !== 'crashed' && k.state !== 'failed' && k.state !== 'killed') continue;
            const at = progress.length ? sources.findIndex((s) => s.label === 'rank ' + k.rank) : 0;
            const d = chart.data && chart.data[at];
            if (at < 0 || !d || !d.x.length) continue;
            // The rank's last point at or before its last step.
            let j = d.y.length - 1;
            while (j > 0 && d.y[j] > k.last_step) j--;
            notes.push({ series: sources[at].label, x: d.x[j], shortText: '✕', text: `rank ${k.rank} ${k.state} at step ${k.last_step}${k.message ? ': ' + k.message : ''}` });
          }
          return notes;
        },
      });
      c.kind = 'progress';
    }
    if (keys.includes('_count/min')) {
      const c = new Chart(section, 'contributions: fewest ranks behind a reduced value', [{ run: path, key: '_count/min', label: 'fewest ranks', noSmooth: true }], {
        extra: () => ({
          labels: ['ranks', 'missing contributions'],
          values: (r) => [world, r[1] !== null && r[1] < world ? r[1] : null],
          series: { ranks: { strokePattern: [4, 4], strokeWidth: 1 }, 'missing contributions': { drawPoints: true, pointSize: 3, strokeWidth: 0 } },
        }),
      });
      c.kind = 'contributions';
    }
    if (!section.children.length) section.append(h('p', { class: 'note', text: 'no rows yet' }));
  };
  addDistributed();
  loadPanelsInView();

  // Live: new rows, ranks' states and system samples, as the files change.
  let rows = run.history.rows, sysRows = run.system.rows, keyCount = run.history.keys.length, indexing = run.history.indexing;
  let sysIndexing = run.system.indexing;
  let histRows = run.histograms.rows, histSkipped = run.histograms.skipped, histIndexing = run.histograms.indexing;
  let mediaLines = run.media.rows + run.media.skipped, mediaIndexing = run.media.indexing;
  const reloadRun = async () => {
    const r = await api('run', { run: path });
    if (r.httpStatus >= 400) return;
    const declared = JSON.stringify(run.metrics || {}) + JSON.stringify((run.history.keys || []).map((k) => k.key));
    run = r;
    renderHead();
    // A declaration made late, or a step metric's first value: the charts' x may change.
    if (JSON.stringify(run.metrics || {}) + JSON.stringify((run.history.keys || []).map((k) => k.key)) !== declared)
      chorus.charts.filter((c) => c.kind === 'metric').forEach((c) => { if (c.xChoice().used !== c.axisUsed) c.reset(); });
  };
  const es = follow([path], {
    history: async (e) => {
      if (e.rows === rows && e.keys === keyCount && e.indexing === indexing) return;
      rows = e.rows;
      indexing = e.indexing;
      // The index whole: every chart is drawn from it again (none reads the file any more).
      if (!indexing) chorus.charts.filter((c) => !c.kind.startsWith('system')).forEach((c) => { c.exact = false; });
      await reloadRun();
      if (run.history.keys.length !== keyCount) {
        keyCount = run.history.keys.length;
        addMetricCharts();
        addDistributed();
      }
      chorus.charts.filter((c) => !c.kind.startsWith('system')).forEach((c) => c.refresh());
    },
    system: async (e) => {
      // New samples, or a long system.jsonl's index now whole (its overview's curves replaced).
      if (e.rows === sysRows && e.indexing === sysIndexing) return;
      sysRows = e.rows;
      sysIndexing = e.indexing;
      if (!sysIndexing) chorus.charts.filter((c) => c.kind.startsWith('system')).forEach((c) => { c.exact = false; });
      await reloadRun();
      addSystemCharts();
      chorus.charts.filter((c) => c.kind.startsWith('system')).forEach((c) => c.refresh());
    },
    histograms: async (e) => {
      if (e.rows === histRows && e.skipped === histSkipped && e.indexing === histIndexing) return;
      histRows = e.rows;
      histSkipped = e.skipped;
      histIndexing = e.indexing;
      await reloadRun();
      addHistograms();
      chorus.histograms.forEach((p) => p.refresh());
    },
    media: async (e) => {
      if (e.rows + e.skipped === mediaLines && e.indexing === mediaIndexing) return;
      mediaLines = e.rows + e.skipped;
      mediaIndexing = e.indexing;
      await reloadRun();
      addMedia();
      chorus.media.forEach((p) => p.refresh());
    },
    run: async (e) => {
      // The stream's first look tells what /api/run just said: read again only what changed.
      if (e.stamp === run.stamp && e.shown_state === run.shown_state && e.host_life === run.host_life) return;
      await reloadRun();
      chorus.charts.filter((c) => c.kind === 'progress').forEach((c) => c.draw());
    },
    events: (e) => { if (chorus.events) chorus.events.changed(e); },
  });
  chorus.page = { close: () => es.close(), run: () => run };
  // After the charts: the page's first paint does not wait for the events.
  chorus.events.start();
}

// --- runs laid over each other: a group's, or any picked ---

async function overlayCharts(parent, runs, labelOf) {
  // A chart per key that some run logged (per-rank columns left out), a curve per run.
  const order = [], byKey = new Map();
  runs.forEach((r) => {
    for (const k of (r.history && r.history.keys) || []) {
      if (k.key.startsWith('_') || perRank(k.key)) continue;
      if (!byKey.has(k.key)) { byKey.set(k.key, []); order.push(k.key); }
      byKey.get(k.key).push(r);
    }
  });
  const sections = new Map();
  for (const key of order) {
    const prefix = key.includes('/') ? key.slice(0, key.indexOf('/') + 1) : '(no prefix)';
    if (!sections.has(prefix)) {
      const s = h('div', { class: 'charts', 'data-prefix': prefix });
      parent.append(h('h3', { text: prefix }), s);
      sections.set(prefix, s);
    }
    // Each run's own declaration: where they differ, _step.
    const c = new Chart(sections.get(prefix), key, byKey.get(key).map((r) => ({ run: r.path, key, label: labelOf(r), title: r.path })),
      { xkey: () => declaredX(byKey.get(key), key) });
    c.kind = 'overlay';
  }
  if (!order.length) parent.append(h('p', { class: 'note', text: 'no metrics in these runs' }));
}

async function groupPage(view, path) {
  crumbs(h('a', { href: '#/', text: 'runs' }), h('span', { text: path }));
  const g = await api('group', { group: path });
  if (g.httpStatus >= 400) { view.replaceChildren(errorBox(g.error)); return; }
  const m = g.manifest;
  const members = h('table', { id: 'members' }, h('tr', {}, ['member', 'run', 'state', 'host', 'node', 'ranks', 'last step', 'rows', 'exit codes', 'duration', 'message'].map((x) => h('th', { text: x }))));
  for (const x of g.members)
    members.append(h('tr', { class: x.behind ? 'laggard' : '', 'data-member': x.label }, h('td', { text: x.label }), h('td', {}, x.path ? runLink(x.path, x.id) : x.id),
      h('td', {}, badge(x.state)), h('td', { text: x.host || '' }), h('td', { class: 'num', text: x.node ?? '' }),
      h('td', { text: x.ranks }), h('td', { class: 'num' + (x.behind ? ' lag' : ''), text: (x.last_step < 0 ? '-' : x.last_step) + (x.behind ? ` (⚑ ${x.behind} behind)` : '') }),
      h('td', { class: 'num', text: x.rows ?? '' }), h('td', { text: x.exit_codes }),
      h('td', { class: 'num', text: x.start_time && x.end_time ? fmtDuration(x.end_time - x.start_time) : '' }),
      h('td', { text: (x.message || '') + (x.error ? ' ' + x.error : '') })));
  const charts = h('div', { id: 'group-charts' });
  view.replaceChildren(h('h1', {}, g.name, ' ', m ? badge(m.state) : ''),
    g.error ? errorBox(g.error) : '',
    m ? kvTable({ project: g.project, runs: m.size, mode: m.mode + (m.scope ? ', scope ' + m.scope : ''), launcher: m.launcher, job: m.job_id, host: m.host,
      started: fmtTime(m.start_time), ended: fmtTime(m.end_time), duration: m.start_time && m.end_time ? fmtDuration(m.end_time - m.start_time) : '',
      'exit codes': Object.entries(m.exit_codes || {}).map(([r, c]) => `${r}=${c}`).join(' ') }) : h('p', { class: 'note', text: 'no group.json: the runs found in ' + path }),
    h('h2', { text: 'Members' }), members, h('h2', { text: 'Progress' }), h('div', { class: 'charts', id: 'group-progress' }),
    h('h2', { text: 'Metrics, a curve per member' }), charts);
  const paths = g.members.filter((x) => x.path).map((x) => x.path);
  const runs = (await Promise.all(paths.map((p) => api('run', { run: p })))).filter((r) => !r.error || r.history);
  const label = (r) => (g.members.find((x) => x.path === r.path) || {}).label || r.id;
  const progress = runs.filter((r) => r.history && r.history.keys.some((k) => k.key === '_step'));
  if (progress.length) {
    const c = new Chart(document.getElementById('group-progress'), 'progress: step over time',
      progress.map((r) => ({ run: r.path, key: '_step', label: label(r), noSmooth: true })), {
        axis: timeAxis,
        annotate: (chart) => progress.flatMap((r, i) => {
          const d = chart.data && chart.data[i];
          if (!d || !d.x.length || !['crashed', 'failed', 'killed'].includes(r.state)) return [];
          return [{ series: label(r), x: d.x[d.x.length - 1], shortText: '✕', text: `${label(r)} ${r.shown_state} at step ${d.y[d.y.length - 1]}` }];
        }),
      });
    c.kind = 'progress';
  }
  await overlayCharts(charts, runs, label);
  const es = paths.length ? follow(paths.slice(0, 16), { history: () => chorus.charts.forEach((c) => c.refresh()) }) : null;
  chorus.page = { close: () => es && es.close() };
}

async function comparePage(view, paths) {
  crumbs(h('a', { href: '#/', text: 'runs' }), h('span', { text: 'compare ' + paths.length + ' runs' }));
  const runs = await Promise.all(paths.map((p) => api('run', { run: p })));
  const table = h('table', { id: 'compared' }, h('tr', {}, ['run', 'project / group', 'state', 'ranks', 'started', 'duration', 'rows'].map((x) => h('th', { text: x }))));
  runs.forEach((r, i) => {
    if (r.httpStatus >= 400) { table.append(h('tr', {}, h('td', { text: paths[i] }), h('td', { colspan: 6, class: 'error', text: r.error }))); return; }
    table.append(h('tr', {}, h('td', {}, runLink(r.path, r.name || r.id)), h('td', { text: r.project + ' / ' + r.group }), h('td', {}, badge(r.shown_state)),
      h('td', { class: 'num', text: r.world_size ?? '' }), h('td', { text: fmtTime(r.start_time) }), h('td', { class: 'num', text: fmtDuration(r.duration) }),
      h('td', { class: 'num', text: r.history.rows })));
  });
  const charts = h('div', { id: 'compare-charts' });
  view.replaceChildren(h('h1', { text: 'Compare' }), table, h('h2', { text: 'Metrics, a curve per run' }), charts);
  const ok = runs.filter((r) => r.httpStatus < 400);
  // Runs of the same name get their id beside it.
  const names = ok.map((r) => r.name || r.id);
  const label = (r) => (names.filter((n) => n === (r.name || r.id)).length > 1 ? `${r.name} (${r.id})` : r.name || r.id);
  await overlayCharts(charts, ok, label);
  const es = ok.length ? follow(ok.slice(0, 16).map((r) => r.path), { history: () => chorus.charts.forEach((c) => c.refresh()) }) : null;
  chorus.page = { close: () => es && es.close() };
}

// ---------- the router ----------

async function route() {
  clearPage();
  const view = document.getElementById('view');
  view.replaceChildren(h('p', { class: 'note', text: 'loading…' }));
  const page = pageOf(location.hash);
  try {
    if (page.kind === 'run') await runPage(view, page.path);
    else if (page.kind === 'group') await groupPage(view, page.path);
    else if (page.kind === 'compare') await comparePage(view, page.paths);
    else await runsPage(view);
  } catch (e) {
    view.replaceChildren(errorBox('could not show this page: ' + e));
  }
  document.body.dataset.ready = '1';
}

// A token in the address has been turned into a cookie by the server: take it out of the address bar.
if (new URLSearchParams(location.search).has('token')) history.replaceState(null, '', location.pathname + location.hash);
setupControls();
window.addEventListener('hashchange', route);
route();

// chorus serve: a run's events (events.jsonl; docs/DASHBOARD.md, "A run",
// Events): what the run host told while the run went on (a rank stalled or
// ended, a value that is not finite, a barrier that timed out, a rule of
// alert_when, a straggler, the run's end). A list of them, the newest first,
// that follows the run; and a mark on each of the run's charts at an
// event's step (at its time on a chart against time): on the series of the
// event's rank where the chart shows one (a dygraphs annotation), else a
// vertical line across the chart; coloured by severity, its message in its
// title. An event with no step (run_finished) is in the list only.
// They are asked for after the charts (the page's first paint does not wait
// for them), then, when the page's event stream says events.jsonl changed,
// only the new ones. Loaded before app.js, whose helpers (h, api, loadOnce,
// fmtTime, rankOf, chorus) it uses once the page runs. A message goes in as
// text, never as HTML.
'use strict';

// An event's severity by its kind: bad (red), warn (amber), info (neutral).
const eventSeverity = {
  stalled: 'bad', nonfinite: 'bad', rank_failed: 'bad', rank_killed: 'bad', rank_lost: 'bad', barrier_timeout: 'bad',
  threshold: 'warn', straggler: 'warn', resumed: 'info', run_finished: 'info',
};
const severityOf = (kind) => eventSeverity[kind] || 'info';
const severityRank = { info: 0, warn: 1, bad: 2 };
// The colour of an annotation's tick, as style.css colours the severities.
const severityColor = { bad: '#c4342d', warn: '#c98a00', info: '#687087' };
// The letter an annotation shows for one event.
const eventLetter = { stalled: 'S', resumed: 'R', nonfinite: 'N', rank_failed: 'F', rank_killed: 'K', rank_lost: 'L',
  barrier_timeout: 'B', run_finished: 'E', threshold: 'T', straggler: 'G' };
// The events a page keeps at the most (the server keeps as many), and the rows its list draws (the newest).
const eventsKept = 10000;
const eventRowsShown = 1000;
// The events one mark's title names at the most; the rest are counted.
const eventsPerTitle = 8;

function eventTitle(ev) {
  const where = [ev.kind, ev.rank !== null ? 'rank ' + ev.rank : '', ev.step !== null ? 'step ' + ev.step : '',
    ev.key ? ev.key : '', fmtTime(ev.time)].filter(Boolean).join(' · ');
  return where + '\n' + ev.message;
}
function marksTitle(evs) {
  const shown = evs.slice(0, eventsPerTitle).map(eventTitle);
  if (evs.length > eventsPerTitle) shown.push(`and ${evs.length - eventsPerTitle} more`);
  return shown.join('\n\n');
}
const worstOf = (evs) => evs.reduce((w, ev) => (severityRank[severityOf(ev.kind)] > severityRank[w] ? severityOf(ev.kind) : w), 'info');

// The index of the point of series `d` ({x, y}, x ascending) nearest to `x`
// that has a value; null where x lies outside the series.
function nearestPoint(d, x) {
  const xs = d.x, n = xs.length;
  if (!n || x < xs[0] || x > xs[n - 1]) return null;
  let lo = 0, hi = n - 1;
  while (lo < hi) {
    const mid = (lo + hi) >> 1;
    if (xs[mid] < x) lo = mid + 1; else hi = mid;
  }
  // lo: the first point at or after x. The nearest with a value on each side of it.
  const has = (k) => d.y[k] !== null && isFinite(d.y[k]);
  let right = lo, left = lo - 1;
  while (right < n && !has(right)) right++;
  while (left >= 0 && !has(left)) left--;
  if (right >= n) return left >= 0 ? left : null;
  if (left < 0) return right;
  return x - xs[left] <= xs[right] - x ? left : right;
}

class RunEvents {
  // `box`: where the list goes; `path`: the run; `run()`: its /api/run answer (the charts' time into the run starts at its start_time).
  constructor(box, path, run) {
    this.box = box;
    this.path = path;
    this.run = run;
    this.events = [];        // oldest first
    this.generation = null;  // the server's reading of the file the events are of
    this.file = null;        // the file's state in the last answer
    this.leftOut = 0;
    this.started = false;
    this.closed = false;
    this.loading = false;
    this.status = h('p', { class: 'note', id: 'events-note', text: 'loading the events…' });
    this.table = h('table', { id: 'events-table', hidden: true });
    box.replaceChildren(this.status, h('div', { class: 'events-list' }, this.table));
  }

  // Once the charts in view have asked for their series (observePanel
  // finds them when the page is laid out) and had their answers (3 s at the most), the events.
  async start() {
    const until = Date.now() + 3000;
    const pause = () => new Promise((r) => setTimeout(r, 30));
    while (chorus.charts.length && !chorus.charts.some((c) => c.wanted) && Date.now() < until) await pause();
    while (chorus.charts.some((c) => c.loading) && Date.now() < until) await pause();
    if (this.closed) return;
    this.started = true;
    await this.load();
  }

  close() { this.closed = true; }

  // The page's event stream: events.jsonl changed (its lines, or the file was read afresh).
  changed(e) {
    if (!this.started || this.closed) return;
    const f = this.file;
    if (f && e.generation === this.generation && e.rows === f.rows && e.skipped === f.skipped &&
        e.unfinished === f.unfinished && e.missing === f.missing && (e.error || '') === (f.error || '')) return;
    this.load();
  }

  load() { return loadOnce(this, async () => {
    const more = this.generation !== null;
    const r = await api('run/events', more ? { run: this.path, after: this.file.rows } : { run: this.path });
    if (this.closed) return;
    if (r.httpStatus >= 400) { this.status.textContent = 'events: ' + r.error; return; }
    if (more && r.generation !== this.generation) {
      // The file was replaced or cut: all of it again.
      this.generation = null;
      this.again = true;
      return;
    }
    const placedBefore = this.events.some((ev) => ev.step !== null);
    if (!more) this.events = [];
    this.generation = r.generation;
    this.file = r;
    this.leftOut = r.left_out;
    const fresh = r.events;
    this.events.push(...fresh);
    if (this.events.length > eventsKept) this.events.splice(0, this.events.length - eventsKept);
    this.render();
    // The charts' marks: where new events have a place on them, or where
    // the file read afresh took away some that had one (a run without
    // events draws its charts once only).
    if (fresh.some((ev) => ev.step !== null) || (!more && placedBefore)) chorus.charts.forEach((c) => c.draw());
  }); }

  render() {
    const f = this.file;
    const notes = [];
    if (f.missing) notes.push('no events yet (events.jsonl)');
    else notes.push(`${f.rows} event${f.rows === 1 ? '' : 's'}` + (this.leftOut ? `, the oldest ${this.leftOut} left out (the last ${eventsKept} are kept)` : ''));
    if (this.events.length > eventRowsShown) notes.push(`the newest ${eventRowsShown} listed`);
    if (f.skipped) notes.push(`${f.skipped} damaged line(s) of events.jsonl skipped (${f.first_skipped})`);
    if (f.unfinished) notes.push('a line is being written');
    if (f.error) notes.push(f.error);
    this.status.textContent = notes.join(' · ');
    const rows = this.events.slice(-eventRowsShown).reverse().map((ev) => {
      const sev = severityOf(ev.kind);
      const details = [ev.key ? 'key ' + ev.key : '', ev.ranks && ev.ranks.length ? 'ranks ' + ev.ranks.join(', ') : '',
        ev.state ? 'state ' + ev.state : '', ev.host ? 'host ' + ev.host + (ev.pid !== undefined ? ', pid ' + ev.pid : '') : '',
        'seq ' + ev.seq].filter(Boolean).join(' · ');
      return h('tr', { class: 'ev-' + sev, 'data-seq': ev.seq, 'data-kind': ev.kind, title: details },
        h('td', { class: 'ev-time', text: fmtTime(ev.time) }),
        h('td', {}, h('span', { class: 'ev-kind ev-' + sev, text: ev.kind })),
        h('td', { class: 'num', text: ev.rank ?? '' }),
        h('td', { class: 'num', text: ev.step ?? '' }),
        h('td', { class: 'ev-message', text: ev.message }));
    });
    this.table.replaceChildren(h('tr', {}, ['time', 'kind', 'rank', 'step', 'message'].map((t) => h('th', { text: t }))), ...rows);
    this.table.hidden = !rows.length;
  }

  // An event's x on a chart drawn against `axis`; null where it has none there.
  xOf(ev, axis) {
    if (ev.step === null) return null;
    if (axis === 'step') return ev.step;
    if (axis === 'wall') return ev.time;
    if (axis === 'rel') {
      const start = (this.run() || {}).start_time;
      return typeof start === 'number' ? ev.time - start : null;
    }
    return null; // against a declared step metric: no place for a step
  }

  // The marks of `chart` (one of this run's) as dygraphs annotations, in the
  // chart's x before dates (seconds on a wall-time chart); the events that
  // no series of their rank takes are left in chart.eventLines for place().
  notes(chart) {
    chart.eventLines = [];
    if (!this.events.length || !chart.data || !chart.sources.every((s) => s.run === this.path)) return [];
    const vis = chart.visible();
    const byRank = new Map();
    chart.sources.forEach((s, i) => {
      const r = rankOf(s.key);
      if (r !== null && vis[i] && chart.data[i] && !byRank.has(r)) byRank.set(r, i);
    });
    const onSeries = new Map();
    for (const ev of this.events) {
      const x = this.xOf(ev, chart.axisUsed);
      if (x === null) continue;
      const i = ev.rank !== null ? byRank.get(ev.rank) : undefined;
      const at = i === undefined ? null : nearestPoint(chart.data[i], x);
      if (at === null) { chart.eventLines.push({ x, ev }); continue; }
      const k = i + ',' + at;
      if (!onSeries.has(k)) onSeries.set(k, { i, x: chart.data[i].x[at], evs: [] });
      onSeries.get(k).evs.push(ev);
    }
    return [...onSeries.values()].map(({ i, x, evs }) => {
      const sev = worstOf(evs);
      return { series: chart.sources[i].label, x, shortText: evs.length > 1 ? String(Math.min(evs.length, 99)) : eventLetter[evs[0].kind] || '?',
        text: marksTitle(evs), cssClass: 'ev-note ev-' + sev, tickColor: severityColor[sev], tickWidth: 1.5 };
    });
  }

  // The vertical lines of `chart`'s events (chart.eventLines), at most one a
  // pixel, put over its plot each time dygraphs draws it.
  place(chart, g) {
    const lines = chart.eventLines || [];
    if (!lines.length && !chart.eventLayer) return;
    if (!chart.eventLayer) chart.eventLayer = h('div', { class: 'ev-layer' });
    const layer = chart.eventLayer;
    if (layer.parentNode !== g.graphDiv) g.graphDiv.append(layer);
    const area = g.getArea(), wall = chart.axisUsed === 'wall';
    const byPixel = new Map();
    for (const { x, ev } of lines) {
      const px = Math.round(g.toDomXCoord(wall ? x * 1000 : x));
      if (!(px >= area.x && px <= area.x + area.w)) continue;
      if (!byPixel.has(px)) byPixel.set(px, []);
      byPixel.get(px).push(ev);
    }
    layer.replaceChildren(...[...byPixel].map(([px, evs]) => h('div', {
      class: 'ev-line ev-' + worstOf(evs), style: `left:${px - 3}px;top:${area.y}px;height:${area.h}px`,
      title: marksTitle(evs), 'data-kinds': evs.map((ev) => ev.kind).join(' '), 'data-seqs': evs.map((ev) => ev.seq).join(' '),
    })));
  }
}

// chorus serve: a chart of one or more series (Chart, over dygraphs): its
// data from /api/series at the chart's width, zoom and pan, smoothing, log
// scale, the x chosen, NaN and infinities marked, live refreshes; charts are
// loaded when they come near the view. Uses format.js; app.js makes them.
'use strict';

// ---------- charts ----------

// A chart asked to draw before dygraphs has loaded (boot.js's chartsLibrary)
// draws once it has; asked again meanwhile, still once.
function drawWhenLoaded(chart) {
  if (chart.waitsForLibrary) return;
  chart.waitsForLibrary = true;
  chartsLibrary.load().then(() => { chart.waitsForLibrary = false; chart.draw(); },
    (e) => { chart.plot.replaceChildren(h('div', { class: 'empty', text: e.message })); });
}

const palette = ['#2f5fd0', '#d0502f', '#24824a', '#8e44ad', '#c49a00', '#0f8a9d', '#c2185b', '#5d6d7e',
  '#7cb342', '#ef6c00', '#3949ab', '#00897b'];

// TensorBoard's smoothing: an exponential moving average, debiased so that
// the first points are not pulled towards 0: the n-th value is the average of
// the values so far weighted w^(n-i). It is computed as a step from the last
// average towards the new value, by the new value's share of the weights,
// (1 - w) / (1 - w^n): a value equal to the average leaves it as it is, so
// that a constant comes out exactly that constant, with no rounding noise.
function ema(ys, w) {
  if (!w) return ys;
  let avg = 0, n = 0;
  return ys.map((v) => {
    if (v === null || !isFinite(v)) return v;
    n += 1;
    const share = n === 1 ? 1 : (1 - w) / (1 - Math.pow(w, n));
    if (v !== avg) avg = share >= 1 ? v : avg + (v - avg) * share;
    return avg;
  });
}

// Series asked `exact` (every point, read from the file for their keys while
// the history is indexed): the charts that ask within a few milliseconds of
// each other share one request, so that the file is read once for all of them.
const exactAsked = new Map();
function exactSeries(params) {
  const same = JSON.stringify(Object.assign({}, params, { key: null }));
  let batch = exactAsked.get(same);
  if (!batch) {
    batch = { params: Object.assign({}, params, { key: [], exact: 1 }) };
    batch.answer = new Promise((resolve) => setTimeout(() => {
      exactAsked.delete(same);
      resolve(api('series', batch.params));
    }, 20));
    exactAsked.set(same, batch);
  }
  for (const k of params.key) if (!batch.params.key.includes(k)) batch.params.key.push(k);
  return batch.answer;
}

// Runs `owner`'s loading one at a time: asked again meanwhile, it runs once
// more after; a failure is written in owner.status.
async function loadOnce(owner, fill) {
  if (owner.loading) { owner.again = true; return; }
  owner.loading = true;
  try {
    await fill();
  } catch (e) {
    owner.status.textContent = 'could not load: ' + e;
  } finally {
    owner.loading = false;
    if (owner.again) { owner.again = false; owner.load(); }
  }
}

// One chart: `sources` are the series it draws, each {run, file, key, label};
// it asks the server for them at its own width and range.
class Chart {
  constructor(parent, title, sources, opts) {
    this.title = title;
    this.sources = sources;
    // xkey: a function giving declaredX's answer for this chart, where x may be a step metric.
    // keyCounts: a function giving the run's count of NaN and infinite values of each key (/api/run's key list).
    this.opts = Object.assign({ axis: null, annotate: null, extra: null, xkey: null, keyCounts: null }, opts || {});
    this.range = null;        // the x range asked for; null: everything
    this.data = null;         // per source: {x, y} as the server gave them
    this.g = null;
    this.forced = new Map();  // label -> shown or hidden by hand
    this.loading = false;
    this.wanted = false;
    this.el = h('div', { class: 'chart', 'data-title': title });
    this.plot = h('div', { class: 'plot' });
    this.legend = h('div', { class: 'legend' });
    this.toggles = h('div', { class: 'toggles' });
    this.status = h('div', { class: 'status' });
    // What the chart leaves out (points at or below 0 on a log scale), said under it.
    this.scaleNote = h('div', { class: 'status scale-note', hidden: true });
    // The run's NaN and infinite values of the chart's keys, in all (where it has any), beside its title.
    this.oddNote = h('span', { class: 'odd-note' });
    this.el.append(h('h3', {}, title, this.oddNote), this.plot, this.scaleNote, this.legend, this.toggles, this.status);
    parent.append(this.el);
    chorus.charts.push(this);
    observePanel(this.el);
  }

  axis() { return this.opts.axis ? this.opts.axis(settings.x) : settings.x; }

  // What the next load draws against: 'step', 'wall', 'rel', or 'key:NAME'
  // (a declared step metric, where x is "step"), and why a declaration was set aside.
  xChoice() {
    const axis = this.axis();
    if (axis === '_step') return { used: 'step' };
    if (axis !== 'step' || !this.opts.xkey) return { used: axis };
    const d = this.opts.xkey();
    return d.key ? { used: 'key:' + d.key, key: d.key } : { used: 'step', why: d.why };
  }

  // Asks for the series again: the whole range, or the one zoomed into.
  load() { return loadOnce(this, async () => {
    const choice = this.xChoice();
    // A range zoomed into is in the units of the x it was drawn against.
    if (this.axisUsed && choice.used !== this.axisUsed) this.range = null;
    const width = Math.max(100, Math.min(4000, Math.round(this.plot.clientWidth || 600)));
    const byFile = new Map();
    this.sources.forEach((s, i) => {
      const k = s.run + '\n' + (s.file || 'history');
      if (!byFile.has(k)) byFile.set(k, { run: s.run, file: s.file || 'history', keys: [], at: [] });
      byFile.get(k).keys.push(s.key);
      byFile.get(k).at.push(i);
    });
    const data = new Array(this.sources.length).fill(null);
    const problems = [];
    let n = 0, full = true, overview = false, xMissing = false, wantExact = false;
    // The NaN and infinite values in the range: where the answer places them
    // (`nonfinite`: their x by kind), else its counts (`nan`, `inf` of either sign).
    const odd = { nan: 0, inf: 0, '-inf': 0, either: 0 };
    await Promise.all([...byFile.values()].map(async (f) => {
      const params = { run: f.run, file: f.file, key: f.keys, x: choice.key ? 'step' : choice.used, xkey: choice.key, width };
      if (this.range) { params.from = this.range[0]; params.to = this.range[1]; }
      const r = await (this.exact && !this.range ? exactSeries(params) : api('series', params));
      // (Metric keys only: a key the index adds, `_progress/rank-N`, would have every line read whole.)
      if (r.overview && f.keys.every((k) => !k.startsWith('_'))) wantExact = true;
      if (r.error) { problems.push(r.error); return; }
      if (r.problem) problems.push(r.problem);
      if (r.overview) overview = true;
      if (r.x_missing) xMissing = true;
      f.keys.forEach((k, j) => {
        const s = r.series && r.series[k];
        if (!s) return;
        data[f.at[j]] = s;
        n += s.n;
        full = full && s.full;
        const nf = s.nonfinite || {};
        const placed = { nan: (nf.nan || []).length, inf: (nf.inf || []).length, '-inf': (nf['-inf'] || []).length };
        odd.nan += Math.max(s.nan || 0, placed.nan);
        odd.inf += placed.inf;
        odd['-inf'] += placed['-inf'];
        odd.either += Math.max(0, (s.inf || 0) - placed.inf - placed['-inf']);
      });
    }));
    this.data = data;
    this.axisUsed = choice.used;
    this.xKey = choice.key || null;
    if (choice.why) problems.push(choice.why);
    if (xMissing) problems.push(`no values of ${choice.key}, its step metric, ` + (this.range ? 'in this range' : 'yet'));
    const oddText = [[odd.nan, 'NaN'], [odd.inf, '+Inf'], [odd['-inf'], '−Inf'], [odd.either, '±Inf']]
      .filter(([k]) => k).map(([k, what]) => `, ${k} ${what}`).join('');
    if (this.opts.keyCounts) {
      const all = this.sources.map((s) => this.opts.keyCounts(s.key) || {});
      const nan = all.reduce((a, k) => a + (k.nan || 0), 0), inf = all.reduce((a, k) => a + (k.inf || 0), 0);
      this.oddNote.textContent = nan || inf ? ' ' + [nan ? nan + ' NaN' : '', inf ? inf + ' ±Inf' : ''].filter(Boolean).join(', ') + ' in the run' : '';
    }
    this.status.textContent = (problems.length ? problems.join('; ') + ' · ' : '') + (overview ? 'about ' : '') + n + (n === 1 ? ' point' : ' points') + oddText +
      (overview ? ' (an overview of lines spread over the file, while it is indexed)' : full ? '' : ' (smallest and largest of each pixel)') +
      (choice.key ? ` against ${choice.key} (its declared step metric), on the rows that have both` : '');
    this.draw();
    // Drawn from the overview of a history still being indexed, and in view:
    // once that is painted, every point of its keys is asked for (the server
    // reads the file for them alone), not left to wait for the whole index.
    if (wantExact && !this.exact && inView(this.el)) {
      this.exact = true;
      requestAnimationFrame(() => setTimeout(() => this.load(), 0));
    }
  }); }

  reset() { this.range = null; if (this.wanted) this.load(); }
  refresh() { if (this.wanted) this.load(); }

  labels() { return this.sources.map((s) => s.label); }

  visible() {
    return this.sources.map((s) => (this.forced.has(s.label) ? this.forced.get(s.label)
      : settings.ranks || !s.rankColumn || this.sources.length === 1));
  }

  // Draws what was loaded, smoothed and scaled as the controls say.
  draw() {
    if (!this.data) return;
    if (!window.Dygraph) { drawWhenLoaded(this); return; }
    const wall = this.axisUsed === 'wall';
    const rows = new Map();
    const cols = this.sources.length;
    this.data.forEach((s, i) => {
      if (!s) return;
      const ys = ema(s.y, this.sources[i].noSmooth ? 0 : settings.smooth);
      // Against a step metric several rows may share an x (an epoch): each keeps a row of the chart.
      const seen = this.xKey ? new Map() : null;
      for (let j = 0; j < s.x.length; j++) {
        let at = s.x[j];
        if (seen) { const k = seen.get(at) || 0; seen.set(at, k + 1); if (k) at = at + '#' + k; }
        let r = rows.get(at);
        if (!r) { r = new Array(cols + 1).fill(null); r[0] = s.x[j]; rows.set(at, r); }
        r[i + 1] = ys[j];
      }
    });
    // A NaN or an infinity breaks its line where it was logged (NaN is dygraphs'
    // explicit gap), and gets a mark there (placeMarks).
    this.marks = [];
    this.data.forEach((s, i) => {
      const nf = s && s.nonfinite;
      if (!nf) return;
      for (const kind of ['nan', 'inf', '-inf'])
        for (const x of nf[kind] || []) {
          let r = rows.get(x);
          if (!r || (r[i + 1] !== null && !Number.isNaN(r[i + 1]))) {
            r = new Array(cols + 1).fill(null); r[0] = x;
            rows.set(this.xKey ? x + '#' + kind + i : rows.has(x) ? x + '#' + kind + i : x, r);
          }
          r[i + 1] = NaN;
          this.marks.push({ x, kind, series: i });
        }
    });
    const extra = this.opts.extra ? this.opts.extra(this) : null;
    let data = [...rows.values()].sort((a, b) => a[0] - b[0]);
    let labels = ['x', ...this.labels()];
    let visibility = this.visible();
    let series = {};
    if (extra) {
      // Series computed from the loaded ones (the contributions below the rank count).
      data = data.map((r) => r.concat(extra.values(r)));
      labels = labels.concat(extra.labels);
      visibility = visibility.concat(extra.labels.map(() => true));
      series = extra.series || {};
    }
    // A log scale has no place for 0 or below: those points are left out (the
    // line broken there, not drawn across), and the chart says how many.
    let dropped = 0, positive = 0;
    if (settings.log)
      for (const r of data)
        for (let c = 1; c < r.length; c++) {
          const v = r[c];
          if (typeof v !== 'number' || Number.isNaN(v)) continue;
          if (v > 0) positive++;
          else { r[c] = NaN; if (c <= cols) dropped++; }
        }
    this.scaleNote.hidden = !dropped;
    this.scaleNote.textContent = dropped ? `log scale: ${dropped} ${dropped === 1 ? 'point' : 'points'} at or below 0 left out` : '';
    if (wall) data.forEach((r) => { r[0] = new Date(r[0] * 1000); });
    if (!data.length || (settings.log && !positive)) {
      if (this.g) { this.g.destroy(); this.g = null; }
      this.plot.replaceChildren(h('div', { class: 'empty', text: !data.length ? 'no points' + (this.range ? ' in this range' : '')
        : 'no point above 0' + (this.range ? ' in this range' : '') + ' to draw on a log scale' }));
      this.renderToggles();
      return;
    }
    if (this.plot.querySelector('.empty')) this.plot.replaceChildren();
    const colors = labels.slice(1).map((_, i) => palette[i % palette.length]);
    // The run's events on it (events.js): annotations on their ranks' series, the others lines placed in onDraw.
    const notes = (this.opts.annotate ? this.opts.annotate(this) : []).concat(chorus.events ? chorus.events.notes(this) : []);
    const options = {
      labels, colors, visibility, series,
      labelsDiv: this.legend, legend: 'always', labelsSeparateLines: false,
      connectSeparatedPoints: true, logscale: settings.log, strokeWidth: 1.3,
      xlabel: this.xKey || { step: 'step', wall: 'wall time', rel: 'time into the run' }[this.axisUsed],
      axes: {
        x: this.axisUsed === 'rel' ? { valueFormatter: fmtDuration, ticker: durationTicker } :
          this.axisUsed === 'step' ? { valueFormatter: (v) => 'step ' + v } :
            this.xKey ? { valueFormatter: (v) => this.xKey + ' ' + fmtNumber(v), ticker: unitTicker(unitOf(this.xKey)) } : {},
        y: { valueFormatter: (v) => fmtInUnit(v, this.unit()), ticker: unitTicker(this.unit()),
          axisLabelWidth: this.unit().scale || this.unit().suffix.length > 1 ? 88 : 72 },
      },
      drawCallback: (g, initial) => this.onDraw(g, initial),
    };
    if (this.range) options.dateWindow = wall ? this.range.map((v) => v * 1000) : this.range.slice();
    // Another kind of x (numbers, dates, durations) needs a chart of its own.
    if (this.g && this.gAxis !== this.axisUsed) { this.g.destroy(); this.g = null; }
    if (!this.g) {
      this.gAxis = this.axisUsed;
      this.g = new Dygraph(this.plot, data, options);
    } else {
      options.file = data;
      this.g.updateOptions(options);
    }
    if (notes.length || this.g.annotations().length)
      this.g.setAnnotations(notes.map((a) => Object.assign({}, a, { x: wall ? a.x * 1000 : a.x })));
    this.renderToggles();
  }

  renderToggles() {
    const vis = this.visible();
    this.toggles.replaceChildren(...this.sources.map((s, i) => h('label', { title: s.title || s.label },
      h('input', { type: 'checkbox', checked: vis[i], onchange: (e) => {
        this.forced.set(s.label, e.target.checked);
        if (this.g) { this.g.setVisibility(i, e.target.checked); this.placeMarks(this.g); }
      } }),
      h('span', { class: 'swatch', style: 'background:' + palette[i % palette.length] }),
      h('span', { class: 'name', text: s.label }))));
  }

  // The unit of the chart's keys (unitOf).
  unit() { return unitOfKeys(this.sources.map((s) => s.key)); }

  // The marks of NaN and infinite values (this.marks, from draw()), put over
  // the plot each time dygraphs draws it: +Inf at its top edge, −Inf at its
  // bottom edge, NaN a dashed line across it, each in its series' colour.
  placeMarks(g) {
    const vis = this.visible();
    const marks = (this.marks || []).filter((m) => vis[m.series]);
    if (!marks.length && !this.markLayer) return;
    if (!this.markLayer) this.markLayer = h('div', { class: 'nf-layer' });
    const layer = this.markLayer;
    if (layer.parentNode !== g.graphDiv) g.graphDiv.append(layer);
    const area = g.getArea(), wall = this.axisUsed === 'wall';
    const text = { nan: 'NaN', inf: '+Inf', '-inf': '−Inf' };
    layer.replaceChildren(...marks.map((m) => {
      const px = g.toDomXCoord(wall ? m.x * 1000 : m.x);
      if (!(px >= area.x - 0.5 && px <= area.x + area.w + 0.5)) return null;
      const where = this.axisUsed === 'step' ? 'step ' + m.x : this.axisUsed === 'rel' ? fmtDuration(m.x)
        : wall ? fmtTime(m.x) : (this.xKey || 'x') + ' ' + fmtNumber(m.x);
      const style = `left:${px}px;color:${palette[m.series % palette.length]};` +
        (m.kind === 'inf' ? `top:${area.y}px` : m.kind === '-inf' ? `top:${area.y + area.h}px` : `top:${area.y}px;height:${area.h}px`);
      return h('div', { class: 'nf-mark nf-' + (m.kind === '-inf' ? 'neginf' : m.kind), style, 'data-kind': m.kind, 'data-x': m.x,
        'data-series': this.sources[m.series].label, title: `${this.sources[m.series].label}: ${text[m.kind]} at ${where}` },
      h('span', { text: text[m.kind] }));
    }).filter(Boolean));
  }

  // A zoom or a pan: ask for the range now shown, at full detail where it holds few points.
  onDraw(g, initial) {
    if (chorus.events) chorus.events.place(this, g);
    this.placeMarks(g);
    if (initial) return;
    clearTimeout(this.timer);
    this.timer = setTimeout(() => {
      const wall = this.axisUsed === 'wall';
      if (g.isZoomed('x')) {
        const r = g.xAxisRange().map((v) => (wall ? v / 1000 : v));
        if (!this.range || Math.abs(r[0] - this.range[0]) > 1e-9 || Math.abs(r[1] - this.range[1]) > 1e-9) {
          this.range = r;
          this.load();
        }
      } else if (this.range) {
        this.range = null;
        this.load();
      }
    }, 250);
  }

  destroy() {
    unobservePanel(this.el);
    if (this.g) this.g.destroy();
    this.g = null;
  }
}
// A chart (or a histogram's or a media key's panel) loads once it comes near
// the screen, so that a run of many keys opens fast: those in view at once,
// those only near it (600 px) once the ones in view are drawn and painted,
// so that the first paint waits for the charts it shows only.
const panels = () => [...chorus.charts, ...chorus.histograms, ...chorus.media];
const panelOf = (el) => panels().find((x) => x.el === el);
// The panels loading, those near the screen waiting their turn, and whether a turn is due.
const panelLoads = { busy: 0, near: new Set(), flushing: false };
function wantChart(c) {
  if (c.wanted) return;
  c.wanted = true;
  panelLoads.near.delete(c);
  panelLoads.busy++;
  Promise.resolve(c.load()).finally(() => { panelLoads.busy--; loadNearCharts(); });
}
// Whether `el` is in the window.
function inView(el) {
  const r = el.getBoundingClientRect();
  return r.width > 0 && r.bottom > 0 && r.top < innerHeight;
}
// The panels in view of a page just built, asked for at once: a frame
// sooner than the observer would tell (its layout is the one that frame
// would make anyway).
function loadPanelsInView() {
  for (const c of panels()) {
    if (!c.wanted && inView(c.el)) wantChart(c);
  }
}
function loadNearCharts() {
  if (panelLoads.busy || panelLoads.flushing || !panelLoads.near.size) return;
  panelLoads.flushing = true;
  // After the next frame is painted.
  requestAnimationFrame(() => setTimeout(() => {
    panelLoads.flushing = false;
    if (panelLoads.busy) return; // one came into view meanwhile: after it
    const near = [...panelLoads.near];
    panelLoads.near.clear();
    near.forEach((c) => { if (c.el.isConnected) wantChart(c); });
  }, 0));
}
Chart.inView = new IntersectionObserver((entries) => {
  for (const e of entries) {
    const c = e.isIntersecting && panelOf(e.target);
    if (c) wantChart(c);
  }
});
Chart.observer = new IntersectionObserver((entries) => {
  for (const e of entries) {
    const c = panelOf(e.target);
    if (!c || c.wanted) continue;
    if (e.isIntersecting) panelLoads.near.add(c); else panelLoads.near.delete(c);
  }
  loadNearCharts();
}, { rootMargin: '600px' });
function observePanel(el) { Chart.inView.observe(el); Chart.observer.observe(el); }
function unobservePanel(el) { Chart.inView.unobserve(el); Chart.observer.unobserve(el); }

// chorus serve: a histogram key's panel (HistogramPanel): its quantiles over
// the steps as bands, and one step's bins. Uses format.js; app.js makes them.
'use strict';

// ---------- histograms ----------

// A JSON number of the server's, or null for the text it writes a non-finite one as.
const finite = (v) => (typeof v === 'number' && isFinite(v) ? v : null);
const quantileNames = ['p0', 'p5', 'p25', 'p50', 'p75', 'p95', 'p100'];
const columnLabel = (c) => (c.rank === null ? 'merged' : 'rank ' + c.rank);

// One histogram key of a run (its columns: merged, or a rank's): its
// quantiles over the steps as bands (TensorBoard's distributions: p5-p95 and
// p25-p75 shaded, p50 a line, the smallest and largest thin), and beside
// them the bins of one step, picked with the slider (or a click on the
// bands); the last step, followed live, until another is picked.
class HistogramPanel {
  constructor(parent, run, key, columns) {
    this.run = run;
    this.key = key;
    this.columns = columns;
    this.column = columns[0].column;
    this.step = null;  // the step picked; null: the last
    this.data = null;  // the server's answer
    this.g = null;
    this.wanted = false;
    this.loading = false;
    this.title = key;
    this.el = h('div', { class: 'chart hist', 'data-key': key });
    this.select = h('select', { class: 'hist-column', title: 'the merged histogram, or one rank\'s column (key/rank-N)',
      onchange: () => { this.column = this.select.value; this.load(); } });
    this.plot = h('div', { class: 'plot hist-dist' });
    this.legend = h('div', { class: 'legend' });
    this.bars = h('div', { class: 'hist-bars' });
    this.slider = h('input', { type: 'range', class: 'hist-step', min: 0, max: 0, value: 0, step: 1 });
    this.stepLabel = h('span', { class: 'hist-step-label' });
    this.figures = h('div', { class: 'status hist-figures' });
    this.status = h('div', { class: 'status' });
    this.slider.addEventListener('input', () => {
      this.stepLabel.textContent = 'step ' + this.slider.value;
      clearTimeout(this.timer);
      this.timer = setTimeout(() => this.pick(Number(this.slider.value)), 120);
    });
    this.el.append(h('div', { class: 'hist-head' }, h('h3', { text: key }), this.select),
      h('div', { class: 'hist-body' },
        h('div', { class: 'hist-left' }, this.plot, this.legend),
        h('div', { class: 'hist-right' }, this.bars, h('label', { class: 'hist-slider' }, this.slider, this.stepLabel), this.figures)),
      this.status);
    parent.append(this.el);
    this.setColumns(columns);
    chorus.histograms.push(this);
    observePanel(this.el);
  }

  setColumns(columns) {
    this.columns = columns;
    this.select.replaceChildren(...columns.map((c) => h('option', { value: c.column, text: columnLabel(c), selected: c.column === this.column })));
    this.select.disabled = columns.length < 2;
  }

  // A step picked: the last one follows the run again.
  pick(step) {
    this.step = this.data && step >= this.data.last_step ? null : step;
    this.load();
  }

  refresh() { if (this.wanted) this.load(); }

  load() { return loadOnce(this, async () => {
    const r = await api('histograms', { run: this.run, column: this.column, step: this.step ?? undefined, points: 500, bins: 60 });
    if (r.error) { this.status.textContent = r.error; return; }
    this.data = r;
    const notes = [];
    if (r.skipped) notes.push(`${r.skipped} damaged line(s) of histograms.jsonl skipped (${r.first_skipped})`);
    if (r.indexing) notes.push('histograms.jsonl is still being read');
    this.status.textContent = notes.concat(`${r.steps} steps` + (r.full ? '' : `, ${r.series.step.length} of them drawn`)).join(' · ');
    this.draw();
  }); }

  xs() {
    const s = this.data.series;
    if (settings.x === 'wall') return { xs: s.wall.map((v) => new Date(v * 1000)), name: 'wall time', axis: {} };
    if (settings.x === 'rel') return { xs: s.rel, name: 'time into the run', axis: { valueFormatter: fmtDuration, ticker: durationTicker } };
    return { xs: s.step, name: 'step', axis: { valueFormatter: (v) => 'step ' + v } };
  }

  draw() {
    if (!this.data) return;
    if (!window.Dygraph) { drawWhenLoaded(this); return; }
    this.drawBands();
    this.drawBars();
  }

  drawBands() {
    const s = this.data.series;
    const { xs, name, axis } = this.xs();
    const q = Object.fromEntries(quantileNames.map((n) => [n, s[n].map(finite)]));
    // A band [lo, mid, hi]; an end that is infinite (infinities sort at the ends) is drawn at the middle.
    const band = (lo, hi, i) => (q.p50[i] === null ? null : [lo[i] ?? q.p50[i], q.p50[i], hi[i] ?? q.p50[i]]);
    const line = (v) => (v === null ? null : [v, v, v]);
    const data = xs.map((x, i) => [x, band(q.p5, q.p95, i), band(q.p25, q.p75, i), line(q.p0[i]), line(q.p100[i])]);
    if (!data.length) { this.plot.replaceChildren(h('div', { class: 'empty', text: 'no steps' })); return; }
    const at = this.data.at.step;
    const options = {
      labels: [name, 'p5–p95', 'p25–p75', 'min', 'max'], customBars: true, fillAlpha: 0.18,
      colors: ['#2f5fd0', '#2f5fd0', '#7f95c8', '#7f95c8'], strokeWidth: 1.3,
      series: { min: { strokeWidth: 0.8, strokePattern: [3, 3] }, max: { strokeWidth: 0.8, strokePattern: [3, 3] } },
      labelsDiv: this.legend, legend: 'always', xlabel: name,
      axes: { x: axis, y: { ticker: unitTicker(unitOf(this.key)), axisLabelWidth: 72 } },
      legendFormatter: (d) => this.legendText(d),
      clickCallback: () => { const row = this.g.getSelection(); if (row >= 0) this.pick(s.step[row]); },
      // The step whose bins are shown, marked across the bands.
      underlayCallback: (ctx, area, g) => {
        const j = s.step.indexOf(at);
        const x = j >= 0 ? xs[j] : null;
        if (x === null || x === undefined) return;
        const px = g.toDomXCoord(x);
        ctx.save();
        ctx.strokeStyle = '#d0502f';
        ctx.setLineDash([4, 3]);
        ctx.beginPath(); ctx.moveTo(px, area.y); ctx.lineTo(px, area.y + area.h); ctx.stroke();
        ctx.restore();
      },
    };
    if (this.g && this.gAxis !== name) { this.g.destroy(); this.g = null; }
    if (this.plot.querySelector('.empty')) this.plot.replaceChildren();
    if (!this.g) { this.gAxis = name; this.g = new Dygraph(this.plot, data, options); }
    else { options.file = data; this.g.updateOptions(options); }
  }

  // The legend: the quantiles of the step under the pointer (or the picked step's), and its counts.
  legendText(d) {
    const s = this.data.series;
    const i = d.i === undefined || d.i === null ? s.step.indexOf(this.data.at.step) : d.i;
    if (i < 0 || i >= s.step.length) return '';
    const esc = (t) => String(t).replace(/[&<>"]/g, (c) => ({ '&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;' }[c]));
    const parts = [`step ${s.step[i]}`, ...quantileNames.map((n) => `${n} ${fmtNumber(s[n][i])}`), `count ${s.count[i]}`];
    for (const [k, label] of [['nan', 'NaN'], ['inf', '+inf'], ['-inf', '−inf']]) if (s[k][i]) parts.push(`${label} ${s[k][i]}`);
    return esc(parts.join('  '));
  }

  // The picked step's bins as bars, on a linear axis from its smallest value to its largest.
  drawBars() {
    const at = this.data.at, bins = at.bins;
    const first = this.data.first_step, last = this.data.last_step;
    this.slider.min = first; this.slider.max = last; this.slider.value = at.step;
    this.slider.disabled = first === last;
    this.stepLabel.textContent = 'step ' + at.step + (this.step === null ? ' (the last)' : '');
    this.figures.textContent = [`count ${at.count}`, `sum ${fmtNumber(at.sum)}`, `min ${fmtNumber(at.min)}`, `max ${fmtNumber(at.max)}`,
      at.nan ? `NaN ${at.nan}` : '', at.inf ? `+inf ${at.inf}` : '', at['-inf'] ? `−inf ${at['-inf']}` : '',
      `${at.buckets} buckets in ${bins.length} bins`].filter(Boolean).join(' · ');
    const W = Math.max(260, Math.round(this.bars.clientWidth || 420)), H = 240, left = 44, bottom = 20, top = 6;
    const ns = 'http://www.w3.org/2000/svg';
    const el = (tag, attrs, text) => {
      const e = document.createElementNS(ns, tag);
      for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
      if (text !== undefined) e.textContent = text;
      return e;
    };
    const svg = el('svg', { viewBox: `0 0 ${W} ${H}`, class: 'hist-svg', 'data-step': at.step });
    if (!bins.length) {
      svg.append(el('text', { x: W / 2, y: H / 2, 'text-anchor': 'middle', class: 'hist-axis' }, 'no finite values at this step'));
      this.bars.replaceChildren(svg);
      return;
    }
    let lo = bins[0][0], hi = bins[bins.length - 1][1];
    if (!(hi > lo)) { const pad = Math.abs(lo) * 0.01 || 0.5; lo -= pad; hi += pad; }
    const most = Math.max(...bins.map((b) => b[2]));
    const sx = (v) => left + ((v - lo) / (hi - lo)) * (W - left - 4);
    const sy = (c) => H - bottom - (c / most) * (H - bottom - top);
    for (const [a, b, c] of bins) {
      if (!c) continue;
      const x = sx(a), w = Math.max(1.5, sx(b) - x);
      const rect = el('rect', { x, y: sy(c), width: w, height: H - bottom - sy(c), class: 'hist-bar' });
      rect.append(el('title', {}, `[${fmtNumber(a)}, ${fmtNumber(b)}]: ${c}`));
      svg.append(rect);
    }
    svg.append(el('line', { x1: left, y1: H - bottom, x2: W - 4, y2: H - bottom, class: 'hist-axis-line' }),
      el('line', { x1: left, y1: top, x2: left, y2: H - bottom, class: 'hist-axis-line' }));
    const ticks = [0, 1, 2, 3, 4].map((k) => lo + ((hi - lo) * k) / 4), tickText = distinctLabels(ticks, unitOf(this.key));
    for (let k = 0; k <= 4; k++) {
      const v = ticks[k];
      svg.append(el('text', { x: sx(v), y: H - 5, 'text-anchor': k === 0 ? 'start' : k === 4 ? 'end' : 'middle', class: 'hist-axis' }, tickText[k]));
    }
    svg.append(el('text', { x: left - 4, y: top + 8, 'text-anchor': 'end', class: 'hist-axis' }, String(most)),
      el('text', { x: left - 4, y: H - bottom, 'text-anchor': 'end', class: 'hist-axis' }, '0'));
    this.bars.replaceChildren(svg);
  }

  destroy() {
    unobservePanel(this.el);
    clearTimeout(this.timer);
    if (this.g) this.g.destroy();
    this.g = null;
  }
}

// A panel per histogram key of the run, its columns (merged, rank N) beside each other in its selector.
function histogramPanels(parent, path, columns) {
  const byKey = new Map();
  for (const c of columns) {
    if (!byKey.has(c.key)) byKey.set(c.key, []);
    byKey.get(c.key).push(c);
  }
  for (const [key, cs] of byKey) {
    const p = chorus.histograms.find((x) => x.key === key);
    if (p) { if (cs.length !== p.columns.length) p.setColumns(cs); }
    else new HistogramPanel(parent, path, key, cs);
  }
}

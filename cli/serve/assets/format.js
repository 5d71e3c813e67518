// chorus serve: how the page writes values: times, durations, numbers to
// their last digit, a key's unit (read from its name) and the tick labels of
// a chart's axes in it, and the names of keys (per-rank columns, a declared
// step metric). Loaded before charts.js, histograms.js and app.js.
'use strict';

const pad = (n) => String(n).padStart(2, '0');
function fmtTime(s) {
  if (s === null || s === undefined) return '';
  const d = new Date(s * 1000);
  return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} ${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}`;
}
function fmtDuration(s) {
  if (s === null || s === undefined || !isFinite(s)) return '';
  if (s === 0) return '0s';
  if (s < 1) return Math.round(s * 1000) + 'ms';
  if (s < 60) return s.toFixed(1) + 's';
  if (s < 3600) return Math.floor(s / 60) + 'm ' + pad(Math.floor(s % 60)) + 's';
  if (s < 86400) return Math.floor(s / 3600) + 'h ' + pad(Math.floor((s % 3600) / 60)) + 'm';
  return Math.floor(s / 86400) + 'd ' + pad(Math.floor((s % 86400) / 3600)) + 'h';
}
function fmtNumber(v) {
  if (v === null || v === undefined) return '';
  if (typeof v !== 'number') return String(v);
  if (Number.isInteger(v)) return String(v);
  return Number(v.toPrecision(6)).toString();
}
// A number as it is, to its last digit: an integer whole, any other the
// shortest text that reads back as the same number.
function fmtExact(v) {
  if (typeof v !== 'number') return v === null || v === undefined ? '' : String(v);
  if (Number.isInteger(v) && Math.abs(v) >= 1e21) return BigInt(v).toString();
  return String(v);
}
// The keys whose values are times (unix seconds): the rows' _timestamp, a run's start and end.
const timeKey = (key) => /(^|[/.])(_timestamp|timestamp|start_time|end_time)$/.test(key);
// A value of `key` in a table (config, summary): a time as a date (to the
// millisecond), any other number at full precision.
function fmtValue(key, v) {
  if (typeof v === 'number' && isFinite(v) && timeKey(key)) {
    const ms = Math.round((v - Math.floor(v)) * 1000);
    return fmtTime(Math.floor(v)) + (ms ? '.' + String(ms).padStart(3, '0') : '');
  }
  return fmtExact(v);
}

// ---------- units ----------

// The unit of a key, as its name says it (the system metrics of
// io/sampling: memory.used_bytes, network.rx_bytes_per_s, cpu.percent,
// gpu.utilization_percent, gpu.sm_clock_mhz, gpu.temperature_c, ...; a
// trainer's samples_per_sec): {scale: how its labels are scaled, suffix}.
const binary = ['B', 'KiB', 'MiB', 'GiB', 'TiB', 'PiB'];
const decimal = ['', 'k', 'M', 'G', 'T', 'P'];
function unitOf(key) {
  const k = baseKey(key || '').replace(/\/(node|rank)-\d+$/, '');
  if (/(^|[._])bytes_per_s(ec)?$/.test(k)) return { scale: 'binary', suffix: '/s' };
  if (/(^|[._])bytes$/.test(k)) return { scale: 'binary', suffix: '' };
  if (/(^|[._])per_s(ec)?$/.test(k)) return { scale: 'decimal', suffix: '/s' };
  if (/(^|[._])percent$/.test(k)) return { scale: null, suffix: '%' };
  if (/(^|[._])mhz$/.test(k)) return { scale: null, suffix: ' MHz' };
  if (/(^|[._])temperature_c$/.test(k)) return { scale: null, suffix: ' °C' };
  if (/(^|[._])(power_)?watts$/.test(k)) return { scale: null, suffix: ' W' };
  return { scale: null, suffix: '' };
}
// The one unit of a chart's keys, or none where they differ.
function unitOfKeys(keys) {
  const us = keys.map(unitOf);
  return us.every((u) => u.scale === us[0].scale && u.suffix === us[0].suffix) ? us[0] : { scale: null, suffix: '' };
}
// The prefix that `largest` (the largest magnitude shown) is read in: {div, name}.
function unitPrefix(unit, largest) {
  if (!unit.scale) return { div: 1, name: '' };
  const base = unit.scale === 'binary' ? 1024 : 1000, names = unit.scale === 'binary' ? binary : decimal;
  let i = 0;
  while (i < names.length - 1 && largest >= Math.pow(base, i + 1)) i++;
  return { div: Math.pow(base, i), name: (unit.scale === 'binary' ? ' ' : '') + names[i] };
}
// Tick values as labels, with as many digits as it takes that no two read the
// same and each reads its value to within a twentieth of the ticks' spacing.
function distinctLabels(vals, unit) {
  const largest = Math.max(0, ...vals.map(Math.abs));
  const p = unitPrefix(unit, largest);
  const scaled = vals.map((v) => v / p.div);
  const big = Math.max(0, ...scaled.map(Math.abs));
  const expo = !unit.scale && (big >= 1e6 || (big > 0 && big < 1e-3));
  const sorted = scaled.slice().sort((a, b) => a - b);
  let spacing = Infinity;
  for (let i = 1; i < sorted.length; i++) if (sorted[i] > sorted[i - 1]) spacing = Math.min(spacing, sorted[i] - sorted[i - 1]);
  const text = (v, d, e) => (v === 0 ? (e ? '0' : (0).toFixed(d)) : e ? v.toExponential(d) : v.toFixed(d)).replace(/^-(0(\.0*)?)$/, '$1');
  const fit = (e) => {
    let texts = null;
    for (let d = 0; d <= 16; d++) {
      texts = scaled.map((v) => text(v, d, e));
      const close = !isFinite(spacing) || scaled.every((v, i) => Math.abs(Number(texts[i]) - v) <= spacing / 20);
      if (close && new Set(texts).size === texts.length) break;
    }
    return texts;
  };
  // Fixed decimals, or exponents for the very large and the very small where they read shorter.
  let texts = fit(false);
  if (expo) {
    const e = fit(true), longest = (ts) => Math.max(...ts.map((x) => x.length));
    if (longest(e) < longest(texts)) texts = e;
  }
  return texts.map((t) => t + p.name + unit.suffix);
}
// Ticks of time into the run as durations, with the seconds' decimals it
// takes that no two read the same (1.2ms, 1.4ms rather than 1ms twice).
function durationTicker(a, b, pixels, opts, g, vals) {
  const ticks = Dygraph.numericTicks(a, b, pixels, opts, g, vals);
  const shown = ticks.filter((t) => t.label !== '');
  let labels = shown.map((t) => fmtDuration(t.v));
  const largest = Math.max(0, ...shown.map((t) => Math.abs(t.v)));
  for (let d = 1; d <= 6 && new Set(labels).size < labels.length && largest < 3600; d++)
    labels = shown.map((t) => (largest < 1 ? (t.v * 1000).toFixed(Math.max(0, d - 1)) + 'ms'
      : largest < 60 ? t.v.toFixed(d) + 's'
        : Math.floor(t.v / 60) + 'm ' + (t.v % 60).toFixed(d).padStart(3 + d, '0') + 's'));
  shown.forEach((t, i) => { t.label = labels[i]; });
  return ticks;
}
// A tick of a log scale: three significant digits, in the prefix of its size.
function logLabel(v, unit) {
  const p = unitPrefix(unit, Math.abs(v));
  const x = Number((v / p.div).toPrecision(3)), a = Math.abs(x);
  return (!unit.scale && a && (a >= 1e6 || a < 1e-3) ? x.toExponential() : String(x)) + p.name + unit.suffix;
}
// A value under the pointer, in its unit.
function fmtInUnit(v, unit) {
  if (typeof v !== 'number' || !isFinite(v)) return fmtNumber(v);
  const p = unitPrefix(unit, Math.abs(v));
  return fmtNumber(p.div === 1 ? v : Number((v / p.div).toPrecision(5))) + p.name + unit.suffix;
}
// A y axis ticker: dygraphs' ticks (for a scaled unit, at round values of
// that unit), labelled by distinctLabels.
function unitTicker(unit) {
  return (a, b, pixels, opts, g, vals) => {
    let ticks;
    const p = unitPrefix(unit, Math.max(Math.abs(a), Math.abs(b)));
    if (opts('logscale') || p.div === 1 || vals) ticks = Dygraph.numericTicks(a, b, pixels, opts, g, vals);
    else ticks = Dygraph.numericTicks(a / p.div, b / p.div, pixels, opts, g, vals).map((t) => ({ v: t.v * p.div }));
    const shown = ticks.filter((t) => t.label !== '');
    // On a log scale the ticks are 1, 2, 5... times powers of ten, spread over
    // decades: each is labelled on its own, in the prefix of its own size.
    const labels = opts('logscale') ? shown.map((t) => logLabel(t.v, unit)) : distinctLabels(shown.map((t) => t.v), unit);
    shown.forEach((t, i) => { t.label = labels[i]; });
    return ticks;
  };
}
const badge = (state) => h('span', { class: 'badge ' + (state || '').split(' ')[0], text: state || '-' });
const runLink = (path, text) => h('a', { href: '#/run/' + encodeURI(path), text: text || path });
const perRank = (key) => /\/rank-\d+$/.test(key);
const baseKey = (key) => key.replace(/\/rank-\d+$/, '');
const rankOf = (key) => { const m = /\/rank-(\d+)$/.exec(key); return m ? Number(m[1]) : null; };

// The step metric a run declares for `key` (metrics.json, define_metric's
// step_metric): its charts' x. null: the rows' _step.
function stepMetric(run, key) {
  const d = run && run.metrics && run.metrics[key];
  const m = d && d.step_metric;
  return m && m !== '_step' ? m : null;
}
const hasKey = (run, key) => ((run && run.history && run.history.keys) || []).some((k) => k.key === key);

// What the chart of `key` is drawn against where x is "step": each run's
// declared step metric where they all declare the same one and have logged
// it ({key}), else _step ({key: null}, with why where a declaration is set aside).
function declaredX(runs, key) {
  const ms = runs.map((r) => stepMetric(r, key));
  const m = ms[0];
  if (!ms.some((x) => x)) return { key: null };
  if (!ms.every((x) => x === m)) return { key: null, why: 'the runs declare different step metrics for it: drawn against step' };
  if (!runs.every((r) => hasKey(r, m))) return { key: null, why: `its step metric ${m} has no values yet: drawn against step` };
  return { key: m };
}

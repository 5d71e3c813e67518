// chorus serve: a run's images, text and tables (media.jsonl; docs/DASHBOARD.md,
// "A run", Media). A panel per key, in a section per kind: the step picked
// with a slider (the last, followed live, until another is picked; again
// once the slider is moved to its end), a row per rank that logged the key
// (a key of one rank shows once, under its plain name), each with its caption.
// Loaded before app.js, whose helpers (h, api, loadOnce, fmtNumber, chorus,
// observePanel) it uses once the page runs. Everything a run logged
// (captions, markdown, table cells) goes in as text nodes, never as HTML.
'use strict';

const mediaSections = [['image', 'Images'], ['text', 'Text'], ['table', 'Tables']];
// The rows of a table drawn at the most; the rest are counted.
const mediaTableRows = 500;
// An image narrower than this is drawn larger, by a whole factor, its pixels kept sharp.
const mediaSmallWidth = 160;

// Markdown's inline marks (`code`, **strong**, *emphasis*) as nodes; everything else as text.
function markdownInline(text) {
  return text.split(/(`[^`]+`|\*\*[^*]+\*\*|\*[^*\s][^*]*\*)/).filter(Boolean).map((part) => {
    if (part.length > 2 && part.startsWith('`')) return h('code', { text: part.slice(1, -1) });
    if (part.length > 4 && part.startsWith('**')) return h('strong', { text: part.slice(2, -2) });
    if (part.length > 2 && part.startsWith('*')) return h('em', { text: part.slice(1, -1) });
    return part;
  });
}

// A small part of markdown built as DOM nodes: headings, paragraphs, lists
// and fenced code; links, images and HTML stay the text they were written as.
function markdownNodes(text) {
  const out = h('div', { class: 'media-md' });
  let para = [], list = null, code = null;
  const flush = () => {
    if (para.length) out.append(h('p', {}, markdownInline(para.join(' '))));
    para = [];
  };
  for (const line of text.split(/\r?\n/)) {
    if (code) {
      if (/^\s*```/.test(line)) { out.append(h('pre', { text: code.join('\n') })); code = null; }
      else code.push(line);
      continue;
    }
    const heading = /^(#{1,6})\s+(.*)$/.exec(line), item = /^\s*[-*+]\s+(.*)$/.exec(line);
    if (/^\s*```/.test(line) || heading || item || !line.trim()) flush();
    if (/^\s*```/.test(line)) { list = null; code = []; }
    else if (heading) { list = null; out.append(h('h' + Math.min(6, heading[1].length + 3), {}, markdownInline(heading[2]))); }
    else if (item) {
      if (!list) { list = h('ul'); out.append(list); }
      list.append(h('li', {}, markdownInline(item[1])));
    } else if (!line.trim()) list = null;
    else { list = null; para.push(line); }
  }
  if (code) out.append(h('pre', { text: code.join('\n') }));
  flush();
  return out;
}

// A table file (W&B's Table: {"columns": [...], "data": [[...], ...]}) as an HTML table.
function tableNodes(t) {
  if (!t || !Array.isArray(t.columns) || !Array.isArray(t.data)) return h('p', { class: 'note', text: 'not a table: no columns and data' });
  const cell = (v) => (v === null || v === undefined ? '' : typeof v === 'object' ? JSON.stringify(v) : fmtNumber(v));
  const table = h('table', { class: 'media-table' }, h('tr', {}, t.columns.map((c) => h('th', { text: cell(c) }))));
  for (const row of t.data.slice(0, mediaTableRows))
    table.append(h('tr', {}, (Array.isArray(row) ? row : [row]).map((v) => h('td', { class: typeof v === 'number' ? 'num' : null, text: cell(v) }))));
  const more = t.data.length > mediaTableRows ? h('p', { class: 'note', text: `the first ${mediaTableRows} of ${t.data.length} rows` }) : '';
  return h('div', { class: 'media-table-box' }, table, more);
}

// One media key of a run: a step's entries, a row per rank.
class MediaPanel {
  constructor(parent, run, info) {
    this.run = run;
    this.key = info.key;
    this.kind = info.kind;
    this.step = null;  // the step picked; null: the last
    this.data = null;  // the server's answer
    this.wanted = false;
    this.loading = false;
    this.el = h('div', { class: 'chart media', 'data-key': this.key, 'data-kind': this.kind });
    this.slider = h('input', { type: 'range', class: 'media-step', min: 0, max: 0, value: 0, step: 1 });
    this.stepLabel = h('span', { class: 'hist-step-label' });
    this.rows = h('div', { class: 'media-rows' });
    this.status = h('div', { class: 'status' });
    // The slider runs over the key's steps (their index): a key logged every 100 steps has no dead stretches.
    this.slider.addEventListener('input', () => {
      const step = this.data && this.data.steps[Number(this.slider.value)];
      if (step === undefined) return;
      this.stepLabel.textContent = 'step ' + step;
      clearTimeout(this.timer);
      this.timer = setTimeout(() => this.pick(step), 120);
    });
    this.el.append(h('h3', { text: this.key }), h('label', { class: 'hist-slider' }, this.slider, this.stepLabel), this.rows, this.status);
    parent.append(this.el);
    chorus.media.push(this);
    observePanel(this.el);
  }

  // A step picked: the last one follows the run again.
  pick(step) {
    this.step = this.data && step >= this.data.last_step ? null : step;
    this.load();
  }

  refresh() { if (this.wanted) this.load(); }

  load() { return loadOnce(this, async () => {
    const r = await api('media', { run: this.run, key: this.key, step: this.step ?? undefined });
    if (r.error) { this.status.textContent = r.error; return; }
    const shown = await Promise.all(r.entries.map((e) => this.content(e)));
    this.data = r;
    this.slider.max = Math.max(0, r.steps.length - 1);
    this.slider.value = Math.max(0, r.steps.indexOf(r.at));
    this.slider.disabled = r.steps.length < 2;
    this.stepLabel.textContent = 'step ' + r.at + (this.step === null ? ' (the last)' : '');
    const many = r.ranks.length > 1;
    this.rows.replaceChildren(...r.entries.map((e, i) => h('div', { class: 'media-row', 'data-rank': e.rank },
      many ? h('div', { class: 'media-rank', text: 'rank ' + e.rank }) : '',
      h('div', { class: 'media-item' }, shown[i], e.caption ? h('div', { class: 'media-caption', text: e.caption }) : ''))));
    const ranks = many ? `, ranks ${r.ranks.join(', ')}` : r.ranks[0] ? `, rank ${r.ranks[0]}` : '';
    this.status.textContent = `${r.steps.length} step${r.steps.length === 1 ? '' : 's'}${ranks}` +
      (r.skipped ? ` · ${r.skipped} damaged line(s) of media.jsonl skipped (${r.first_skipped})` : '');
  }); }

  // What an entry shows: the image, or its file read and built as nodes.
  async content(e) {
    if (this.kind === 'image') {
      const scale = e.width > 0 && e.width < mediaSmallWidth ? Math.floor(mediaSmallWidth / e.width) : 1;
      const img = h('img', { class: 'media-img' + (scale > 1 ? ' small' : ''), src: e.url, alt: e.caption || this.key,
        title: `${this.key}, step ${e.step}, rank ${e.rank}: ${e.width}×${e.height}` });
      if (scale > 1) img.style.width = e.width * scale + 'px';
      return img;
    }
    const res = await fetch(e.url, { credentials: 'same-origin' });
    if (!res.ok) return h('p', { class: 'note', text: `could not read ${this.kind} at step ${e.step}: ${res.status}` });
    if (this.kind === 'text') return markdownNodes(await res.text());
    try {
      return tableNodes(await res.json());
    } catch (err) {
      return h('p', { class: 'note', text: 'not a table: ' + err });
    }
  }

  destroy() {
    unobservePanel(this.el);
    clearTimeout(this.timer);
  }
}

// The run's media keys (run.media.keys), a panel each in its kind's section; those already there stay.
function mediaPanels(parent, path, keys) {
  if (!parent.children.length)
    for (const [kind, title] of mediaSections)
      parent.append(h('h3', { text: title, 'data-kind': kind, hidden: true }), h('div', { class: 'charts media-grid', 'data-kind': kind, hidden: true }));
  for (const info of keys) {
    if (chorus.media.some((p) => p.key === info.key)) continue;
    const section = [...parent.querySelectorAll('.media-grid')].find((s) => s.dataset.kind === info.kind);
    if (!section) continue;
    section.hidden = section.previousElementSibling.hidden = false;
    new MediaPanel(section, path, info);
  }
}

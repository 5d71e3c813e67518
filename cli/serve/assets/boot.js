// chorus serve: the first script of the page, in its head. It tells the page
// from the address's # (pageOf, which app.js's router uses too) and asks at
// once for the data that page opens with (/api/run or /api/runs), while the
// other scripts load; app.js's api() takes that answer instead of asking again.
'use strict';

// dygraphs, the charts' library (128 KB), is loaded where a page draws
// charts: at once on a page that opens with them (a run's, a group's, a
// comparison), else when the first chart is made. The runs list neither
// fetches nor compiles it. chartsLibrary.load() is its promise.
const chartsLibrary = (() => {
  let loading = null;
  const load = () => loading || (loading = new Promise((resolve, reject) => {
    const script = document.createElement('script');
    script.src = document.querySelector('meta[name="chorus-charts"]').content;
    script.onload = () => resolve();
    script.onerror = () => reject(new Error('the charts\' library (dygraph.min.js) did not load: reload the page'));
    document.head.appendChild(script);
  }));
  return { load };
})();

// The page an address's # names: {kind: 'runs' | 'run' | 'group' | 'compare', path, paths}.
function pageOf(hash) {
  const at = hash.replace(/^#/, '') || '/';
  if (at.startsWith('/run/')) return { kind: 'run', path: decodeURI(at.slice(5)) };
  if (at.startsWith('/group/')) return { kind: 'group', path: decodeURI(at.slice(7)) };
  if (at.startsWith('/compare/')) return { kind: 'compare', paths: at.slice(9).split('|').filter(Boolean).map(decodeURIComponent) };
  return { kind: 'runs' };
}

// The address of an API request: /api/PATH?params (a list gives a parameter per element).
function apiUrl(path, params) {
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(params || {})) {
    if (Array.isArray(v)) v.forEach((x) => q.append(k, x));
    else if (v !== undefined && v !== null) q.append(k, v);
  }
  return '/api/' + path + (q.toString() ? '?' + q : '');
}

// The request asked early: {url, answer (fetch's promise)}, taken once by api().
const early = (() => {
  const page = pageOf(location.hash);
  const url = page.kind === 'run' ? apiUrl('run', { run: page.path }) : page.kind === 'runs' ? apiUrl('runs') : null;
  return url ? { url, answer: fetch(url, { credentials: 'same-origin' }) } : null;
})();

if (pageOf(location.hash).kind !== 'runs') chartsLibrary.load();

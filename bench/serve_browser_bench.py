#!/usr/bin/env python3
"""What a browser sees of `chorus serve`: Debian's headless chromium, driven
through selenium (python3-selenium, chromium-driver) as tests/browser does,
against one or more `chorus` binaries over the data of `bench_serve --write`
(a run of 1 M rows x 20 metrics in DATA/big, 1,000 runs in DATA/many).

    bench_serve --write DATA            # once: about 860 MB
    serve_browser_bench.py --data DATA --chorus before=/path/to/old/chorus --chorus after=build-release/bin/chorus

Each --chorus is NAME=PATH (or a bare PATH); where several are given, each
try of each figure runs them one after the other, alternately, and the table
gives each one's median and the ratio of the last to the first. The figures:

  paint     the big run's page, from navigation until every chart in view is
            drawn (data rows and painted pixels), and until each of them has
            left the overview for the full-resolution curves (its status no
            longer says "overview"); a fresh server and a fresh browser each
            try: with the run's files in the page cache (warm), and evicted
            from it (cold: posix_fadvise(POSIX_FADV_DONTNEED) on each file of
            the run, after fdatasync); then the page reopened in the same
            browser (its files from the browser's cache, the server's index
            warm). Each both for a run opened for the first time and for one
            opened before, where a server that keeps indexes on disk
            (--index-dir, in DATA/kept-index-NAME here) takes the one it kept
            (evicted with the run's files for "cold").
  runs      the runs list of 1,000 runs, from navigation until its rows fill
            the window (the browser's own paint time of those rows, by Element
            Timing; beside it, the time a look every 10 ms saw them), and until
            its table holds every run (a fresh server
            and browser); a new run's directory made
            while the list is open, until its row is in the table; the CPU the
            server and all of chromium's processes take over --idle-s seconds
            while the list is open and nothing changes (from /proc; on the
            first try only), beside chromium's alone on a blank page.
  transfer  the time to the last byte of the biggest answers as the page gets
            them (fetch(), cache: 'no-store', in the page): a chart's series
            (the 4 per-rank columns of the big run at 700 px, its index whole),
            the runs list of 1,000 runs and dygraph.min.js; with the page at
            127.0.0.1 (loopback) and at this machine's own non-loopback
            address (the server on --host 0.0.0.0 with a token), each at full
            speed and through chromium's network emulation at 100 Mbit/s
            (1 ms latency); each answer --fetches times, one after another
            on the page's kept-alive connections: their median and the
            fastest; with the Content-Encoding and the size the browser got.
            Over plain HTTP chromium offers Brotli to loopback only, so the
            same answers are also asked by curl with `Accept-Encoding: gzip,
            deflate, br` (a new connection each time, at full speed only).

Timings of the page are the page's own (performance.now(), from the start of
navigation), taken by a script that chromium runs in each page before the
page's own (it looks every 10 ms). A fresh browser is first left on a blank
page until its processes are quiet (Browser.settle): its own start takes most
of both cores for half a second. Exits 77 where selenium or chromium cannot start.
"""
import argparse
import json
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import time

# The browser tests' helpers: selenium (skipping with a line where it cannot
# start), chromium's flags, finding programs, waiting for a page.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "browser"))
import dashboard_test  # noqa: E402
from dashboard_test import FLAGS, skip, which, wait_until as _wait_until  # noqa: E402
from selenium import webdriver  # noqa: E402
from selenium.common.exceptions import WebDriverException  # noqa: E402
from selenium.webdriver.chrome.service import Service  # noqa: E402

BIG_RUN = "bench/g/big"
MANY = 1000
TOKEN = "servebrowserbench0123456789"


def wait_until(what, fn, timeout=60.0, every=0.02):
    """Polls every 20 ms: a figure is read to within that."""
    return _wait_until(what, fn, timeout, every)


# ---------- the server ----------

class Serve(dashboard_test.Serve):
    """`chorus serve ROOT` on a free port, with a known token; `host` 0.0.0.0 serves other machines too."""

    def __init__(self, chorus, root, host=None, kept=None):
        super().__init__(chorus, root, "--token", TOKEN, *(["--host", host] if host else []),
                         *(["--index-dir", kept] if kept else []))

    def at(self, address, hash_=""):
        return f"http://{address}:{self.port}/?token={TOKEN}{hash_}"

    def wait_indexed(self, run):
        """Until the run's history is indexed whole (and kept, where the server keeps indexes)."""
        import urllib.request
        req = f"http://127.0.0.1:{self.port}/api/run?run={run}&token={TOKEN}"

        def whole():
            with urllib.request.urlopen(req, timeout=30) as r:
                return not json.loads(r.read())["history"].get("indexing", False)
        wait_until("the history indexed", whole, timeout=120, every=0.05)


# ---------- the browser ----------

# Runs in every page before its own scripts: window.__bench records (in
# performance.now() ms, from the start of navigation) when every chart in view
# was first drawn (`first`), when none of them showed an overview any more
# (`full`), when the runs table's rows first filled the window (`screen`:
# its last row reaches the window's bottom, or every run is there) and when
# it first held __bench_runs rows (`runs`), each as the time the next frame
# was painted; it looks every 10 ms until then, and no more after.
# A look every 10 ms is a task like the page's own, so it waits behind them:
# where the page builds the rest of a long list after its first screen, it
# reads late. `screenPainted()` is the browser's own time for the first
# screen instead: each run row's 'started' cell is marked for Element Timing
# as it is put in the page, and the figure is the latest first-paint time
# (renderTime, the frame's presentation) of the rows down to the window's
# bottom; null until each of them has been painted.
WATCH = r"""
(() => {
  if (location.protocol !== 'http:') return;
  const b = window.__bench = { first: null, full: null, screen: null, runs: null, charts: 0 };
  const paintedAt = new Map();  // a run's path -> when its row was first painted
  try {
    new PerformanceObserver((list) => {
      for (const e of list.getEntries()) {
        const t = e.renderTime || e.startTime;
        if (e.identifier && !(paintedAt.get(e.identifier) <= t)) paintedAt.set(e.identifier, t);
      }
    }).observe({ type: 'element', buffered: true });
    new MutationObserver((changes) => {
      for (const c of changes) for (const n of c.addedNodes) {
        if (n.nodeType !== 1) continue;
        const rows = n.matches('tr.run') ? [n] : n.querySelectorAll('tr.run');
        for (const tr of rows) if (tr.cells[4]) tr.cells[4].setAttribute('elementtiming', tr.dataset.path);
      }
    }).observe(document, { childList: true, subtree: true });
  } catch (e) { b.noElementTiming = String(e); }
  b.screenPainted = () => {
    const rows = [...document.querySelectorAll('#runs tr.run')].filter((tr) => tr.getBoundingClientRect().top < innerHeight);
    let t = null;
    for (const tr of rows) {
      const at = paintedAt.get(tr.dataset.path);
      if (at === undefined) return null;
      t = Math.max(t ?? at, at);
    }
    return t;
  };
  const inView = (el) => { const r = el.getBoundingClientRect();
    return r.width > 0 && r.height > 0 && r.bottom > 0 && r.top < innerHeight; };
  const painted = (el) => {
    let n = 0;
    for (const cv of el.querySelectorAll('canvas')) {
      if (!cv.width || !cv.height) continue;
      const px = cv.getContext('2d').getImageData(0, 0, cv.width, cv.height).data;
      for (let i = 3; i < px.length; i += 4) if (px[i]) n++;
    }
    return n;
  };
  const drawn = (c) => c.g && c.g.numRows() > 0 && painted(c.plot) > 200;
  // A figure is the time its frame was painted: the next frame after what it
  // waits for is in the page (a task after that frame's animation callbacks).
  const wait = new Set();
  const once = (field, then) => {
    if (wait.has(field)) return;
    wait.add(field);
    requestAnimationFrame(() => setTimeout(() => { b[field] = performance.now(); if (then) then(); }, 0));
  };
  const tick = () => {
    const now = performance.now();
    const hash = location.hash;
    const ch = (window.chorus && window.chorus.charts) || [];
    if (hash.startsWith('#/run/') && ch.length) {
      const seen = ch.filter((c) => inView(c.el));
      if (seen.length && seen.every((c) => c.g && c.g.numRows() > 0)) {
        if (b.first === null && seen.every(drawn)) once('first', () => { b.charts = seen.length; });
        if (b.first !== null && b.full === null && seen.every((c) => !/overview/.test(c.status.textContent)) &&
            seen.every(drawn)) once('full', () => { b.fullCharts = seen.length; });
      }
    }
    if (b.runs === null && (hash === '' || hash === '#/')) {
      const rows = document.querySelectorAll('#runs tr.run');
      const all = rows.length >= (window.__bench_runs || 1);
      if (b.screen === null && rows.length && (all || rows[rows.length - 1].getBoundingClientRect().bottom >= innerHeight))
        once('screen');
      if (all) once('runs');
    }
    // Until what this page shows is seen (and never for long): an idle page is left idle.
    const run = hash.startsWith('#/run/'), list = hash === '' || hash === '#/';
    if (((run && b.full === null) || (list && b.runs === null)) && now < 180000) setTimeout(tick, 10);
  };
  setTimeout(tick, 0);
})();
"""


class Browser:
    """A fresh chromium (its own new profile: an empty cache) under chromedriver."""

    def __init__(self):
        chromium = which("chromium", "chromium-browser", "google-chrome")
        driver = which("chromedriver", "/usr/lib/chromium/chromedriver")
        if not chromium or not driver:
            skip("no chromium or chromedriver: apt-get install chromium chromium-driver")
        o = webdriver.ChromeOptions()
        o.binary_location = chromium
        for a in FLAGS:
            o.add_argument(a)
        try:
            self.d = webdriver.Chrome(service=Service(driver), options=o)
        except WebDriverException as e:
            skip(f"chromium did not start under chromedriver: {str(e).splitlines()[0]}")
        self.d.set_script_timeout(120)
        self.d.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument", {"source": WATCH})
        self.d.execute_cdp_cmd("Network.enable", {})
        self.settle()

    def settle(self, quiet_pct=10.0, every_s=0.2, timeout_s=10.0):
        """Until the browser is quiet on a blank page. A fresh chromium keeps 1.5-1.8 of this
        machine's 2 cores busy for 0.4-0.6 s after its first page: a page opened then is
        measured against the browser's own start, which a user's browser, already running
        when the dashboard is opened, does not have. Its cache stays empty."""
        self.d.get("about:blank")
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and idle_cpu(self.processes, every_s)[0] > quiet_pct:
            pass

    def processes(self):
        """chromedriver's descendants: every process of chromium."""
        return descendants(self.d.service.process.pid)

    def open(self, url, runs=None):
        """Navigates to `url` from a blank page; `runs`: how many rows the runs table must hold."""
        self.d.get("about:blank")
        if runs:
            self.d.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument",
                                   {"source": f"window.__bench_runs = {runs};"})
        self.d.get(url)

    def bench(self):
        return self.d.execute_script("return window.__bench || null")

    def wait(self, field, timeout=60.0):
        return wait_until(f"window.__bench.{field}",
                          lambda: (lambda b: b if b and b.get(field) is not None else None)(self.bench()), timeout)[field]

    def screen_painted(self, timeout=10.0):
        """The browser's paint time of the runs list's first screen (WATCH's screenPainted()); None
        where this chromium has no Element Timing (the look every 10 ms is then the only figure)."""
        if self.d.execute_script("return window.__bench.noElementTiming || !window.PerformanceElementTiming"):
            return None
        return wait_until("every row of the first screen painted",
                          lambda: self.d.execute_script("return window.__bench.screenPainted()"), timeout)

    def link(self, mbit=None, latency_ms=1.0):
        """Chromium's network emulation: `mbit` Mbit/s each way and `latency_ms`, or none."""
        if mbit is None:
            self.d.execute_cdp_cmd("Network.emulateNetworkConditions", {
                "offline": False, "latency": 0, "downloadThroughput": -1, "uploadThroughput": -1})
        else:
            bps = mbit * 1e6 / 8
            self.d.execute_cdp_cmd("Network.emulateNetworkConditions", {
                "offline": False, "latency": latency_ms, "downloadThroughput": bps, "uploadThroughput": bps})

    def quit(self):
        try:
            self.d.quit()
        except Exception:
            pass


RESOURCES = """
return performance.getEntriesByType('resource').map((e) => ({ name: e.name.replace(location.origin, ''),
  start: e.startTime, firstByte: e.responseStart, end: e.responseEnd }));
"""


def answered(b, prefix, until=None, last=True):
    """When the last (or the first) answer whose address starts with `prefix`, of those whole by `until`
    where given, was whole; None where there is none."""
    ends = [e["end"] for e in b.d.execute_script(RESOURCES)
            if e["name"].startswith(prefix) and (until is None or e["end"] <= until)]
    return (max(ends) if last else min(ends)) if ends else None


def descendants(pid):
    children = {}
    for e in os.listdir("/proc"):
        if not e.isdigit():
            continue
        try:
            with open(f"/proc/{e}/stat") as f:
                st = f.read()
        except OSError:
            continue
        ppid = int(st[st.rindex(")") + 2:].split()[1])
        children.setdefault(ppid, []).append(int(e))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        for c in children.get(p, []):
            out.append(c)
            todo.append(c)
    return out


def cpu_ticks(pid):
    """utime + stime of a process (clock ticks), or None where it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            st = f.read()
    except OSError:
        return None
    fields = st[st.rindex(")") + 2:].split()
    return int(fields[11]) + int(fields[12])


# ---------- the page cache ----------

def files_under(root):
    for d, _, names in os.walk(root):
        for n in names:
            yield os.path.join(d, n)


def evict(root):
    """Drops every file under `root` from the page cache (written back first)."""
    for p in files_under(root):
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fdatasync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def warm(root):
    """Reads every file under `root`, so that it is in the page cache."""
    for p in files_under(root):
        with open(p, "rb") as f:
            while f.read(1 << 22):
                pass


def cached_mib(root):
    """MiB of the files under `root` in the page cache (mincore, through util-linux's fincore), or None."""
    if not shutil.which("fincore"):
        return None
    total = 0
    paths = list(files_under(root))
    for i in range(0, len(paths), 200):
        out = subprocess.run(["fincore", "--bytes", "--noheadings", "--output", "RES", *paths[i:i + 200]],
                             capture_output=True, text=True).stdout
        total += sum(int(x) for x in out.split() if x.isdigit())
    return total / (1 << 20)


# ---------- the figures ----------

class Results:
    """Figures by name and binary: each try's value."""

    def __init__(self, names):
        self.names = names
        self.rows = []  # (figure, unit, {name: [values]}, note)
        self.index = {}

    def add(self, figure, name, value, unit="ms", note=""):
        if figure not in self.index:
            self.index[figure] = len(self.rows)
            self.rows.append([figure, unit, {n: [] for n in self.names}, note])
        row = self.rows[self.index[figure]]
        row[2][name].append(value)
        if note:
            row[3] = note
        print(f"  {figure} [{name}]: {fmt(value, unit)}", flush=True)

    def table(self):
        head = ["figure"] + [f"{n} (median; tries)" for n in self.names]
        if len(self.names) > 1:
            head.append(f"{self.names[-1]} / {self.names[0]}")
        lines = [head]
        for figure, unit, values, note in self.rows:
            cells = [figure]
            meds = []
            for n in self.names:
                v = values[n]
                if not v:
                    cells.append("-")
                    meds.append(None)
                    continue
                if isinstance(v[0], str):
                    cells.append(" / ".join(sorted(set(v))))
                    meds.append(None)
                    continue
                m = statistics.median(v)
                meds.append(m)
                cells.append(f"{fmt(m, unit)} ({', '.join(fmt(x, unit, bare=True) for x in v)})")
            if len(self.names) > 1:
                a, b = meds[0], meds[-1]
                cells.append(f"{b / a:.2f}" if a and b is not None else "-")
            lines.append(cells)
        w = [max(len(r[i]) for r in lines) for i in range(len(head))]
        out = []
        for i, r in enumerate(lines):
            out.append(" | ".join(c.ljust(w[j]) for j, c in enumerate(r)))
            if i == 0:
                out.append("-+-".join("-" * x for x in w))
        notes = [f"  {f}: {n}" for f, _, _, n in self.rows if n]
        return "\n".join(out) + ("\n\nnotes:\n" + "\n".join(notes) if notes else "")


def fmt(v, unit, bare=False):
    if isinstance(v, str):
        return v
    if unit == "ms":
        s = f"{v:.0f}" if v >= 10 else f"{v:.1f}"
    elif unit == "%":
        s = f"{v:.2f}"
    elif unit == "KiB":
        s = f"{v:.1f}"
    else:
        s = f"{v:g}"
    return s if bare else f"{s} {unit}"


def keeps_indexes(chorus):
    """Whether this `chorus serve` keeps indexes on disk (--index-dir)."""
    out = subprocess.run([chorus, "serve", "--help"], capture_output=True, text=True)
    return "--index-dir" in out.stdout + out.stderr


def paint(names, binaries, data, tries, r):
    big = os.path.join(data, "big")
    # Each binary that keeps indexes keeps them in a directory of its own here.
    kept = {n: os.path.join(data, "kept-index-" + n) if keeps_indexes(binaries[n]) else None for n in names}
    # (page cache, whether the run was opened before): opened before, a server
    # that keeps indexes takes the one it kept; a first opening has none.
    states = [("warm", False), ("warm", True), ("cold", True), ("cold", False)]
    for t in range(tries):
        for cache, before in states:
            state = cache + ("" if before else ", first opening")
            for n in names:
                if kept[n] and not before:
                    shutil.rmtree(kept[n], ignore_errors=True)
                if cache == "warm":
                    warm(big)
                    if kept[n] and os.path.isdir(kept[n]):
                        warm(kept[n])
                else:
                    evict(big)
                    if kept[n] and os.path.isdir(kept[n]):
                        evict(kept[n])
                left = cached_mib(big)
                s = Serve(binaries[n], big, kept=kept[n])
                b = Browser()
                try:
                    b.open(s.at("127.0.0.1", "#/run/" + BIG_RUN))
                    first = b.wait("first")
                    full = b.wait("full", timeout=120)
                    # The charts in view may be whole before the index is: the next
                    # series ("run opened before") takes the index this one kept.
                    s.wait_indexed(BIG_RUN)
                    charts = b.bench()["charts"]
                    run_end = answered(b, "/api/run?", last=False)
                    series_end = answered(b, "/api/series?", first)
                    r.add(f"first paint, {state}", n, first,
                          note=f"{charts} charts in view" if cache == "warm" else
                          ("" if left is None else f"after eviction {left:.1f} MiB of the run's files were in the page cache"))
                    r.add(f"full resolution, {state}", n, full)
                    if run_end is not None:
                        r.add(f"  of the first paint, {state}: /api/run answered", n, run_end)
                    if series_end is not None:
                        r.add(f"  of the first paint, {state}: the last series drawn answered", n, series_end)
                    # The charts in view asked again at full resolution: when, and when answered.
                    exact = [e for e in b.d.execute_script(RESOURCES)
                             if e["name"].startswith("/api/series?") and "exact=1" in e["name"]]
                    if exact:
                        r.add(f"  of the full resolution, {state}: asked", n, min(e["start"] for e in exact))
                        r.add(f"  of the full resolution, {state}: its first byte", n, max(e["firstByte"] for e in exact))
                        r.add(f"  of the full resolution, {state}: answered", n, max(e["end"] for e in exact))
                    if cache == "warm" and before:
                        # The same page again, from the same browser: its files from the browser's cache.
                        time.sleep(1)
                        b.open(s.at("127.0.0.1", "#/run/" + BIG_RUN))
                        r.add("reopened: first paint", n, b.wait("first"))
                finally:
                    b.quit()
                    s.stop()  # a server that keeps indexes writes what it has left on its way out


APPEAR = r"""
const path = arguments[0];
window.__appear = null;
const look = () => {
  if (window.__appear === null && document.querySelector(`#runs tr.run[data-path="${path}"]`)) window.__appear = Date.now();
};
new MutationObserver(look).observe(document.body, { childList: true, subtree: true });
"""


def idle_cpu(pids_of, seconds):
    """% of a core that the processes pids_of() names took over `seconds` (those that came and went meanwhile aside)."""
    pids = pids_of()
    before = {p: cpu_ticks(p) for p in pids}
    t1 = time.monotonic()
    time.sleep(seconds)
    el = time.monotonic() - t1
    used = 0
    for p in set(pids) | set(pids_of()):
        now = cpu_ticks(p)
        if now is not None:
            used += now - (before.get(p) or 0)
    return 100 * used / os.sysconf("SC_CLK_TCK") / el, el


def runs(names, binaries, data, tries, idle_s, r):
    many = os.path.join(data, "many")
    warm(many)
    # What chromium takes on a blank page, for reference.
    b = Browser()
    try:
        b.d.get("about:blank")
        time.sleep(3)
        blank, _ = idle_cpu(b.processes, idle_s)
        print(f"  chromium alone, on a blank page: {blank:.2f} % of a core over {idle_s:.0f} s", flush=True)
    finally:
        b.quit()
    for t in range(tries):
        for n in names:
            s = Serve(binaries[n], many)
            b = Browser()
            try:
                b.open(s.at("127.0.0.1"), runs=MANY)
                polled = b.wait("screen")
                r.add("runs list of 1,000 runs, every row", n, b.wait("runs"))
                painted = b.screen_painted()
                r.add("runs list of 1,000 runs, its first screen", n, polled if painted is None else painted,
                      note="" if painted is not None else "no Element Timing here: as a look every 10 ms saw it")
                r.add("  ... as a look every 10 ms saw it", n, polled)
                end = answered(b, "/api/runs", last=False)
                if end is not None:
                    r.add("  of which /api/runs answered", n, end)
                b.open(s.at("127.0.0.1"), runs=MANY)
                polled = b.wait("screen")
                every = b.wait("runs")
                painted = b.screen_painted()
                r.add("runs list of 1,000 runs, reopened, its first screen", n, polled if painted is None else painted)
                r.add("  ... reopened, as a look every 10 ms saw it", n, polled)
                r.add("runs list of 1,000 runs, reopened, every row", n, every)
                # A new run: its directory and run.json, as a run host makes them.
                time.sleep(1)
                rel = f"bench/g{t % 10}/new-{n}-{t}"
                d = os.path.join(many, rel)
                b.d.execute_script(APPEAR, rel)
                t0 = time.time()
                os.makedirs(d)
                with open(os.path.join(d, "run.json.tmp"), "w") as f:
                    f.write(json.dumps({"id": os.path.basename(rel), "name": os.path.basename(rel), "project": "bench",
                                        "group": f"g{t % 10}", "mode": "shared", "scope": "global", "host": "bench",
                                        "pid": 1, "state": "finished", "start_time": 1_800_000_000.0,
                                        "end_time": 1_800_000_010.0, "world_size": 1, "rows": 0, "rejected": 0,
                                        "ranks": []}) + "\n")
                os.rename(os.path.join(d, "run.json.tmp"), os.path.join(d, "run.json"))
                seen = wait_until("the new run listed", lambda: b.d.execute_script("return window.__appear"), 30)
                r.add("a new run listed, after its directory is made", n, seen - t0 * 1000)
                if t == 0:
                    # Idle: the list open, nothing changing.
                    time.sleep(3)
                    server0 = cpu_ticks(s.p.pid)
                    both, el = idle_cpu(lambda: [s.p.pid] + b.processes(), idle_s)
                    server = 100 * (cpu_ticks(s.p.pid) - server0) / os.sysconf("SC_CLK_TCK") / el
                    r.add("idle runs list: server + chromium, % of a core", n, both, unit="%",
                          note=f"over {el:.0f} s; chromium alone on a blank page: {blank:.2f} %")
                    r.add("idle runs list: the server alone, % of a core", n, server, unit="%")
            finally:
                b.quit()
                s.stop()
                for g in os.listdir(os.path.join(many, "bench")):
                    for e in os.listdir(os.path.join(many, "bench", g)):
                        if e.startswith("new-"):
                            shutil.rmtree(os.path.join(many, "bench", g, e))


FETCH = r"""
const [url, tries, done] = arguments;
(async () => {
  const out = [];
  for (let i = 0; i < tries; i++) {
    performance.clearResourceTimings();
    const t0 = performance.now();
    const res = await fetch(url, { cache: 'no-store', credentials: 'same-origin' });
    const body = await res.arrayBuffer();
    const t1 = performance.now();
    const e = performance.getEntriesByType('resource').filter((x) => x.name.endsWith(url) || x.name === url).pop() || {};
    out.push({ ms: t1 - t0, status: res.status, coding: res.headers.get('content-encoding') || 'identity',
               encoded: e.encodedBodySize, decoded: body.byteLength });
  }
  return out;
})().then(done, (e) => done({ error: String(e) }));
"""


def own_address():
    """This machine's address on its default route (not loopback): a UDP socket's, connected (nothing is sent)."""
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        s.connect(("8.8.8.8", 9))
        a = s.getsockname()[0]
    except OSError:
        a = None
    finally:
        s.close()
    if not a or a.startswith("127."):
        out = subprocess.run(["hostname", "-I"], capture_output=True, text=True).stdout.split()
        a = next((x for x in out if not x.startswith("127.") and ":" not in x), None)
    return a


def transfer(names, binaries, data, tries, r, mbit):
    here = own_address()
    if not here:
        print("transfer: this machine has no address but loopback: skipped", flush=True)
        return
    series = ("/api/series?run=bench%2Fg%2Fbig" + "".join(f"&key=step_time%2Frank-{i}" for i in range(4)) +
              "&width=700")
    places = [("loopback", "127.0.0.1", None), (f"{here}", here, None),
              (f"loopback at {mbit} Mbit/s", "127.0.0.1", mbit), (f"{here} at {mbit} Mbit/s", here, mbit)]
    for n in names:
        big = Serve(binaries[n], os.path.join(data, "big"), host="0.0.0.0")
        many = Serve(binaries[n], os.path.join(data, "many"), host="0.0.0.0")
        b = Browser()
        try:
            # The big run's index whole first, so that each series asked is the same work.
            b.open(big.at("127.0.0.1", "#/run/" + BIG_RUN))
            b.wait("full", timeout=120)
            dygraph = b.d.execute_script(
                "const s = [...document.scripts].find((x) => /dygraph/.test(x.src)); return s ? new URL(s.src).pathname : null")
            for label, address, link in places:
                for srv, what, path in ((big, "a chart's series (4 keys, 700 px)", series),
                                        (big, "dygraph.min.js", dygraph),
                                        (many, "runs list of 1,000 runs", "/api/runs")):
                    b.link(None)
                    b.open(srv.at(address, "#/group/none/none"))
                    b.link(link)
                    got = b.d.execute_async_script(FETCH, path, tries)
                    b.link(None)
                    if isinstance(got, dict):
                        raise AssertionError(f"fetch {path} at {address}: {got['error']}")
                    for g in got:
                        if g["status"] != 200:
                            raise AssertionError(f"fetch {path} at {address}: status {g['status']}")
                        r.add(f"{what}, {label}: to the last byte", n, g["ms"])
                    r.add(f"{what}, {label}: the fastest", n, min(g["ms"] for g in got))
                    sent = statistics.median(g["encoded"] or 0 for g in got) / 1024
                    r.add(f"{what}, {label}: coding", n, got[0]["coding"], unit="")
                    r.add(f"{what}, {label}: KiB sent (of {got[0]['decoded'] / 1024:.0f})", n, sent, unit="KiB")
            # A client that asks for Brotli where chromium does not (over plain HTTP it offers br to
            # loopback only): curl, a new connection each time, at full speed (its --limit-rate lets a
            # short answer's first bytes through at full speed, so it stands for no link).
            if shutil.which("curl"):
                for label, address, link in places:
                    if link:
                        continue
                    for srv, what, path in ((big, "a chart's series (4 keys, 700 px)", series),
                                            (many, "runs list of 1,000 runs", "/api/runs")):
                        for _ in range(tries):
                            ms, coding, size = curl(f"http://{address}:{srv.port}{path}", srv.port)
                            r.add(f"curl (br): {what}, {label}: to the last byte", n, ms)
                        r.add(f"curl (br): {what}, {label}: coding", n, coding, unit="")
                        r.add(f"curl (br): {what}, {label}: KiB sent", n, size / 1024, unit="KiB")
        finally:
            b.link(None)
            b.quit()
            big.stop()
            many.stop()


def curl(url, port):
    """GET `url` as curl does with `Accept-Encoding: gzip, deflate, br`: ms to the last byte, the coding, the bytes sent."""
    args = ["curl", "-s", "-o", "/dev/null", "-D", "-", "-H", "Accept-Encoding: gzip, deflate, br",
            "-H", f"Cookie: chorus_token_{port}={TOKEN}", "-w", "\n%{time_total} %{size_download}\n", url]
    out = subprocess.run(args, capture_output=True, text=True, check=True).stdout
    m = re.search(r"(?im)^content-encoding:\s*(\S+)", out)
    total, size = out.strip().splitlines()[-1].split()
    return float(total) * 1000, m.group(1) if m else "identity", int(size)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--chorus", action="append", required=True, help="NAME=PATH or PATH; several are compared")
    ap.add_argument("--data", required=True, help="what `bench_serve --write DATA` wrote (DATA/big, DATA/many)")
    ap.add_argument("--tries", type=int, default=3, help="tries of each page figure (default 3)")
    ap.add_argument("--fetches", type=int, default=5, help="fetches of each answer in `transfer` (default 5)")
    ap.add_argument("--idle-s", type=float, default=30, help="how long the idle runs list is watched (default 30)")
    ap.add_argument("--mbit", type=float, default=100, help="the emulated link's speed (default 100)")
    ap.add_argument("--only", default="paint,runs,transfer", help="which parts: paint, runs, transfer")
    ap.add_argument("--json", help="also write every try's figures here")
    a = ap.parse_args()
    binaries = {}
    for c in a.chorus:
        name, _, path = c.rpartition("=")
        name = name or f"chorus{len(binaries) + 1}"
        if not os.access(path, os.X_OK):
            sys.exit(f"serve_browser_bench: {path} is not an executable")
        binaries[name] = os.path.abspath(path)
    names = list(binaries)
    for sub in ("big", "many"):
        if not os.path.isdir(os.path.join(a.data, sub)):
            sys.exit(f"serve_browser_bench: no {sub}/ in {a.data}: write it with `bench_serve --write {a.data}`")
    with open("/proc/loadavg") as f:
        print(f"load average at the start: {f.read().split()[0]}; binaries: " +
              ", ".join(f"{n}={p}" for n, p in binaries.items()), flush=True)
    r = Results(names)
    parts = a.only.split(",")
    if "paint" in parts:
        paint(names, binaries, a.data, a.tries, r)
    if "runs" in parts:
        runs(names, binaries, a.data, a.tries, a.idle_s, r)
    if "transfer" in parts:
        transfer(names, binaries, a.data, a.fetches, r, a.mbit)
    with open("/proc/loadavg") as f:
        print(f"\nload average at the end: {f.read().split()[0]}\n")
    print(r.table())
    if a.json:
        with open(a.json, "w") as f:
            json.dump([{"figure": fig, "unit": u, "values": v, "note": note} for fig, u, v, note in r.rows], f, indent=1)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""The page of `chorus serve` in a real browser: Debian's headless chromium
driven through selenium (python3-selenium, chromium-driver), against a
`chorus serve` over run directories written here by hand.

    dashboard_test.py CASE --chorus PATH/TO/chorus [--worker W --barrier-worker B [--ddp-train D]]

CASE is one of: runs_list, run_charts, live, compare, token, histograms, media (in
media_case.py), events (in events_case.py), laggards, contributions, nonfinite, ticks,
smooth, summary, log_zeros, last_point (in truth_case.py; laggards and contributions
run chorus_e2e_worker, chorus_e2e_barrier_worker and ddp_train under `chorus launch`,
given their paths). Screenshots are saved in the working
directory (ctest runs it in tests/browser/ of the build tree). Exits 77 (ctest's
SKIP) where selenium or chromium cannot start.
"""
import argparse
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time

SKIP = 77
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-background-networking",
         "--window-size=1400,1000"]


def skip(why):
    print("SKIP: " + why, flush=True)
    sys.exit(SKIP)


try:
    from selenium import webdriver
    from selenium.common.exceptions import WebDriverException
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By
except ImportError as e:
    skip(f"selenium cannot be imported ({e}): apt-get install python3-selenium")


def which(*names):
    for n in names:
        p = shutil.which(n)
        if p:
            return p
        if os.path.isfile(n) and os.access(n, os.X_OK):
            return n
    return None


# ---------- run directories, as a run host leaves them ----------

START = 1_700_000_000.0


def write(path, text):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)


def run_json(run_id, name, project, group, state="finished", world=2, crashed=(), last_step=199, start=START, ended=True):
    ranks = [{"rank": r, "state": "crashed" if r in crashed else ("running" if state == "running" else "finished"),
              "last_step": 41 if r in crashed else last_step, "host": "node-a",
              "message": "heartbeat lost" if r in crashed else ""} for r in range(world)]
    return json.dumps({"id": run_id, "name": name, "project": project, "group": group, "mode": "shared",
                       "scope": "global", "host": "node-a", "pid": 2147483000, "state": state,
                       "start_time": start, "end_time": start + 300 if ended else None, "world_size": world,
                       "rows": 200, "rejected": 0, "ranks": ranks}) + "\n"


def history_rows(first, last, ranks=2, scale=1.0, epochs=False):
    out = []
    for s in range(first, last):
        row = {"_step": s, "_timestamp": START + s, "_runtime": float(s), "loss": scale * 2 * math.exp(-s / 60),
               "lr": 0.001 * (1 - s / 400)}
        if epochs:
            row["epoch"] = s / 20
        for r in range(ranks):
            row[f"acc/rank-{r}"] = s * 0.004 + r * 0.1
        row["_count"] = {"loss": ranks}
        out.append(json.dumps(row))
    return "\n".join(out) + "\n"


def make_run(root, project, group, run_id, name=None, rows=200, scale=1.0, epochs=False, **kw):
    """A run; with `epochs`, an `epoch` key (the step / 20) that metrics.json declares loss's step metric."""
    d = os.path.join(root, project, group, run_id)
    write(os.path.join(d, "run.json"), run_json(run_id, name or run_id, project, group, **kw))
    write(os.path.join(d, "history.jsonl"), history_rows(0, rows, kw.get("world", 2), scale, epochs))
    if epochs:
        write(os.path.join(d, "metrics.json"),
              json.dumps({"loss": {"reduce": "mean", "summary": "min", "step_metric": "epoch"}}) + "\n")
    write(os.path.join(d, "config.json"), json.dumps({"lr": 0.001, "optimizer": "adam"}))
    write(os.path.join(d, "summary.json"), json.dumps({"_step": rows - 1, "loss": 0.05}))
    sys_lines = []
    for t in range(0, 200, 10):
        for r in range(kw.get("world", 2)):
            sys_lines.append(json.dumps({"_timestamp": START + t + r * 0.01, "_runtime": t, "_node": 0, "_rank": r,
                                         "system.cpu.percent/node-0": 40 + t / 10,
                                         f"system.proc.cpu.percent/rank-{r}": 20 + r * 5 + t / 20}))
    write(os.path.join(d, "system.jsonl"), "\n".join(sys_lines) + "\n")
    return d


def bucket_index(x):
    """The bucket of a finite x in chorus::Histogram's layout (README, "Histograms"): 0 for |x| < 2^-126,
    else 1 + 128 (e + 126) + m for x's binary exponent e and the 7 bits m after its leading one, negated below 0."""
    if abs(x) < 2.0 ** -126:
        return 0
    m, e = math.frexp(abs(x))  # |x| = m 2^e, m in [0.5, 1)
    k = (e - 1 + 126) * 128 + int((2 * m - 1) * 128)
    return k + 1 if x > 0 else -(k + 1)


def histogram_line(step, key, rank, values, ranks=None):
    """A histograms.jsonl line of finite `values`, as the RunWriter writes it."""
    buckets = {}
    for v in values:
        i = bucket_index(v)
        buckets[i] = buckets.get(i, 0) + 1
    line = {"_step": step, "_timestamp": START + step, "_runtime": float(step), "key": key, "rank": rank}
    if ranks:
        line["_count"] = ranks
    line.update({"count": len(values), "sum": math.fsum(values), "min": min(values), "max": max(values), "nan": 0,
                 "inf": 0, "-inf": 0, "buckets": [[i, n] for i, n in sorted(buckets.items())]})
    return json.dumps(line) + "\n"


def histogram_lines(first, last):
    """grad, merged and a column per rank, widening with the step; act a column per rank only."""
    import random
    out = []
    for s in range(first, last):
        rnd = random.Random(s)
        ranks = [[rnd.gauss(0.02 * s + r, 1 + s / 40) for _ in range(400)] for r in range(2)]
        out.append(histogram_line(s, "grad", None, ranks[0] + ranks[1], ranks=2))
        for r in range(2):
            out.append(histogram_line(s, "grad", r, ranks[r]))
            out.append(histogram_line(s, "act", r, [abs(v) for v in ranks[r]]))
    return "".join(out)


# ---------- the server and the browser ----------

class Serve:
    def __init__(self, chorus, root, *extra):
        self.p = subprocess.Popen([chorus, "serve", root, "--port", "0", *extra], stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True)
        self.url = None
        deadline = time.time() + 30
        for line in self.p.stdout:
            m = re.search(r"http://\S+", line)
            if m:
                self.url = m.group(0)
                break
            if time.time() > deadline:
                break
        if not self.url:
            self.stop()
            raise AssertionError(f"{chorus} serve printed no address")
        self.port = int(re.search(r":(\d+)/", self.url).group(1))
        # What it prints later must not fill the pipe.
        threading.Thread(target=lambda: [None for _ in self.p.stdout], daemon=True).start()

    def stop(self):
        self.p.terminate()
        try:
            self.p.wait(20)
        except subprocess.TimeoutExpired:
            self.p.kill()
            self.p.wait()


def browser():
    chromium = which("chromium", "chromium-browser", "google-chrome")
    driver = which("chromedriver", "/usr/lib/chromium/chromedriver")
    if not chromium or not driver:
        skip("no chromium or chromedriver: apt-get install chromium chromium-driver")
    o = webdriver.ChromeOptions()
    o.binary_location = chromium
    for a in FLAGS:
        o.add_argument(a)
    o.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    try:
        return webdriver.Chrome(service=Service(driver), options=o)
    except WebDriverException as e:
        skip(f"chromium did not start under chromedriver: {str(e).splitlines()[0]}")


def wait_until(what, fn, timeout=30.0, every=0.1):
    """Polls fn() every `every` s until it is true; fails naming `what` after `timeout` seconds."""
    deadline = time.time() + timeout
    last = None
    while time.time() < deadline:
        try:
            last = fn()
            if last:
                return last
        except WebDriverException as e:
            last = e
        time.sleep(every)
    raise AssertionError(f"waited {timeout:.0f} s for {what}; last: {last!r}")


def js_errors(d):
    """The page's console errors (a 404 of a source map aside)."""
    try:
        logs = d.get_log("browser")
    except WebDriverException:
        return []
    return [e["message"] for e in logs if e["level"] == "SEVERE" and ".map" not in e["message"]]


# The pixels a chart's canvases have painted.
PAINTED = """
function painted(el) {
  let n = 0;
  for (const cv of el.querySelectorAll('canvas')) {
    const px = cv.getContext('2d').getImageData(0, 0, cv.width, cv.height).data;
    for (let i = 3; i < px.length; i += 4) if (px[i]) n++;
  }
  return n;
}
"""

CHART = PAINTED + """
const c = window.chorus.charts.find((c) => c.title === arguments[0]);
if (!c || !c.g) return null;
return {rows: c.g.numRows(), painted: painted(c.plot), labels: c.g.getLabels(), legend: c.legend.textContent,
        toggles: c.toggles.textContent, last: c.g.xAxisExtremes()[1], sources: c.sources.length};
"""


def chart(d, title):
    return d.execute_script(CHART, title)


def x_of(d, title):
    """The chart's x: what it was drawn against, the axis label shown, and its last x."""
    return d.execute_script("const c = window.chorus.charts.find((c) => c.title === arguments[0]);"
                            "if (!c || !c.g) return null;"
                            "const l = c.el.querySelector('.dygraph-xlabel');"
                            "return {used: c.axisUsed, label: l ? l.textContent : null, last: c.g.xAxisExtremes()[1],"
                            "        rows: c.g.numRows(), status: c.status.textContent};", title)


def drawn(d, title, rows=1):
    """Waits for the chart `title` to be drawn: rows of data and painted pixels."""
    d.execute_script("const c = window.chorus.charts.find((c) => c.title === arguments[0]); if (c) c.el.scrollIntoView();",
                     title)
    return wait_until(f"chart {title!r} drawn", lambda: (lambda c: c if c and c["rows"] >= rows and c["painted"] > 200
                                                         else None)(chart(d, title)))


# ---------- the cases ----------

def case_runs_list(chorus, root, d):
    make_run(root, "mnist", "job-1", "aaa111", name="baseline", start=START)
    make_run(root, "mnist", "job-1", "bbb222", name="wider", start=START + 1000, state="failed")
    make_run(root, "cifar", "job-2", "ccc333", name="resnet", start=START + 500, world=4, crashed=(2,))
    s = Serve(chorus, root)
    try:
        d.get(s.url)
        rows = wait_until("three runs listed", lambda: (lambda r: r if len(r) == 3 else None)(
            d.find_elements(By.CSS_SELECTOR, "#runs tr.run")))
        text = d.find_element(By.ID, "runs").text
        for word in ["baseline", "wider", "resnet", "failed", "finished", "mnist", "job-1", "cifar"]:
            assert word in text, f"{word!r} not in the runs list:\n{text}"
        # Newest first within a group.
        paths = [r.get_attribute("data-path") for r in rows]
        assert paths.index("mnist/job-1/bbb222") < paths.index("mnist/job-1/aaa111"), paths
        d.save_screenshot("runs_list.png")
        # The filter box and the state list.
        d.find_element(By.ID, "filter").send_keys("resnet")
        wait_until("the filter to leave one run", lambda: len(d.find_elements(By.CSS_SELECTOR, "#runs tr.run")) == 1)
        d.find_element(By.ID, "filter").clear()
        d.execute_script("const f = document.getElementById('filter'); f.value = ''; f.dispatchEvent(new Event('input'));")
        d.execute_script("const s = document.getElementById('state-filter'); s.value = 'failed'; s.dispatchEvent(new Event('change'));")
        wait_until("the state list to leave the failed run", lambda: [r.get_attribute("data-path") for r in d.find_elements(
            By.CSS_SELECTOR, "#runs tr.run")] == ["mnist/job-1/bbb222"])
        d.save_screenshot("runs_list_filtered.png")
        # A run's name leads to its page.
        d.execute_script("const s = document.getElementById('state-filter'); s.value = ''; s.dispatchEvent(new Event('change'));")
        d.find_element(By.LINK_TEXT, "resnet").click()
        wait_until("the run's page", lambda: "resnet" in d.find_element(By.ID, "run-head").text)
        errors = js_errors(d)
        assert not errors, errors
    finally:
        s.stop()


def case_run_charts(chorus, root, d):
    run = make_run(root, "mnist", "job-1", "exp1", name="exp1", world=2, crashed=(1,), epochs=True)
    # Two barriers: rank 1 came last to the first, never reached the second.
    write(os.path.join(run, "barriers.jsonl"), "\n".join(json.dumps(b) for b in [
        {"name": "epoch-0", "index": 0, "step": 9, "opened": START + 10, "released": START + 12.5, "error": None,
         "ranks": [{"rank": 0, "arrived": START + 10, "waited": 2.5}, {"rank": 1, "arrived": START + 12.5, "waited": 0}]},
        {"name": "epoch-1", "index": 1, "step": 19, "opened": START + 20, "released": START + 25,
         "error": "barrier \"epoch-1\" timed out after 5000 ms: rank 1 did not reach it",
         "ranks": [{"rank": 0, "arrived": START + 20, "waited": 5}, {"rank": 1, "arrived": None, "waited": None}]},
    ]) + "\n")
    s = Serve(chorus, root)
    try:
        d.get(s.url + "#/run/mnist/job-1/exp1")
        wait_until("the ranks table", lambda: "heartbeat lost" in d.find_element(By.ID, "ranks-table").text)
        # Rank 1 held rank 0 back: marked in the ranks table; each barrier's waits listed.
        lag = wait_until("the laggard marked", lambda: d.find_elements(By.CSS_SELECTOR, "#ranks-table tr.laggard"))
        assert [r.get_attribute("data-rank") for r in lag] == ["1"], [r.text for r in lag]
        assert "waited 7.500 s for it" in lag[0].text, lag[0].text
        waits = d.find_element(By.ID, "barrier-waits").text
        for word in ["epoch-0", "epoch-1", "2.500 s", "5.000 s", "never came", "timed out"]:
            assert word in waits, f"{word!r} not in the barriers table:\n{waits}"
        d.execute_script("document.getElementById('barriers').scrollIntoView()")
        d.save_screenshot("run_barriers.png")
        for title in ["loss", "lr", "acc"]:
            c = drawn(d, title, rows=200)
            assert c["rows"] == 200, c
        acc = chart(d, "acc")
        for name in ["acc/rank-0", "acc/rank-1"]:
            assert name in acc["toggles"] and name in acc["legend"], acc
        assert "loss" in chart(d, "loss")["toggles"]
        # loss is declared with the step metric epoch: drawn against it, labelled so; lr against the step.
        x = x_of(d, "loss")
        assert x["used"] == "key:epoch" and x["label"] == "epoch" and x["last"] == 199 / 20, x
        assert "against epoch" in x["status"], x
        x = x_of(d, "lr")
        assert x["used"] == "step" and x["label"] == "step" and x["last"] == 199, x
        # Its summary is its min, and says so.
        wait_until("the summary's declaration", lambda: "(min)" in d.find_element(By.CSS_SELECTOR, "#overview").text)
        d.execute_script("window.chorus.charts.find((c) => c.title === 'acc').el.scrollIntoView()")
        time.sleep(0.3)
        d.save_screenshot("run_charts.png")
        # Values on hover.
        plot = d.execute_script("return window.chorus.charts.find((c) => c.title === 'loss').plot")
        ActionChains(d).move_to_element(plot).perform()
        wait_until("a value under the pointer", lambda: re.search(r"loss:\s*-?[0-9.]", chart(d, "loss")["legend"]))
        # Smoothing, log scale and the x axis redraw the charts.
        d.execute_script("const s = document.getElementById('smooth'); s.value = 0.9; s.dispatchEvent(new Event('input'));")
        d.execute_script("const l = document.getElementById('logscale'); l.click();")
        drawn(d, "loss", rows=200)
        d.execute_script("const c = window.chorus.charts.find((c) => c.title === 'loss'); c.el.scrollIntoView();")
        d.save_screenshot("run_charts_step_metric.png")
        # The x selector still draws it against the step, and back.
        d.execute_script("const x = document.getElementById('xaxis'); x.value = '_step'; x.dispatchEvent(new Event('change'));")
        wait_until("loss against the step", lambda: (lambda x: x if x and x["used"] == "step" and x["label"] == "step"
                                                     and x["last"] == 199 and x["rows"] == 200 else None)(x_of(d, "loss")))
        d.execute_script("const x = document.getElementById('xaxis'); x.value = 'step'; x.dispatchEvent(new Event('change'));")
        wait_until("loss against epoch again", lambda: (lambda x: x if x and x["label"] == "epoch" and x["rows"] == 200
                                                        else None)(x_of(d, "loss")))
        d.execute_script("const x = document.getElementById('xaxis'); x.value = 'wall'; x.dispatchEvent(new Event('change'));")
        wait_until("wall-time x", lambda: d.execute_script(
            "const c = window.chorus.charts.find((c) => c.title === 'loss'); return c.axisUsed === 'wall' && c.g.numRows() === 200"))
        d.save_screenshot("run_charts_smoothed.png")
        # System metrics per node and per rank, and the distributed view.
        drawn(d, "cpu.percent")
        c = drawn(d, "proc.cpu.percent")
        assert "rank-0" in c["toggles"] and "rank-1" in c["toggles"], c
        p = drawn(d, "progress: step over time")
        assert "rank 0" in p["toggles"] and "rank 1" in p["toggles"], p
        wait_until("the crashed rank marked", lambda: d.execute_script(
            "return window.chorus.charts.find((c) => c.title === 'progress: step over time').g.annotations().length") == 1)
        d.save_screenshot("run_distributed.png")
        errors = js_errors(d)
        assert not errors, errors
    finally:
        s.stop()


def case_live(chorus, root, d):
    run = make_run(root, "mnist", "job-1", "live1", name="live1", state="running", ended=False, rows=50)
    s = Serve(chorus, root)
    try:
        d.get(s.url + "#/run/mnist/job-1/live1")
        c = drawn(d, "loss", rows=50)
        assert c["last"] == 49, c
        wait_until("the live stream", lambda: d.find_element(By.ID, "live").text == "live")
        # The job goes on: 30 more rows, and a rank crashes.
        with open(os.path.join(run, "history.jsonl"), "a") as f:
            f.write(history_rows(50, 80))
        write(os.path.join(run, "run.json"), run_json("live1", "live1", "mnist", "job-1", state="running",
                                                      crashed=(1,), ended=False, last_step=79))
        wait_until("the new rows in the chart", lambda: chart(d, "loss")["last"] == 79)
        wait_until("the new last step", lambda: "last step 79" in d.find_element(By.ID, "progress").text)
        wait_until("the crashed rank", lambda: "crashed" in d.find_element(By.ID, "ranks-table").text)
        d.save_screenshot("live.png")
        # A row being written (no newline yet) is not shown until it is whole.
        with open(os.path.join(run, "history.jsonl"), "a") as f:
            f.write(history_rows(80, 81).rstrip("\n"))
        time.sleep(2)
        assert chart(d, "loss")["last"] == 79
        with open(os.path.join(run, "history.jsonl"), "a") as f:
            f.write("\n")
        wait_until("the finished row", lambda: chart(d, "loss")["last"] == 80)
        errors = js_errors(d)
        assert not errors, errors
    finally:
        s.stop()


def case_compare(chorus, root, d):
    # Only baseline declares loss's step metric: the runs disagree, so loss is drawn against the step.
    make_run(root, "mnist", "job-1", "aaa111", name="baseline", start=START, epochs=True)
    make_run(root, "cifar", "job-2", "bbb222", name="challenger", start=START + 100, scale=0.5)
    s = Serve(chorus, root)
    try:
        d.get(s.url)
        wait_until("two runs listed", lambda: len(d.find_elements(By.CSS_SELECTOR, "#runs tr.run")) == 2)
        for box in d.find_elements(By.CSS_SELECTOR, "#runs tr.run input[type=checkbox]"):
            box.click()
        d.find_element(By.ID, "compare").click()
        wait_until("the comparison", lambda: "#/compare/" in d.current_url)
        c = drawn(d, "loss", rows=200)
        assert c["sources"] == 2, c
        assert "baseline" in c["toggles"] and "challenger" in c["toggles"], c
        assert "baseline" in c["legend"] and "challenger" in c["legend"], c
        # Two curves: at step 0 the two runs' values, 2 and 1.
        first = d.execute_script("const g = window.chorus.charts.find((c) => c.title === 'loss').g;"
                                 "return [g.getValue(0, 1), g.getValue(0, 2)];")
        assert sorted(first) == [1.0, 2.0], first
        x = x_of(d, "loss")
        assert x["label"] == "step" and "different step metrics" in x["status"], x
        d.save_screenshot("compare.png")
        # A group's page puts its members side by side.
        make_run(root, "mnist", "job-1", "ccc333", name="second")
        d.get(s.url + "#/group/mnist/job-1")
        wait_until("the members", lambda: len(d.find_elements(By.CSS_SELECTOR, "#members tr")) == 3)
        c = drawn(d, "loss", rows=200)
        assert c["sources"] == 2, c
        d.save_screenshot("group.png")
        errors = js_errors(d)
        assert not errors, errors
    finally:
        s.stop()


def case_token(chorus, root, d):
    """The token is asked on loopback as off it: every user of the machine reaches loopback."""
    make_run(root, "mnist", "job-1", "aaa111", name="baseline")
    for where, extra in (("off loopback", ("--host", "0.0.0.0")), ("on loopback", ())):
        s = Serve(chorus, root, *extra)
        try:
            token = re.search(r"token=([0-9a-f]+)", s.url)
            assert token, f"{where}: {s.url}"
            plain = f"http://127.0.0.1:{s.port}/"
            d.get(plain)
            wait_until(f"the refusal {where}", lambda: "asks for its token" in d.page_source)
            assert "baseline" not in d.page_source, where
            d.save_screenshot("token_refused.png")
            d.get(plain + "api/runs")
            assert "baseline" not in d.page_source and "asks for its token" in d.page_source, where
            d.get(plain + "?token=" + token.group(1))
            wait_until(f"the runs with the token {where}", lambda: "baseline" in d.find_element(By.ID, "runs").text)
            # The token went into a cookie, and out of the address bar.
            assert "token=" not in d.current_url, d.current_url
            d.save_screenshot("token_accepted.png")
            # The refusals asked for above are the only errors.
            errors = [e for e in js_errors(d) if "status of 401" not in e]
            assert not errors, errors
        finally:
            d.get("about:blank")  # no stream of the page's is open when its server stops
            s.stop()


PANEL = PAINTED + """
const p = window.chorus.histograms.find((p) => p.key === arguments[0]);
if (!p || !p.g || !p.data) return null;
const svg = p.bars.querySelector('svg');
return {rows: p.g.numRows(), painted: painted(p.plot), column: p.data.column, steps: p.data.steps, at: p.data.at.step,
        finite: p.data.at.finite, binned: p.data.at.bins.reduce((a, b) => a + b[2], 0),
        bars: svg ? svg.querySelectorAll('rect.hist-bar').length : 0, svg_step: svg ? Number(svg.dataset.step) : null,
        options: [...p.select.options].map((o) => o.textContent), selected: p.select.value,
        slider: [Number(p.slider.min), Number(p.slider.max), Number(p.slider.value)], label: p.stepLabel.textContent,
        legend: p.legend.textContent, status: p.status.textContent};
"""


def panel(d, key, want=lambda p: True, what=None):
    """Waits for the histogram panel of `key` to be drawn (bands painted, bars there) and `want` of it."""
    d.execute_script("const p = window.chorus.histograms.find((p) => p.key === arguments[0]);"
                     "if (p) p.el.scrollIntoView({block: 'center'});", key)
    return wait_until(what or f"histogram panel {key!r} drawn", lambda: (
        lambda p: p if p and p["painted"] > 200 and p["bars"] > 0 and want(p) else None)(d.execute_script(PANEL, key)))


def case_histograms(chorus, root, d):
    run = make_run(root, "mnist", "job-1", "hist1", name="hist1", state="running", ended=False, rows=60)
    write(os.path.join(run, "histograms.jsonl"), histogram_lines(0, 60))
    s = Serve(chorus, root)
    try:
        d.get(s.url + "#/run/mnist/job-1/hist1")
        wait_until("the histograms' heading", lambda: d.find_element(By.ID, "histograms-head").is_displayed())
        wait_until("two panels", lambda: d.execute_script("return window.chorus.histograms.map((p) => p.key)") == ["act", "grad"])
        # grad: its merged column first, a rank's beside it; the last step's bins, every finite value in them.
        g = panel(d, "grad")
        assert g["rows"] == 60 and g["steps"] == 60 and g["at"] == 59, g
        assert g["options"] == ["merged", "rank 0", "rank 1"] and g["selected"] == "grad", g
        assert g["slider"] == [0, 59, 59] and "step 59" in g["label"], g
        assert g["binned"] == g["finite"] == 800 and 5 <= g["bars"] <= 60, g
        a = panel(d, "act")
        assert a["options"] == ["rank 0", "rank 1"] and a["selected"] == "act/rank-0", a
        # The slider picks a step: its bins are drawn.
        d.execute_script("const p = window.chorus.histograms.find((p) => p.key === 'grad');"
                         "p.slider.value = 10; p.slider.dispatchEvent(new Event('input'));")
        g = panel(d, "grad", lambda p: p["at"] == 10 and p["svg_step"] == 10, "grad's bins at step 10")
        assert "step 10" in g["label"] and g["binned"] == 800, g
        # The selector switches to rank 1's column, at the same step.
        d.execute_script("const p = window.chorus.histograms.find((p) => p.key === 'grad');"
                         "p.select.value = 'grad/rank-1'; p.select.dispatchEvent(new Event('change'));")
        g = panel(d, "grad", lambda p: p["column"] == "grad/rank-1" and p["at"] == 10, "grad's rank 1 at step 10")
        assert g["binned"] == g["finite"] == 400, g
        # Values of the step under the pointer.
        ActionChains(d).move_to_element(d.execute_script(
            "return window.chorus.histograms.find((p) => p.key === 'grad').plot")).perform()
        wait_until("the quantiles under the pointer", lambda: re.search(
            r"step \d+\s+p0 -?[0-9.]+.*p50 -?[0-9.]+.*count 400", d.execute_script(PANEL, "grad")["legend"]))
        d.execute_script("window.chorus.histograms.find((p) => p.key === 'grad').el.scrollIntoView({block: 'center'})")
        time.sleep(0.3)
        d.save_screenshot("histograms.png")
        # Live: ten more steps. act follows the last step; grad stays at the step picked.
        with open(os.path.join(run, "histograms.jsonl"), "a") as f:
            f.write(histogram_lines(60, 70))
        panel(d, "act", lambda p: p["at"] == 69 and p["steps"] == 70 and p["rows"] == 70 and p["slider"][1] == 69,
              "act at the new last step")
        g = panel(d, "grad", lambda p: p["steps"] == 70 and p["rows"] == 70, "grad's new steps")
        assert g["at"] == 10 and g["column"] == "grad/rank-1", g
        # The slider at its end follows the run again.
        d.execute_script("const p = window.chorus.histograms.find((p) => p.key === 'grad');"
                         "p.slider.value = p.slider.max; p.slider.dispatchEvent(new Event('input'));")
        panel(d, "grad", lambda p: p["at"] == 69 and "(the last)" in p["label"], "grad at the last step")
        # The x of the bar at the top: the bands against wall time.
        d.execute_script("const x = document.getElementById('xaxis'); x.value = 'wall'; x.dispatchEvent(new Event('change'));")
        wait_until("grad against wall time", lambda: d.execute_script(
            "const p = window.chorus.histograms.find((p) => p.key === 'grad');"
            "return p.gAxis === 'wall time' && p.g.numRows() === 70 && p.g.xAxisRange()[1] >= (START + 69) * 1000;"
            .replace("START", str(int(START)))))
        errors = js_errors(d)
        assert not errors, errors
    finally:
        s.stop()


def case_media(chorus, root, d):
    """A run's images, text and tables: tests/browser/media_case.py, with this file's helpers."""
    import media_case
    media_case.case_media(sys.modules[__name__], chorus, root, d)


def case_events(chorus, root, d):
    """A run's events, listed and marked on its charts: tests/browser/events_case.py, with this file's helpers."""
    import events_case
    events_case.case_events(sys.modules[__name__], chorus, root, d)


def case_runs_live(chorus, root, d):
    """The runs list told of changes by the server, and the page's files kept: tests/browser/runs_live_case.py."""
    import runs_live_case
    runs_live_case.case_runs_live(sys.modules[__name__], chorus, root, d)


def case_long_list(chorus, root, d):
    """A list of more runs than one part of rows: tests/browser/runs_live_case.py."""
    import runs_live_case
    runs_live_case.case_long_list(sys.modules[__name__], chorus, root, d)


def case_opening(chorus, root, d):
    """How a run's page opens: one read of the run, the charts in view first: tests/browser/opening_case.py."""
    import opening_case
    opening_case.case_opening(sys.modules[__name__], chorus, root, d)


CASES = {"runs_list": case_runs_list, "run_charts": case_run_charts, "live": case_live, "compare": case_compare,
         "token": case_token, "histograms": case_histograms, "media": case_media, "events": case_events,
         "runs_live": case_runs_live, "long_list": case_long_list, "opening": case_opening}
# What the page says is true of the run: tests/browser/truth_case.py, with this file's helpers and the
# project's programs that make real runs.
TRUTH = ["laggards", "contributions", "nonfinite", "ticks", "smooth", "summary", "log_zeros", "last_point"]
BINS = {}


def truth(name):
    def case(chorus, root, d):
        import truth_case
        truth_case.CASES[name](sys.modules[__name__], chorus, root, d, BINS)
    return case


CASES.update({name: truth(name) for name in TRUTH})


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("case", choices=sorted(CASES))
    ap.add_argument("--chorus", required=True)
    ap.add_argument("--worker", help="chorus_e2e_worker")
    ap.add_argument("--barrier-worker", help="chorus_e2e_barrier_worker")
    ap.add_argument("--ddp-train", help="ddp_train (where it was built)")
    a = ap.parse_args()
    BINS.update({"worker": a.worker, "barrier_worker": a.barrier_worker, "ddp_train": a.ddp_train})
    if a.case == "laggards" and not (a.worker and a.barrier_worker):
        ap.error("laggards needs --worker and --barrier-worker")
    root = tempfile.mkdtemp(prefix="chorus-browser-")
    d = browser()
    try:
        CASES[a.case](a.chorus, root, d)
    except Exception:
        try:
            d.save_screenshot(f"{a.case}_failed.png")
            print("page text at the failure:\n" + d.find_element(By.TAG_NAME, "body").text[:3000])
            print("console:", js_errors(d))
        except WebDriverException:
            pass
        raise
    finally:
        d.quit()
        if not os.environ.get("CHORUS_KEEP_TEST_DIRS"):
            shutil.rmtree(root, ignore_errors=True)
    print(f"{a.case}: passed; screenshots in {os.getcwd()}")


if __name__ == "__main__":
    main()

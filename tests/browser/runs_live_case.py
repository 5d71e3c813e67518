"""The `runs_live` case of dashboard_test.py: the runs list follows the server.

The list is read once and then only when the server's stream of the runs
(`/api/runs/stream`) says it changed: while nothing changes, the page asks
nothing (no request for the list in 7 s, where the page used to read it every
5 s); a run made while the page is open is listed (the page reads the list
once more, told by the stream); a run's new state shows. The page's own files
come by their content's names and are kept by the browser: opening the page
again fetches none of them. The charts' library is fetched only once a page
with charts opens (a run's, from the list), and its charts draw. `t` is dashboard_test.py itself: its run files,
server and browser helpers.
"""
import json
import os
import time

# The requests the page made for the runs list, and for its files, so far.
REQUESTS = """
const all = performance.getEntriesByType('resource').map((e) => ({name: e.name, size: e.transferSize}));
return {runs: all.filter((e) => /\\/api\\/runs(\\?|$)/.test(e.name)).length,
        stream: all.filter((e) => e.name.includes('/api/runs/stream')).length,
        files: all.filter((e) => /\\.[0-9a-f]{12}\\.(js|css)$/.test(e.name))};
"""


# Types 'r1x04' into the runs list's filter as soon as its first row is in the
# page (a MutationObserver's callback runs before the page's next task).
FILTER_AT_FIRST_ROWS = """
new MutationObserver((_, seen) => {
  if (!document.querySelector('#runs tr.run')) return;
  seen.disconnect();
  const f = document.getElementById('filter');
  f.value = 'r1x04';
  f.dispatchEvent(new Event('input'));
  window.__typed = true;
}).observe(document, {subtree: true, childList: true});
"""


def listed(d, t):
    return [r.get_attribute("data-path") for r in d.find_elements(t.By.CSS_SELECTOR, "#runs tr.run")]


def case_runs_live(t, chorus, root, d):
    t.make_run(root, "mnist", "job-1", "aaa111", name="baseline", start=t.START)
    s = t.Serve(chorus, root)
    try:
        d.get(s.url)
        t.wait_until("one run listed", lambda: listed(d, t) == ["mnist/job-1/aaa111"])
        t.wait_until("the list's stream open", lambda: d.execute_script(REQUESTS)["stream"] >= 1
                     or "live" in d.find_element(t.By.ID, "live").get_attribute("title") + d.find_element(t.By.ID, "live").text)
        first = d.execute_script(REQUESTS)
        # The page's scripts and styles came by their content's names; the
        # charts' library is not fetched for the list, which draws none.
        names = [f["name"] for f in first["files"]]
        assert any("/app." in n for n in names) and any("/style." in n for n in names), names
        assert not any("/dygraph" in n for n in names), f"the runs list fetched the charts' library: {names}"
        # Nothing changes for 7 s: the list is not asked for again.
        time.sleep(7)
        quiet = d.execute_script(REQUESTS)
        assert quiet["runs"] == first["runs"], f"the list was read {quiet['runs'] - first['runs']} more time(s) while nothing changed"
        # A new run, running: listed, told by the stream.
        t.make_run(root, "mnist", "job-2", "bbb222", name="live-one", start=t.START + 100, state="running", ended=False)
        t.wait_until("the new run listed", lambda: "mnist/job-2/bbb222" in listed(d, t), timeout=20)
        d.save_screenshot("runs_live_new.png")
        # Its end: the state shown changes.
        run = os.path.join(root, "mnist", "job-2", "bbb222")
        t.write(os.path.join(run, "run.json"), t.run_json("bbb222", "live-one", "mnist", "job-2", state="failed",
                                                          start=t.START + 100))
        t.wait_until("the run's new state shown", lambda: "failed" in d.find_element(
            t.By.CSS_SELECTOR, '#runs tr.run[data-path="mnist/job-2/bbb222"]').text, timeout=20)
        d.save_screenshot("runs_live_state.png")
        # Opened again: the page's files come from the browser's cache (nothing sent for them).
        d.get(s.url)
        t.wait_until("two runs listed again", lambda: len(listed(d, t)) == 2)
        again = d.execute_script(REQUESTS)
        sent = [f for f in again["files"] if f["size"] > 0]
        assert not sent, f"the page's files were fetched again: {sent}"
        # A run's page, from the list: the charts' library comes then, by its content's name, and its chart draws.
        d.execute_script("location.hash = '#/run/mnist/job-1/aaa111';")
        t.wait_until("the charts' library fetched for a run's page", lambda: any(
            "/dygraph.min." in f["name"] for f in d.execute_script(REQUESTS)["files"]))
        t.wait_until("a chart drawn", lambda: d.execute_script(
            "return !!document.querySelector('.dygraph-axis-label-y, .chart .empty')"))
        errors = t.js_errors(d)
        assert not errors, errors
    finally:
        s.stop()


def case_long_list(t, chorus, root, d):
    """A list of 300 runs, more than one part of rows (app.js lays out its
    parts of 40 rows near the screen only): every run is listed once, the
    newest group first, and a filter typed the moment the first rows are in
    the page leaves only its runs."""
    paths = []
    for g in range(3):
        for i in range(100):
            run_id = f"r{g}x{i:03d}"
            t.make_run(root, "big", f"job-{g}", run_id, name=f"run-{g}-{i}", rows=5, start=t.START + 1000 * g + i)
            paths.append(f"big/job-{g}/{run_id}")
    s = t.Serve(chorus, root)
    # The filter is typed the moment the first rows are in the page, before
    # the page's next task.
    typed = d.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument", {"source": FILTER_AT_FIRST_ROWS})
    try:
        d.get(s.url)
        want = sorted(f"big/job-1/r1x{i:03d}" for i in range(40, 50))
        t.wait_until("the filter's ten runs", lambda: sorted(listed(d, t)) == want)
        time.sleep(1)  # and nothing of the list before the filter comes after it
        assert sorted(listed(d, t)) == want, listed(d, t)
        assert d.execute_script("return window.__typed === true"), "the filter was not typed at the first rows"
        d.execute_script("const f = document.getElementById('filter'); f.value = '';"
                         "f.dispatchEvent(new Event('input'));")
        t.wait_until("all 300 runs", lambda: len(listed(d, t)) == 300, timeout=30)
        got = listed(d, t)
        assert sorted(got) == sorted(paths), "runs missing or listed twice"
        # The newest group first.
        assert got[0].startswith("big/job-2/") and got[-1].startswith("big/job-0/"), (got[0], got[-1])
        # Read again while scrolled far down (a run changed), the list keeps its place:
        # the row at the window's top stays there.
        at = d.execute_script(
            "const tr = document.querySelectorAll('#runs tr.run')[250]; tr.scrollIntoView();"
            "return [tr.dataset.path, tr.getBoundingClientRect().top];")
        d.execute_async_script("window.chorus.page.reload().then(arguments[0]);")
        time.sleep(0.5)
        again = d.execute_script(
            "const tr = document.querySelector(`#runs tr.run[data-path=\"${arguments[0]}\"]`);"
            "return tr && tr.getBoundingClientRect().top;", at[0])
        assert again is not None and abs(again - at[1]) < 2, (at, again)
        assert len(listed(d, t)) == 300, "the list read again lost rows"
        d.save_screenshot("runs_long_list.png")
        errors = t.js_errors(d)
        assert not errors, errors
    finally:
        d.execute_cdp_cmd("Page.removeScriptToEvaluateOnNewDocument", {"identifier": typed["identifier"]})
        s.stop()

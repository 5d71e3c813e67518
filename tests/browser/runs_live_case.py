"""The `runs_live` case of dashboard_test.py: the runs list follows the server.

The list is read once and then only when the server's stream of the runs
(`/api/runs/stream`) says it changed: while nothing changes, the page asks
nothing (no request for the list in 7 s, where the page used to read it every
5 s); a run made while the page is open is listed (the page reads the list
once more, told by the stream); a run's new state shows. The page's own files
come by their content's names and are kept by the browser: opening the page
again fetches none of them. `t` is dashboard_test.py itself: its run files,
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
        # The page's scripts and styles came by their content's names.
        names = [f["name"] for f in first["files"]]
        assert any("/app." in n for n in names) and any("/dygraph.min." in n for n in names), names
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
        errors = t.js_errors(d)
        assert not errors, errors
    finally:
        s.stop()

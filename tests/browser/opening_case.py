"""The `opening` case of dashboard_test.py: how a run's page opens.

The run is read once (`/api/run`: the event stream's first look at it says
nothing new, by its `stamp`); its data is asked for by the page's first
script, from its head; the charts in view ask for their series before any
chart that is only near the screen, and those near it are loaded after. A
run's first paint waits for what it shows only. `t` is dashboard_test.py
itself: its run files, server and browser helpers.
"""
import json
import math
import os
import time

import truth_case

REQUESTS = """
return performance.getEntriesByType('resource').map((e) => ({name: decodeURIComponent(e.name), start: e.startTime,
  end: e.responseEnd, by: e.initiatorType}));
"""

# Which charts are in view, and which only near it (within 600 px below), by their titles.
VIEW = """
const seen = [], near = [];
for (const c of chorus.charts) {
  const r = c.el.getBoundingClientRect();
  if (r.bottom > 0 && r.top < innerHeight) seen.push(c.title);
  else if (r.top < innerHeight + 600) near.push(c.title);
}
return {seen, near};
"""


def case_opening(t, chorus, root, d):
    # 16 metrics, each a chart of its own: a few in view, more near the screen, the rest below.
    keys = [f"train/m{i:02d}" for i in range(16)]
    rows = [truth_case.row_line(t, s, {k: math.sin(s * 0.01 + i) for i, k in enumerate(keys)}) for s in range(400)]
    truth_case.written_run(t, root, "proj", "grp", "open1", rows)
    s = t.Serve(chorus, root)
    try:
        d.get(s.url + "#/run/proj/grp/open1")
        t.wait_until("the charts in view drawn", lambda: d.execute_script(
            "const c = (window.chorus || {}).charts || []; return c.length >= 16 && c.filter((x) => x.g).length >= 2"))
        view = d.execute_script(VIEW)
        assert len(view["seen"]) >= 1 and len(view["near"]) >= 1, view
        # The ones near the screen are loaded too, after those in view.
        t.wait_until("the charts near the screen drawn", lambda: d.execute_script(
            "return chorus.charts.filter((x) => x.g).length") >= len(view["seen"]) + len(view["near"]))
        time.sleep(3)  # the event stream's first look at the run, and anything it would ask again
        reqs = d.execute_script(REQUESTS)
        runs = [r for r in reqs if "/api/run?" in r["name"]]
        assert len(runs) == 1, f"the run was read {len(runs)} times on opening: {[r['name'] for r in runs]}"
        # Asked by the page's first script (a fetch), before the page's own scripts were all in.
        app = [r for r in reqs if "/app." in r["name"]]
        assert runs[0]["by"] == "fetch", runs[0]

        def asked(title):
            return min(r["start"] for r in reqs if "/api/series?" in r["name"] and f"key={title}" in r["name"])

        first_near = min(asked(x) for x in view["near"])
        last_seen = max(asked(x) for x in view["seen"])
        assert last_seen < first_near, f"a chart near the screen asked at {first_near:.0f} ms, before one in view at {last_seen:.0f} ms"
        # Those in view were answered before any near one was asked: the first paint waits for them only.
        answered = max(r["end"] for r in reqs if "/api/series?" in r["name"] and any(f"key={x}" in r["name"] for x in view["seen"]))
        assert answered <= first_near, f"near charts asked at {first_near:.0f} ms, before those in view were answered ({answered:.0f} ms)"
        # Charts far below are not loaded until scrolled to.
        far = [c for c in keys if c not in view["seen"] and c not in view["near"]]
        loaded = d.execute_script("return chorus.charts.filter((x) => x.wanted).map((x) => x.title)")
        assert far and not any(c in loaded for c in far[-2:]), (far, loaded)
        d.save_screenshot("opening.png")
        assert app, "the page's script was not fetched"
        errors = t.js_errors(d)
        assert not errors, errors
    finally:
        s.stop()

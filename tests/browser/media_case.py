"""The `media` case of dashboard_test.py: a run's images, text and tables on its page.

Images of two ranks at several steps (real PNG files, a width per rank), a key of
one rank, a markdown text and a table, as the RunWriter leaves them (media/ and
media.jsonl, README "Images, text and tables"); lines appended while the page is
open. `t` is dashboard_test.py itself: its run files, server and browser helpers.
"""
import json
import os
import struct
import time
import zlib


def png(width, height, rgb):
    """A valid PNG of `width` x `height` pixels of one colour (8-bit RGB)."""
    def chunk(tag, data):
        return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data) & 0xFFFFFFFF)
    rows = b"".join(b"\x00" + bytes(rgb) * width for _ in range(height))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)) +
            chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b""))


def media_path(key, rank, step, ext):
    """io::media_path: media/<the key, made safe>-<its FNV-1a 64, low 32 bits>/<step>-rank<rank>.<ext>."""
    h = 0xCBF29CE484222325
    for b in key.encode():
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    safe = "".join(c if c.isascii() and (c.isalnum() or c in ".-_") else "_" for c in key[:64])
    return f"media/{safe}-{h & 0xFFFFFFFF:08x}/{step}-rank{rank}.{ext}"


def media(t, run, key, rank, step, kind, data, caption="", size=None):
    """Writes the file of one image (`size` its width and height), text or table; returns its media.jsonl line."""
    fmt, ext = {"image": ("png", "png"), "text": ("md", "md"), "table": ("json", "json")}[kind]
    path = media_path(key, rank, step, ext)
    os.makedirs(os.path.dirname(os.path.join(run, path)), exist_ok=True)
    with open(os.path.join(run, path), "wb") as f:
        f.write(data)
    line = {"_step": step, "_timestamp": t.START + step, "_runtime": float(step), "key": key, "rank": rank,
            "kind": kind, "format": fmt, "path": path, "size": len(data)}
    if caption:
        line["caption"] = caption
    if size:
        line["width"], line["height"] = size
    return json.dumps(line) + "\n"


def sample(t, run, rank, step):
    """The image of `samples` of `rank` at `step`: rank 0's 8 pixels wide, rank 1's 12, its colour by the step."""
    w = 8 + 4 * rank
    return media(t, run, "samples", rank, step, "image", png(w, 6, (step * 5 % 256, 90 + 60 * rank, 200)),
                 caption=f"rank {rank} at step {step}", size=(w, 6))


# A media panel as the test reads it: its step, slider and a row per rank.
PANEL = """
const p = window.chorus.media.find((p) => p.key === arguments[0]);
if (!p || !p.data) return null;
return {kind: p.kind, at: p.data.at, steps: p.data.steps, label: p.stepLabel.textContent,
        slider: [Number(p.slider.min), Number(p.slider.max), Number(p.slider.value)],
        rows: [...p.rows.querySelectorAll('.media-row')].map((r) => {
          const img = r.querySelector('img'), rank = r.querySelector('.media-rank'), cap = r.querySelector('.media-caption');
          return {rank: Number(r.dataset.rank), label: rank ? rank.textContent : null, caption: cap ? cap.textContent : null,
                  src: img ? img.src : null, natural: img && img.complete ? img.naturalWidth : 0};
        }),
        text: p.rows.textContent, heads: [...p.rows.querySelectorAll('h4')].map((e) => e.textContent),
        strong: [...p.rows.querySelectorAll('strong')].map((e) => e.textContent), items: p.rows.querySelectorAll('li').length,
        th: [...p.rows.querySelectorAll('th')].map((e) => e.textContent), td: [...p.rows.querySelectorAll('td')].map((e) => e.textContent),
        injected: p.rows.querySelectorAll('script, b, img[onerror], [onerror]').length,
        status: p.status.textContent};
"""


def panel(t, d, key, want, what):
    """Waits for the panel of `key` to show what `want` asks of it."""
    d.execute_script("const p = window.chorus.media.find((p) => p.key === arguments[0]);"
                     "if (p) p.el.scrollIntoView({block: 'center'});", key)
    return t.wait_until(what, lambda: (lambda p: p if p and want(p) else None)(d.execute_script(PANEL, key)))


def shown(p, step):
    """Both ranks' images of `samples` at `step`, loaded, each its rank's width, under its rank's name and caption."""
    return (p["at"] == step and [r["rank"] for r in p["rows"]] == [0, 1] and
            [r["natural"] for r in p["rows"]] == [8, 12] and
            [r["label"] for r in p["rows"]] == ["rank 0", "rank 1"] and
            [r["caption"] for r in p["rows"]] == [f"rank 0 at step {step}", f"rank 1 at step {step}"] and
            all(f"step={step}&" in r["src"] for r in p["rows"]))


def move(d, key, index):
    d.execute_script("const p = window.chorus.media.find((p) => p.key === arguments[0]);"
                     "p.slider.value = arguments[1]; p.slider.dispatchEvent(new Event('input'));", key, index)


def case_media(t, chorus, root, d):
    run = t.make_run(root, "mnist", "job-1", "media1", name="media1", state="running", ended=False, rows=60)
    lines = [sample(t, run, rank, step) for step in (0, 10, 20, 30) for rank in (0, 1)]
    lines.append(media(t, run, "solo", 1, 5, "image", png(8, 8, (20, 160, 60)), caption="one rank's", size=(8, 8)))
    lines.append(media(t, run, "notes", 0, 20, "text",
                       b"# Notes\n\nloss **down** <img src=x onerror=alert(1)> stays text\n\n- first\n- second\n"))
    lines.append(media(t, run, "preds", 0, 30, "table", json.dumps(
        {"columns": ["id", "label", "ok"], "data": [[1, "cat", True], [2, "<b>dog</b>", False]]}).encode()))
    t.write(os.path.join(run, "media.jsonl"), "".join(lines))
    s = t.Serve(chorus, root)
    try:
        d.get(s.url + "#/run/mnist/job-1/media1")
        t.wait_until("the media heading", lambda: d.find_element(t.By.ID, "media-head").is_displayed())
        t.wait_until("four panels", lambda: sorted(d.execute_script("return window.chorus.media.map((p) => p.key)")) ==
                     ["notes", "preds", "samples", "solo"])
        # Images: each rank's at the last step, the slider at its end.
        p = panel(t, d, "samples", lambda p: shown(p, 30), "both ranks' images at step 30")
        assert p["slider"] == [0, 3, 3] and "step 30 (the last)" in p["label"], p
        # A key of one rank: once, under its plain name.
        p = panel(t, d, "solo", lambda p: len(p["rows"]) == 1 and p["rows"][0]["natural"] == 8, "solo's image")
        assert p["rows"][0]["label"] is None and p["rows"][0]["caption"] == "one rank's", p
        # Text: markdown built as nodes, the HTML in it left as text.
        p = panel(t, d, "notes", lambda p: p["items"] == 2, "the notes")
        assert p["heads"] == ["Notes"] and p["strong"] == ["down"], p
        assert "<img src=x onerror=alert(1)> stays text" in p["text"] and p["injected"] == 0, p
        # A table: its columns and cells, as text.
        p = panel(t, d, "preds", lambda p: p["td"], "the table")
        assert p["th"] == ["id", "label", "ok"], p
        assert p["td"] == ["1", "cat", "true", "2", "<b>dog</b>", "false"] and p["injected"] == 0, p
        d.execute_script("document.getElementById('media-head').scrollIntoView(); window.scrollBy(0, -60);")
        time.sleep(0.3)
        d.save_screenshot("media.png")

        # Live: step 40 of both ranks, and a new key; the panel follows the last step.
        more = "".join(sample(t, run, rank, 40) for rank in (0, 1))
        more += media(t, run, "later", 0, 40, "text", b"written *while* the page was open\n")
        with open(os.path.join(run, "media.jsonl"), "a") as f:
            f.write(more)
        p = panel(t, d, "samples", lambda p: shown(p, 40), "both ranks' images at the new step 40")
        assert p["slider"] == [0, 4, 4] and p["steps"] == [0, 10, 20, 30, 40], p
        panel(t, d, "later", lambda p: "written while the page was open" in p["text"], "the key appended live")

        # The slider picks a step: each rank's image of that step, the addresses changed.
        before = [r["src"] for r in p["rows"]]
        move(d, "samples", 1)
        p = panel(t, d, "samples", lambda p: shown(p, 10), "both ranks' images at step 10")
        assert [r["src"] for r in p["rows"]] != before and p["slider"][2] == 1 and "(the last)" not in p["label"], p
        # A step appended now leaves the step picked in place; the slider at its end follows the run again.
        with open(os.path.join(run, "media.jsonl"), "a") as f:
            f.write("".join(sample(t, run, rank, 50) for rank in (0, 1)))
        p = panel(t, d, "samples", lambda p: p["slider"][1] == 5, "step 50 on the slider")
        assert shown(p, 10), p
        move(d, "samples", 5)
        panel(t, d, "samples", lambda p: shown(p, 50) and "(the last)" in p["label"], "samples at the last step again")
        d.execute_script("window.chorus.media.find((p) => p.key === 'samples').el.scrollIntoView({block: 'center'})")
        time.sleep(0.3)
        d.save_screenshot("media_live.png")
        errors = t.js_errors(d)
        assert not errors, errors
    finally:
        s.stop()

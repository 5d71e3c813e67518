"""chorus.Histogram: built from Python's containers, NumPy and CPU tensors,
logged in run.log's dict beside numbers, and read back from
histograms.jsonl (parsed here with json, independently of chorus)."""

import json
import math
import os

import pytest

import chorus
from conftest import rows, run_dirs

np = pytest.importorskip("numpy")


def lines(run_dir):
    with open(os.path.join(run_dir, "histograms.jsonl")) as f:
        return [json.loads(line) for line in f if line.endswith("\n")]


def bucket_counts(h):
    return [(lo, hi, n) for lo, hi, n in h.buckets()]


def test_built_from_lists_arrays_and_tensors_alike():
    values = [0.5, -1.25, 3.0, 0.0, 1e-3, 250.0]
    from_list = chorus.Histogram(values)
    assert from_list == chorus.Histogram(tuple(values))
    assert from_list == chorus.Histogram(np.array(values, dtype=np.float64))
    # float32 rounds some of the values: compare with the float32 values themselves
    f32 = np.array(values, dtype=np.float32)
    assert chorus.Histogram(f32).count == 6 and chorus.Histogram(f32).max == 250.0
    assert chorus.Histogram(np.arange(10)).max == 9.0  # ints, through float64
    assert chorus.Histogram(np.array(values)[::2]).count == 3  # a strided view
    assert from_list.count == 6 and from_list.min == -1.25 and from_list.max == 250.0
    assert from_list.sum == pytest.approx(sum(values))
    h = chorus.Histogram()
    h.add(values[:3])
    h.add(values[3])  # one number
    other = chorus.Histogram(values[4:])
    h.merge(other)
    assert h == from_list  # adds and merges give the histogram of all the values


def test_tensors_of_every_cpu_dtype():
    torch = pytest.importorskip("torch")
    for dtype in (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int32):
        t = (torch.arange(100) - 50).to(dtype)
        h = chorus.Histogram(t)
        assert h.count == 100 and h.min == -50.0 and h.max == 49.0, dtype


def test_nan_and_infinities_are_counted_apart():
    h = chorus.Histogram([1.0, float("nan"), float("inf"), -float("inf"), -2.0])
    assert (h.count, h.nan_count, h.pos_inf_count, h.neg_inf_count) == (5, 1, 1, 1)
    assert (h.sum, h.min, h.max) == (-1.0, -2.0, 1.0)
    assert h.quantile(0.0) == -math.inf and h.quantile(1.0) == math.inf
    assert math.isnan(chorus.Histogram([float("nan")]).min)


def test_quantiles_within_the_stated_error():
    rng = np.random.default_rng(7)
    v = rng.lognormal(0.0, 2.0, 20000) * rng.choice([-1, 1], 20000)
    h = chorus.Histogram(v)
    s = np.sort(v)
    for q in (0.01, 0.1, 0.5, 0.9, 0.99):
        exact = s[int(round(q * (len(s) - 1)))]
        assert abs(h.quantile(q) - exact) <= abs(exact) * chorus.Histogram.relative_error * (1 + 1e-12)
    for lo, hi, n in h.buckets():
        assert lo < hi and n > 0


def test_bad_values_are_refused_with_the_cause():
    with pytest.raises(chorus.InvalidArgument, match="takes numbers.*str"):
        chorus.Histogram([1.0, "a"])
    with pytest.raises(chorus.InvalidArgument, match="could not be read as an array of numbers"):
        chorus.Histogram(np.array(["x", "y"]))


def test_logged_beside_numbers_at_their_step(runs_dir):
    rng = np.random.default_rng(1)
    grads = [rng.standard_normal(1000).astype(np.float32) for _ in range(3)]
    with chorus.init(project="hist") as run:
        run.define_metric("grad", reduce="merge")
        for g in grads:
            run.log({"loss": 0.5, "grad": chorus.Histogram(g), "layers": {"w": chorus.Histogram(g * 2)}})
        run.log({"alone": chorus.Histogram([1.0, 2.0])}, step=10)
        w = run.writer()
        w.log({"wloss": 1.0, "wh": chorus.Histogram([3.0])}, step=11).wait()
        w.close()
        d = run.dir
    (rd,) = run_dirs(runs_dir)
    assert rd == d
    got = lines(rd)
    assert [(l["_step"], l["key"]) for l in got] == [
        (0, "grad"), (0, "layers/w"), (1, "grad"), (1, "layers/w"), (2, "grad"), (2, "layers/w"), (10, "alone"),
        (11, "wh")]
    for step, g in enumerate(grads):
        (line,) = [l for l in got if l["_step"] == step and l["key"] == "grad"]
        h = chorus.Histogram(g)
        assert line["count"] == h.count and line["min"] == h.min and line["max"] == h.max
        assert line["rank"] is None and line["_count"] == 1
        assert sum(n for _, n in line["buckets"]) == h.count
    # the numbers of the same calls are at the same steps
    assert [r["_step"] for r in rows(rd)] == [0, 1, 2, 11]


def test_a_key_holds_one_kind(runs_dir):
    with chorus.init(project="hist") as run:
        run.log({"loss": 1.0}).wait()
        with pytest.raises(chorus.InvalidArgument, match="'loss', which holds scalars"):
            run.log({"loss": chorus.Histogram([1.0])}).wait()
        run.log({"h": chorus.Histogram([1.0])}).wait()
        with pytest.raises(chorus.InvalidArgument, match="'h', which holds histograms"):
            run.log({"h": 2.0}).wait()
        with pytest.raises(chorus.InvalidArgument, match="merge is for histograms"):
            run.define_metric("loss", reduce="merge").wait()
    (rd,) = run_dirs(runs_dir)
    with open(os.path.join(rd, "rejected.jsonl")) as f:
        rejected = [json.loads(line) for line in f]
    assert any(r["values"] == {"loss": {"histogram": {"count": 1, "min": 1.0, "max": 1.0}}} for r in rejected)


def test_images_from_arrays_tensors_and_bytes(runs_dir):
    """chorus.Image in run.log's dict: a PNG of the pixels, or the bytes given, under media/."""
    rgb = (np.arange(4 * 5 * 3) % 256).astype(np.uint8).reshape(4, 5, 3)
    grey = np.linspace(0.0, 1.0, 6, dtype=np.float32).reshape(2, 3)
    png = bytes([0x89, 0x50, 0x4E, 0x47, 0x0D, 0x0A, 0x1A, 0x0A, 0, 0, 0, 13, 0x49, 0x48, 0x44, 0x52,
                 0, 0, 0, 7, 0, 0, 0, 9, 8, 2, 0, 0, 0])
    with chorus.init(project="media") as run:
        run.log({"loss": 1.0, "rgb": chorus.Image(rgb, caption="first"), "grey": chorus.Image(grey)}).wait()
        run.log({"file": chorus.Image(png)}).wait()
        torch = None
        try:
            import torch
        except ImportError:
            pass
        if torch is not None:
            run.log({"chw": chorus.Image(torch.rand(3, 8, 6))}).wait()  # CHW, as torchvision's
        with pytest.raises(chorus.InvalidArgument, match="1 \\(grey\\), 3 \\(RGB\\) or 4 \\(RGBA\\)"):
            run.log({"bad": chorus.Image(np.zeros((2, 2, 2), np.uint8))}).wait()
        with pytest.raises(chorus.InvalidArgument, match="neither PNG nor JPEG"):
            run.log({"bad2": chorus.Image(b"GIF89a")}).wait()
        d = run.dir
    with open(os.path.join(d, "media.jsonl")) as f:
        media = {(m["key"], m["_step"]): m for m in map(json.loads, f)}
    assert media[("rgb", 0)]["caption"] == "first"
    assert (media[("rgb", 0)]["width"], media[("rgb", 0)]["height"]) == (5, 4)
    assert (media[("grey", 0)]["width"], media[("grey", 0)]["height"]) == (3, 2)
    with open(os.path.join(d, media[("file", 1)]["path"]), "rb") as f:
        assert f.read() == png  # bytes given are kept as they are
    if ("chw", 2) in media:
        assert (media[("chw", 2)]["width"], media[("chw", 2)]["height"]) == (6, 8)
    for m in media.values():
        with open(os.path.join(d, m["path"]), "rb") as f:
            assert f.read(8) == png[:8]  # every one a PNG
    assert [r["_step"] for r in rows(d)] == [0]


def test_text_and_tables_and_the_reader_of_media(runs_dir):
    """chorus.Text and chorus.Table in run.log's dict, and chorus.open(run).images/texts/tables
    reading media.jsonl back (checked against the file, parsed here with json)."""
    rgb = (np.arange(2 * 3 * 3) % 256).astype(np.uint8).reshape(2, 3, 3)
    with chorus.init(project="media") as run:
        for step in range(3):
            run.log({"img": chorus.Image(rgb, caption=f"at {step}"), "note": chorus.Text(f"**step** {step}"),
                     "preds": chorus.Table(columns=["id", "label", "ok", "p"],
                                           data=[[step, "cat", True, 0.5], [step + 1, None, False, np.float32(0.25)]])})
        with pytest.raises(chorus.InvalidArgument, match="row 1 of the table has 1 cells, but the table has 2"):
            run.log({"ragged": chorus.Table(columns=["a", "b"], data=[[1, 2], [3]])}).wait()
        with pytest.raises(chorus.InvalidArgument, match="a table holds None, bools, numbers and strings"):
            chorus.Table(columns=["a"], data=[[object()]])
        with pytest.raises(chorus.InvalidArgument, match="'note', which holds text"):
            run.log({"note": 1.0}).wait()
        d = run.dir
    view = chorus.open(d)
    assert view.media_keys() == [("img", "image"), ("note", "text"), ("preds", "table")]
    with open(os.path.join(d, "media.jsonl")) as f:
        lines = [json.loads(line) for line in f]
    images = view.images("img", pandas=False)
    assert [(i["_step"], i["rank"], i["caption"], i["width"], i["height"], i["format"]) for i in images] == [
        (s, 0, f"at {s}", 3, 2, "png") for s in range(3)]
    by_path = {os.path.join(d, m["path"]): m for m in lines}
    for i in images:
        assert by_path[i["path"]]["size"] == i["size"] == os.path.getsize(i["path"])
    assert [t["text"] for t in view.texts("note", pandas=False)] == [f"**step** {s}" for s in range(3)]
    tables = view.tables("preds", pandas=False)
    assert tables[2]["table"] == {"columns": ["id", "label", "ok", "p"],
                                  "data": [[2, "cat", True, 0.5], [3, None, False, 0.25]]}
    assert view.images("note", pandas=False) == []  # text is not an image
    assert view.images("nothing", pandas=False) == []
    pd = pytest.importorskip("pandas")
    frame = view.images("img")
    assert isinstance(frame, pd.DataFrame) and list(frame["_step"]) == [0, 1, 2]

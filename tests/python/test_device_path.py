"""The Python package's device path on a machine without a GPU: run under a
CUDA runtime over host memory (fake_cudart.cpp, preloaded by ctest), whose
copies land only once their event is polled complete. What runs is chorus's
own: the CUDA-array reading in python/convert.cpp, log_device's capture,
and the RankProxy that polls it. test_gpu.py runs the same on a GPU."""

import ctypes
import os

import pytest

import chorus
from conftest import rows, run_dirs

try:
    runtime = ctypes.CDLL("libcudart.so.13", mode=os.RTLD_NOLOAD)
    fake = ctypes.c_int.in_dll(runtime, "chorus_fake_cudart").value == 1
except (OSError, ValueError):
    fake = False
if not fake:
    pytest.skip("the stand-in CUDA runtime is not preloaded (ctest runs this file with it)", allow_module_level=True)


class DeviceArray:
    """Memory the stand-in runtime treats as a device's, described as CuPy
    describes a CUDA array."""

    def __init__(self, values, typestr="<f4", stream=1):
        ctype = {"<f4": ctypes.c_float, "<f8": ctypes.c_double, "<f2": ctypes.c_uint16}[typestr]  # <f2: the bits
        self.buf = (ctype * len(values))(*values)
        shape = () if len(values) == 1 else (len(values),)
        self.__cuda_array_interface__ = {"data": (ctypes.addressof(self.buf), False), "shape": shape,
                                         "typestr": typestr, "version": 3, "stream": stream}


def test_device_and_host_values_of_one_call_land_at_one_step(runs_dir):
    held = []
    with chorus.init(project="device") as run:
        for s in range(300):
            d, e = DeviceArray([s * 0.25]), DeviceArray([-s])
            held += [d, e]  # the copy lands later: the memory stays until then (a GPU's stream order keeps it)
            run.log({"dev": d, "host": float(s), "other_dev": e})
        last = DeviceArray([1.5])
        run.log({"dev": last}, step=400).wait()
    (d,) = run_dirs(runs_dir)
    h = rows(d)
    assert [r["_step"] for r in h] == list(range(300)) + [400]
    for r in h[:300]:
        s = r["_step"]
        assert (r["dev"], r["host"], r["other_dev"]) == (s * 0.25, float(s), -float(s))
    assert h[300]["dev"] == 1.5 and "host" not in h[300]


def test_a_stream_named_by_the_array(runs_dir):
    with chorus.init(project="device") as run:
        a, b = DeviceArray([2.5], stream=12345), DeviceArray([3.5], stream=None)
        run.log({"v": a}).wait()
        run.log({"v": b}).wait()
    (d,) = run_dirs(runs_dir)
    assert [r["v"] for r in rows(d)] == [2.5, 3.5]


def test_arrays_the_device_path_refuses(runs_dir):
    with chorus.init(project="device") as run:
        with pytest.raises(chorus.InvalidArgument, match="<f8.*float32"):
            run.log({"f64": DeviceArray([1.0], typestr="<f8"), "ok": 1.0}).wait()
        with pytest.raises(chorus.InvalidArgument, match="3 elements"):
            run.log({"three": DeviceArray([1.0, 2.0, 3.0]), "ok": 2.0}).wait()
        with pytest.raises(chorus.InvalidArgument, match="another CUDA stream"):
            run.log({"a": DeviceArray([1.0], stream=7), "b": DeviceArray([2.0], stream=8), "ok": 3.0}).wait()
        with pytest.raises(chorus.InvalidKey):
            run.log({"_runtime": DeviceArray([1.0]), "ok": 4.0}).wait()
        w = run.writer()
        with pytest.raises(chorus.InvalidArgument, match="Writer takes host values only"):
            w.log({"dev": DeviceArray([1.0]), "ok": 5.0}, step=100).wait()
        w.close().wait()
        with pytest.raises(chorus.Error, match="NCCL|nccl"):
            run.reduce_device({"g": DeviceArray([1.0])}, op="mean").wait()
    (d,) = run_dirs(runs_dir)
    h = rows(d)
    assert [(r["_step"], r["ok"]) for r in h] == [(0, 1.0), (1, 2.0), (2, 3.0), (3, 4.0), (100, 5.0)]
    # Of two streams, the first value's stream is the call's: "b" was refused alone.
    assert h[2]["a"] == 1.0 and "b" not in h[2]
    assert {k for r in h for k in r} == {"_step", "_timestamp", "_runtime", "ok", "a"}, h


def test_a_nested_dict_of_device_values(runs_dir):
    with chorus.init(project="device") as run:
        a, b = DeviceArray([0.5]), DeviceArray([1.5])
        run.log({"gpu": {"loss": a, "deep": {"norm": b}}, "host": {"lr": 0.1}}).wait()
    (d,) = run_dirs(runs_dir)
    (r,) = rows(d)
    assert (r["gpu/loss"], r["gpu/deep/norm"], r["host/lr"]) == (0.5, 1.5, 0.1)


def test_refused_device_values_are_recorded_without_reading_them(runs_dir):
    import json

    with chorus.init(project="device") as run:
        # Tickets dropped: the refusals are recorded all the same.
        run.log({"f64_d": DeviceArray([1.0], typestr="<f8"), "ok": 1.0})
        run.log({"three_d": DeviceArray([1.0, 2.0, 3.0]), "ok": 2.0})
        w = run.writer()
        w.log({"dev_w": DeviceArray([1.0]), "ok": 3.0}, step=100)
        w.close().wait()
    (d,) = run_dirs(runs_dir)
    with open(os.path.join(d, "rejected.jsonl")) as f:
        lines = [json.loads(line) for line in f]
    values = {k: (v, line["message"]) for line in lines for k, v in line["values"].items()}
    assert set(values) == {"f64_d", "three_d", "dev_w"}, lines
    # A CUDA array is named by its type: its value is never read back to the host for the record.
    assert all(v == "<a DeviceArray on a GPU>" for v, _ in values.values()), values
    assert "float32" in values["f64_d"][1] and "3 elements" in values["three_d"][1]
    assert "Writer takes host values only" in values["dev_w"][1]


def test_histograms_of_device_arrays_are_counted_on_the_device(runs_dir):
    """chorus.Histogram of a CUDA array: run.log launches the device histogram's kernel (here, the
    stand-in runtime runs it on the host with the kernel's rules, when its event is polled) and the
    histogram lands at the call's step, bucketed as the host buckets the same values."""
    import json
    import struct

    values = [0.0, -0.0, 1.5, -2.25, 1e-30, 3.4e38, float("nan"), float("inf"), float("-inf"), 7.0, 7.0, 7.0]
    halves = [0.5, -1.0, 65504.0, 6e-8, float("inf"), float("nan"), 2.0]
    half_bits = list(struct.unpack("<7H", struct.pack("<7e", *halves)))
    held = []
    with chorus.init(project="device") as run:
        run.define_metric("grad", reduce="merge")
        for s in range(3):
            d = DeviceArray([v * (s + 1) for v in values])
            h = chorus.Histogram(d)
            assert h.on_gpu and "on a GPU" in repr(h)
            with pytest.raises(chorus.InvalidArgument, match="no figures on the host"):
                h.count
            dev = DeviceArray([s * 0.5])
            held += [d, h, dev]  # in place until the stream has run (as a GPU's stream order keeps them)
            run.log({"grad": h, "loss": float(s), "dev": dev})
        half = DeviceArray(half_bits, typestr="<f2")
        held.append(half)
        run.log({"half": chorus.Histogram(half)}, step=10).wait()
        w = run.writer()
        with pytest.raises(chorus.InvalidArgument, match="Writer takes host values only"):
            w.log({"wgrad": chorus.Histogram(DeviceArray([1.0])), "ok": 1.0}, step=11).wait()
        w.close().wait()
        with pytest.raises(chorus.InvalidArgument, match="<f8.*float32 \\(<f4\\) and float16"):
            chorus.Histogram(DeviceArray([1.0], typestr="<f8"))
    (d,) = run_dirs(runs_dir)
    with open(os.path.join(d, "histograms.jsonl")) as f:
        got = {(line["key"], line["_step"]): line for line in map(json.loads, f)}
    for s in range(3):
        line = got[("grad", s)]
        want = chorus.Histogram([ctypes.c_float(v * (s + 1)).value for v in values])  # as stored
        assert (line["count"], line["nan"], line["inf"], line["-inf"]) == (
            want.count, want.nan_count, want.pos_inf_count, want.neg_inf_count)
        assert (line["min"], line["max"]) == (want.min, want.max)
        assert sum(n for _, n in line["buckets"]) == want.count - want.nan_count - want.pos_inf_count - want.neg_inf_count
        (read,) = [r for r in chorus.open(d).histograms("grad", pandas=False) if r["_step"] == s]
        assert read["buckets"] == want.buckets()  # the same buckets as the host's
    # the scalars of the same calls are at the same steps
    assert [(r["_step"], r.get("loss"), r.get("dev")) for r in rows(d)][:3] == [(s, float(s), s * 0.5) for s in range(3)], rows(d)
    half_line = got[("half", 10)]
    want = chorus.Histogram(halves)
    assert (half_line["count"], half_line["nan"], half_line["inf"], half_line["min"], half_line["max"]) == (
        want.count, want.nan_count, want.pos_inf_count, want.min, want.max)
    assert chorus.open(d).histograms("half", pandas=False)[0]["buckets"] == want.buckets()
    assert ("wgrad", 11) not in got

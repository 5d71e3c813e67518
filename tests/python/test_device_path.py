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
        ctype = {"<f4": ctypes.c_float, "<f8": ctypes.c_double}[typestr]
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

"""CUDA arrays through the device path (label gpu): device memory made with
the CUDA runtime through ctypes, described by __cuda_array_interface__ as
CuPy, Numba and torch describe theirs. Skipped where there is no CUDA
runtime or no device."""

import ctypes
import glob
import os

import pytest

import chorus
from conftest import rows, run_dirs


def load_cudart():
    names = ["libcudart.so"] + sorted(glob.glob("/usr/local/cuda/lib64/libcudart.so*"), reverse=True)
    for n in names:
        try:
            return ctypes.CDLL(n)
        except OSError:
            continue
    return None


rt = load_cudart()
if rt is None:
    pytest.skip("no CUDA runtime (libcudart) on this machine", allow_module_level=True)
count = ctypes.c_int(0)
if rt.cudaGetDeviceCount(ctypes.byref(count)) != 0 or count.value == 0:
    pytest.skip("no CUDA device on this machine", allow_module_level=True)


class DeviceArray:
    """`values` copied into device memory; freed with the object."""

    def __init__(self, values, typestr="<f4", stream=1):
        ctype = {"<f4": ctypes.c_float, "<f8": ctypes.c_double}[typestr]
        host = (ctype * len(values))(*values)
        self.ptr = ctypes.c_void_p()
        assert rt.cudaMalloc(ctypes.byref(self.ptr), ctypes.sizeof(host)) == 0
        assert rt.cudaMemcpy(self.ptr, host, ctypes.sizeof(host), 1) == 0  # host to device
        shape = () if len(values) == 1 else (len(values),)
        self.__cuda_array_interface__ = {"data": (self.ptr.value, False), "shape": shape, "typestr": typestr,
                                         "version": 3, "stream": stream}

    def __del__(self):
        rt.cudaFree(self.ptr)


def test_device_and_host_values_land_at_one_step(runs_dir):
    with chorus.init(project="gpu") as run:
        held = []
        for s in range(50):
            d = DeviceArray([s * 0.5])
            held.append(d)  # the copy is asynchronous: keep the memory until it lands
            run.log({"dev": d, "host": float(s)})
        run.log({"only_dev": DeviceArray([7.0])}, step=60).wait()
        run.finish().wait()
    (d,) = run_dirs(runs_dir)
    h = rows(d)
    assert [r["_step"] for r in h] == list(range(50)) + [60]
    for r in h[:50]:
        assert r["dev"] == r["_step"] * 0.5 and r["host"] == float(r["_step"])
    assert h[50]["only_dev"] == 7.0


def test_a_stream_of_its_own(runs_dir):
    stream = ctypes.c_void_p()
    assert rt.cudaStreamCreate(ctypes.byref(stream)) == 0
    with chorus.init(project="gpu") as run:
        a = DeviceArray([2.5], stream=stream.value)
        run.log({"v": a}).wait()
    rt.cudaStreamDestroy(stream)
    (d,) = run_dirs(runs_dir)
    assert rows(d)[0]["v"] == 2.5


def test_arrays_the_device_path_refuses(runs_dir):
    with chorus.init(project="gpu") as run:
        with pytest.raises(chorus.InvalidArgument, match="<f8.*float32"):
            run.log({"f64": DeviceArray([1.0], typestr="<f8"), "ok": 1.0}).wait()
        with pytest.raises(chorus.InvalidArgument, match="3 elements"):
            run.log({"three": DeviceArray([1.0, 2.0, 3.0]), "ok": 2.0}).wait()
    (d,) = run_dirs(runs_dir)
    assert [r["ok"] for r in rows(d)] == [1.0, 2.0]


def test_torch_cuda_tensors_nested_and_refused(runs_dir):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("this torch has no CUDA")
    import json

    with chorus.init(project="gpu") as run:
        loss = torch.tensor(0.5, device="cuda")                     # 0-d float32: read as it is
        half = torch.tensor(1.5, device="cuda", dtype=torch.bfloat16)  # converted with .float() on the device
        run.log({"train": {"loss": loss, "half": half}, "host": 2.0}).wait()
        run.log({"many_g": torch.ones(3, device="cuda"), "ok": 1.0})  # refused, recorded without a host read
    (d,) = run_dirs(runs_dir)
    h = rows(d)
    assert (h[0]["train/loss"], h[0]["train/half"], h[0]["host"]) == (0.5, 1.5, 2.0)
    assert h[1]["ok"] == 1.0 and "many_g" not in h[1]
    with open(os.path.join(d, "rejected.jsonl")) as f:
        (line,) = [json.loads(x) for x in f]
    assert line["values"] == {"many_g": "<a Tensor on a GPU>"} and "3 elements" in line["message"]


def test_histograms_of_cuda_tensors_and_arrays_are_the_hosts_buckets(runs_dir):
    """chorus.Histogram of a CUDA tensor (float32, float16, bfloat16) or array, counted on the GPU
    by run.log: the same buckets, count, min and max as the host's histogram of the same values."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch sees no CUDA device")
    g = torch.Generator(device="cuda").manual_seed(3)
    x = torch.randn(1 << 20, device="cuda", generator=g) * 4
    x[:3] = torch.tensor([float("nan"), float("inf"), float("-inf")], device="cuda")
    tensors = {"f32": x, "f16": x.half(), "bf16": x.bfloat16(), "f64": x.double()[:1000]}
    arr = DeviceArray([0.5, -1.5, 2.0, 1e-40])
    with chorus.init(project="gpu-hist") as run:
        for s in range(2):
            run.log({k: chorus.Histogram(t) for k, t in tensors.items()} | {"arr": chorus.Histogram(arr)})
        run.finish()
        d = run.dir
    view = chorus.open(d)
    for key, t in tensors.items():
        want = chorus.Histogram(t.float().cpu())
        got = view.histograms(key, pandas=False)
        assert [r["_step"] for r in got] == [0, 1], key
        for r in got:
            assert (r["count"], r["nan"], r["inf"], r["-inf"]) == (
                want.count, want.nan_count, want.pos_inf_count, want.neg_inf_count), key
            assert (r["min"], r["max"]) == (want.min, want.max), key
            assert r["buckets"] == want.buckets(), key
    (a,) = view.histograms("arr", pandas=False)[:1]
    assert a["buckets"] == chorus.Histogram([0.5, -1.5, 2.0, 1e-40]).buckets()

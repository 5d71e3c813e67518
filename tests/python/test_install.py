"""`cmake --install` puts the package where the interpreter finds packages
of that prefix, and the installed module finds the installed library by
itself (its rpath), with nothing of the build tree on any path."""

import os
import subprocess
import sys

import pytest

BUILD = os.environ.get("CHORUS_BUILD_DIR")
PYDIR = os.environ.get("CHORUS_PYTHON_DIR")


@pytest.mark.skipif(not BUILD or not PYDIR, reason="run by ctest, which names the build tree")
def test_the_installed_package_imports_and_logs(tmp_path):
    prefix = tmp_path / "prefix"
    p = subprocess.run(["cmake", "--install", BUILD, "--prefix", str(prefix)], capture_output=True, text=True)
    assert p.returncode == 0, p.stdout + p.stderr
    site = prefix / PYDIR
    assert (site / "chorus" / "__init__.py").exists()
    script = (
        "import chorus, sys\n"
        "assert chorus._chorus.__file__.startswith(sys.argv[1]), chorus._chorus.__file__\n"
        "with chorus.init(project='installed', dir=sys.argv[2]) as run:\n"
        "    run.log({'x': 1.0}).wait()\n"
        "print(len(chorus.open(run.dir).history(pandas=False)))\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "LD_LIBRARY_PATH", "LD_PRELOAD")}
    env["PYTHONPATH"] = str(site)
    r = subprocess.run([sys.executable, "-c", script, str(site), str(tmp_path / "runs")], env=env,
                       capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.split()[-1] == "1"

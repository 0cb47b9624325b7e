"""`pip install .` (not editable): the wheel holds every subpackage and both
cffi extension modules, and works installed in a fresh virtualenv, imported
from outside the source tree.  Offline: the wheel is built without build
isolation from a copy of the tree (where this interpreter has setuptools,
wheel and cffi), and the venv borrows this interpreter's
site-packages for numpy/psutil/posix-ipc/cffi through a plain path entry (so
the editable install's import hook, which would paper over a missing
subpackage, is not loaded)."""
import glob
import importlib.util
import os
import shutil
import site
import subprocess
import sys
import sysconfig
import zipfile

import pytest

from conftest import ROOT

pytestmark = pytest.mark.timeout(600)


def _source_packages():
    out = []
    for dirpath, dirnames, filenames in os.walk(os.path.join(ROOT, "shmcoll")):
        dirnames[:] = [d for d in dirnames if d != "__pycache__"]
        if "__init__.py" in filenames:
            out.append(os.path.relpath(dirpath, ROOT).replace(os.sep, "."))
    return sorted(out)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(
        ".git", "build", "dist", "*.egg-info", "__pycache__", "*.so", "*.o", ".pytest_cache", ".benchmarks",
        "_core.c", "_numa.c", "results"))
    # offline when this interpreter has the build requirements (setuptools
    # before 70.1 needs `wheel` for bdist_wheel), else from pip's index
    have = all(importlib.util.find_spec(m) for m in ("setuptools", "wheel", "cffi"))
    p = subprocess.run([sys.executable, "-m", "pip", "wheel", str(src), "-w", str(tmp / "dist"), "--no-deps", "-q"]
                       + (["--no-build-isolation"] if have else []), capture_output=True, text=True, timeout=540)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    (whl,) = glob.glob(str(tmp / "dist" / "shmcoll-*.whl"))
    return whl


def test_wheel_holds_every_subpackage_and_the_extensions(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    packages = _source_packages()
    assert "shmcoll.coll" in packages
    for pkg in packages:
        init = pkg.replace(".", "/") + "/__init__.py"
        assert init in names, f"{pkg} is missing from the wheel"
        here = os.path.join(ROOT, *pkg.split("."))
        for f in sorted(os.listdir(here)):
            if f.endswith(".py"):
                assert f"{pkg.replace('.', '/')}/{f}" in names, f"{pkg}.{f[:-3]} is missing from the wheel"
    ext = sysconfig.get_config_var("EXT_SUFFIX")
    for mod in ("_core", "_numa"):
        assert any(n.startswith(f"shmcoll/{mod}.") and n.endswith((ext, ".abi3.so")) for n in names), \
            f"extension shmcoll.{mod} is missing from the wheel: {[n for n in names if n.endswith('.so')]}"
    assert not any(n.startswith(("tests/", "csrc/", "bench/", "build/")) or "__pycache__" in n for n in names)


def test_wheel_installs_and_runs_outside_the_tree(wheel, tmp_path):
    venv = tmp_path / "venv"
    # nothing of the source tree or the editable install may leak in
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME") and
           not k.startswith("SHMCOLL_")}
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    py = venv / "bin" / "python"
    purelib = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             env=env, capture_output=True, text=True, check=True, timeout=60).stdout.strip()
    p = subprocess.run([sys.executable, "-m", "pip", "--python", str(py), "install", "--no-deps", "-q", wheel],
                       env=env, capture_output=True, text=True, timeout=300)
    if p.returncode and "no such option: --python" in p.stderr:
        p = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--prefix", str(venv),
                            wheel], env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    # then (not before: pip would take the editable install it holds for
    # this wheel) the dependencies from this interpreter, as a plain path:
    # its .pth files (the editable install's finder among them) are not run
    with open(os.path.join(purelib, "_deps.pth"), "w") as f:
        f.write("\n".join(site.getsitepackages()) + "\n")
    code = ("import os, sys, shmcoll, shmcoll.coll\n"
            "assert not os.path.exists('shmcoll')\n"
            f"assert shmcoll.__file__.startswith({str(venv)!r}), shmcoll.__file__\n"
            "from shmcoll import _core, _numa\n"
            "assert _core.__file__.startswith(os.path.dirname(shmcoll.__file__)), _core.__file__\n"
            "print(shmcoll.launch(lambda c: c.bcast(c.rank + 10, root=1), 2, timeout=60))\n")
    p = subprocess.run([str(py), "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-3000:]
    assert p.stdout.split("\n")[-2] == "[11, 11]"
    p = subprocess.run([str(venv / "bin" / "shmcoll"), "run", "-n", "2", "--bind", "none", "--timeout", "60", "--",
                        "-c", "import shmcoll, os; c = shmcoll.init(); c.Barrier(); "
                        "os.write(1, f'{c.rank} {shmcoll.__file__}\\n'.encode())"],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-3000:]
    lines = sorted(p.stdout.splitlines())
    assert [l.split()[0] for l in lines] == ["0", "1"] and all(str(venv) in l for l in lines), lines

"""Both ways of installing the package give an importable umbp: pip (offline,
--no-build-isolation, from a copy of connector/ so that the build leaves
nothing in the tree) and cmake --install (which bundles libumbp.so).

After either install into an empty prefix, the two engine entry points the
docs name must import from the installed copy (not from this tree):
vLLM's `kv_connector_module_path: umbp.vllm.connector` (vLLM cannot be
installed here: the harness's fake `vllm` package stands in for it, and only
it is put on the path) and SGLang's dynamic backend `umbp.sglang.hicache`
(with SGLang's stand-in classes).  Every subpackage of the source tree must
be in the installed tree."""
import os
import shutil
import subprocess
import sys

import pytest

from conftest import CONNECTOR, REPO

PROBE = "import umbp, sys; umbp.Runtime({'capacity_bytes': '8MiB'}).close(); print(umbp.library_path)"
HARNESS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "vllm_harness")
# The module paths docs/vllm.md and docs/sglang.md tell users to configure;
# each must come from the installed prefix.
ENGINES = ("import importlib, sys, os\n"
           "prefix = sys.argv[1]\n"
           "for mod, cls in (('umbp.vllm.connector', 'UMBPConnector'),\n"
           "                 ('umbp.sglang.hicache', 'UMBPStore')):\n"
           "    m = importlib.import_module(mod)\n"
           "    assert m.__file__.startswith(prefix), (mod, m.__file__)\n"
           "    getattr(m, cls)\n"
           "print('ok')\n")


def _subpackages(root):
    return sorted(os.path.relpath(d, root) for d, _, files in os.walk(os.path.join(root, "umbp"))
                  if "__init__.py" in files)


def _check_engines(site):
    assert _subpackages(str(site)) == _subpackages(CONNECTOR)
    e = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH",)}
    e["PYTHONPATH"] = os.pathsep.join([str(site), HARNESS])
    r = subprocess.run([sys.executable, "-c", ENGINES, str(site)], capture_output=True,
                       text=True, env=e, cwd="/", timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "ok"


def _run_clean(code, path, **env):
    e = {k: v for k, v in os.environ.items() if k not in ("UMBP_LIBRARY", "PYTHONPATH")}
    e.update(env)
    e["PYTHONPATH"] = path
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=e,
                          cwd="/", timeout=120)


def test_pip_install_offline(tmp_path):
    r = subprocess.run([sys.executable, "-m", "pip", "--version"], capture_output=True)
    if r.returncode:
        pytest.skip("pip is not installed for %s" % sys.executable)
    src = tmp_path / "src"
    shutil.copytree(CONNECTOR, src, ignore=shutil.ignore_patterns("__pycache__", "build",
                                                                  "*.egg-info", "tests"))
    r = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-build-isolation",
                        "--no-index", "--target", str(tmp_path / "site"), str(src)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    import umbp
    r = _run_clean(PROBE, str(tmp_path / "site"), UMBP_LIBRARY=umbp.library_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == umbp.library_path
    _check_engines(tmp_path / "site")


def test_cmake_install_bundles_the_library(tmp_path):
    build = os.path.join(REPO, "build")
    if not shutil.which("cmake") or not os.path.exists(os.path.join(build, "CMakeCache.txt")):
        pytest.skip("no configured build/ tree to install from")
    if not os.path.exists(os.path.join(build, "cmake_install.cmake")) or \
            "UMBP_PYTHON_INSTALL_DIR" not in open(os.path.join(build, "CMakeCache.txt")).read():
        pytest.skip("build/ was configured before the Python install rule; re-run cmake")
    r = subprocess.run(["cmake", "--install", build, "--prefix", str(tmp_path)],
                       capture_output=True, text=True, timeout=300)
    if r.returncode and "file INSTALL cannot find" in r.stderr:
        pytest.skip("build/ is not fully built (cmake --install needs every target)")
    assert r.returncode == 0, r.stderr
    site = tmp_path / "lib" / "python3" / "dist-packages"
    assert (site / "umbp" / "_lib" / "libumbp.so").exists()
    r = _run_clean(PROBE, str(site))
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == str(site / "umbp" / "_lib" / "libumbp.so")
    _check_engines(site)

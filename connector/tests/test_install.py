"""Every way of installing the package gives an importable umbp: the wheel
(`pip wheel ./connector`, offline, --no-build-isolation, from a copy of
connector/ so that the build leaves nothing in the tree; it runs CMake and
bundles libumbp.so), the pure package (UMBP_BUNDLE_LIBRARY=0, library from
$UMBP_LIBRARY) and cmake --install (which bundles libumbp.so).

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


def _pip(*args, **env):
    e = dict(os.environ)
    e.update(env)
    return subprocess.run([sys.executable, "-m", "pip", *args], capture_output=True, text=True,
                          env=e, timeout=600)


def _need_pip():
    if _pip("--version").returncode:
        pytest.skip("pip is not installed for %s" % sys.executable)


def _source_copy(tmp_path):
    """connector/ without its tests, so that the build leaves nothing in this tree."""
    src = tmp_path / "src"
    shutil.copytree(CONNECTOR, src, ignore=shutil.ignore_patterns("__pycache__", "build",
                                                                  "*.egg-info", "tests", "_lib"))
    return src


def _wheel(tmp_path, src, **env):
    r = _pip("wheel", "-q", "--no-build-isolation", "--no-index", "--no-deps",
             "-w", str(tmp_path / "dist"), str(src), **env)
    assert r.returncode == 0, r.stdout + r.stderr
    (whl,) = (tmp_path / "dist").glob("umbp-*.whl")
    return whl


def _install(tmp_path, whl):
    r = _pip("install", "-q", "--no-index", "--no-deps", "--target", str(tmp_path / "site"),
             str(whl))
    assert r.returncode == 0, r.stderr
    return tmp_path / "site"


def test_pure_package_without_the_library(tmp_path):
    """UMBP_BUNDLE_LIBRARY=0: the Python package alone (any platform), which
    loads the library $UMBP_LIBRARY names."""
    _need_pip()
    whl = _wheel(tmp_path, _source_copy(tmp_path), UMBP_BUNDLE_LIBRARY="0")
    assert whl.name.endswith("-py3-none-any.whl"), whl.name
    site = _install(tmp_path, whl)
    assert not (site / "umbp" / "_lib").exists()
    import umbp
    r = _run_clean(PROBE, str(site), UMBP_LIBRARY=umbp.library_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == umbp.library_path
    _check_engines(site)


# From an environment that names no library: both engines' module paths
# import from the install, the library loaded is the wheel's, and an
# embedded runtime round-trips bytes exactly.
WHEEL_PROBE = ENGINES.replace("print('ok')\n", "") + """
import numpy as np, umbp
want = os.path.join(prefix, 'umbp', '_lib', 'libumbp.so')
assert umbp.library_path == want, (umbp.library_path, want)
rt = umbp.Runtime({'mode': 'embedded', 'capacity_bytes': '8MiB', 'gpu_backend': 'host'})
n, size = 4, 8192
src = np.random.default_rng(7).integers(0, 256, n * size, dtype=np.uint8)
dst = np.zeros_like(src)
keys = np.arange(n * 32, dtype=np.uint8).reshape(n, 32)
offs = np.arange(n, dtype=np.uint64) * size
with rt.put(keys, src.ctypes.data + offs, size) as job:
    job.wait(); assert job.num_ok == n, job.statuses()
with rt.get(keys, dst.ctypes.data + offs, size) as job:
    job.wait(); assert job.num_ok == n, job.statuses()
assert dst.tobytes() == src.tobytes()
rt.close()
print('ok')
"""
NO_LIBRARY_ENV = ("UMBP_LIBRARY", "UMBP_BUILD_DIR", "LD_LIBRARY_PATH", "PYTHONPATH")


def test_wheel_bundles_the_library(tmp_path):
    """The documented install: `pip wheel ./connector` runs CMake (here in the
    configured build/, reused as CI does) and the platform wheel carries
    libumbp.so, umbp-server and umbp, and the libraries they link."""
    _need_pip()
    build = os.path.join(REPO, "build")
    if not os.path.exists(os.path.join(build, "CMakeCache.txt")):
        pytest.skip("no configured build/ to reuse (UMBP_CMAKE_BUILD_DIR)")
    whl = _wheel(tmp_path, _source_copy(tmp_path), UMBP_SOURCE_DIR=REPO,
                 UMBP_CMAKE_BUILD_DIR=build)
    assert "-py3-none-linux_" in whl.name, whl.name
    site = _install(tmp_path, whl)
    for name in ("libumbp.so", "umbp-server", "umbp"):
        assert (site / "umbp" / "_lib" / name).is_file(), name
    _check_self_contained(site / "umbp" / "_lib")
    e = {k: v for k, v in os.environ.items() if k not in NO_LIBRARY_ENV}
    e["PYTHONPATH"] = os.pathsep.join([str(site), HARNESS])
    r = subprocess.run([sys.executable, "-c", WHEEL_PROBE, str(site)], capture_output=True,
                       text=True, env=e, cwd="/", timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "ok"
    # the commands exec the bundled binaries
    for cmd, usage in (("umbp-server", "usage: umbp-server"), ("umbp", "usage: umbp ")):
        r = subprocess.run([str(site / "bin" / cmd), "--help"], capture_output=True, text=True,
                           env=e, timeout=60)
        assert usage in r.stdout + r.stderr, (cmd, r.stdout, r.stderr)


def _check_self_contained(lib):
    """Every library the three binaries load, but the C and C++ runtimes,
    resolves to the wheel's own copy (DT_RPATH $ORIGIN), with nothing on
    LD_LIBRARY_PATH: a host needs no package of umbp's (docs/operations.md);
    UCX's transport modules sit beside libucs."""
    from umbp import _deps
    if shutil.which("ldd") is None:
        pytest.skip("no ldd")
    env = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}
    seen = set()
    for name in ("libumbp.so", "umbp-server", "umbp"):
        out = subprocess.run(["ldd", str(lib / name)], capture_output=True, text=True, env=env,
                             check=True).stdout
        for line in out.splitlines():
            parts = line.split()
            if len(parts) < 3 or parts[1] != "=>":
                continue
            so, where = parts[0], parts[2]
            assert where != "not", (name, line)
            if so in _deps.BASE_LIBRARIES:
                continue
            assert os.path.dirname(where) == str(lib), "%s loads %s from %s" % (name, so, where)
            seen.add(so)
    assert {"libev.so.4", "libsodium.so.23", "libjson-c.so.5"} <= seen, seen
    if "libucs.so.0" in seen:
        assert sorted(os.listdir(lib / "ucx")), "no UCX transport modules beside libucs"


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

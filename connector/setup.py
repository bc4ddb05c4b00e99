"""The wheel's build step: runs CMake for libumbp.so, umbp-server and the
umbp tool, and puts them into the package's umbp/_lib/ (where umbp/_lib.py
looks right after $UMBP_LIBRARY).  pyproject.toml holds the metadata; this
file only adds the native build, so the wheel is a platform wheel
(py3-none-linux_<arch>: the library is loaded with ctypes, so no CPython ABI
is tied to it).

    pip wheel --no-build-isolation --no-deps -w dist ./connector

Environment (all optional):
  UMBP_CMAKE_BUILD_DIR  a CMake build directory to build in and reuse: an
                        existing one (e.g. the repo's build/) is only brought
                        up to date, so CI does not rebuild from scratch;
                        default connector/build/cmake (kept between builds)
  UMBP_SOURCE_DIR       the umbp source tree (default: the directory above
                        connector/, when it holds umbp's CMakeLists.txt)
  UMBP_CMAKE_ARGS       extra arguments of a fresh configure (e.g. GPU options)
  CMAKE_BUILD_PARALLEL_LEVEL  jobs of `cmake --build` (CMake reads it)
  UMBP_BUNDLE_LIBRARY=0 build the pure-Python package without the native
                        files (the library then comes from $UMBP_LIBRARY or
                        the system: docs/python.md)
  UMBP_BUNDLE_DEPS=0    bundle umbp's binaries only, not the shared libraries
                        they link (the host then installs those:
                        docs/operations.md, "Runtime libraries")

By default the wheel also carries the shared libraries the binaries link
(umbp/_deps.py lists them; every one ldd resolves except the C and C++
runtimes), UCX's transport modules (ucx/ beside libucs), and sets the
binaries' DT_RPATH to $ORIGIN with patchelf (scripts/setup.sh installs it):
a host needs no package but a glibc as new as the build host's.

Runs in the process of pip's build backend; writes only under the build
directory and setuptools' build/.
"""
import importlib.util
import os
import re
import shlex
import shutil
import subprocess

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution

try:
    from wheel.bdist_wheel import bdist_wheel
except ImportError:  # only `pip wheel` / bdist_wheel needs it (python3-wheel)
    bdist_wheel = None

HERE = os.path.dirname(os.path.abspath(__file__))

# what the wheel carries: (path in the CMake build directory, name in umbp/_lib/)
NATIVE = (("libumbp.so", "libumbp.so"),
          ("server/umbp-server", "umbp-server"),
          ("server/umbp", "umbp"))
TARGETS = ("umbp", "umbp-server", "umbp-cli")


def _bundle():
    return os.environ.get("UMBP_BUNDLE_LIBRARY", "1") not in ("0", "false", "no", "")


def _source_dir():
    src = os.environ.get("UMBP_SOURCE_DIR") or os.path.dirname(HERE)
    lists = os.path.join(src, "CMakeLists.txt")
    if not os.path.isfile(lists) or "project(umbp" not in open(lists).read():
        raise SystemExit(
            "umbp wheel: no umbp source tree at %s (its CMakeLists.txt names no project(umbp)); "
            "build from a checkout (pip wheel ./connector), set UMBP_SOURCE_DIR to one, or set "
            "UMBP_BUNDLE_LIBRARY=0 for the package without libumbp.so" % src)
    return src


def _cmake_build():
    bdir = os.path.abspath(os.environ.get("UMBP_CMAKE_BUILD_DIR")
                           or os.path.join(HERE, "build", "cmake"))
    cmake = shutil.which("cmake")
    if not cmake:
        raise SystemExit("umbp wheel: cmake is not in PATH (scripts/setup.sh installs it)")
    if not os.path.exists(os.path.join(bdir, "CMakeCache.txt")):
        cfg = [cmake, "-S", _source_dir(), "-B", bdir, "-DCMAKE_BUILD_TYPE=RelWithDebInfo",
               "-DUMBP_BUILD_TESTS=OFF", "-DUMBP_BUILD_BENCH=OFF", "-DUMBP_INSTALL_PYTHON=OFF"]
        if shutil.which("ninja"):
            cfg += ["-G", "Ninja"]
        cfg += shlex.split(os.environ.get("UMBP_CMAKE_ARGS", ""))
        subprocess.run(cfg, check=True)
    # an existing directory: cmake --build re-runs its configure when needed
    subprocess.run([cmake, "--build", bdir, "--target", *TARGETS], check=True)
    return bdir


def _deps_table():
    """umbp/_deps.py, read without importing umbp (which loads the library)."""
    spec = importlib.util.spec_from_file_location("umbp_deps", os.path.join(HERE, "umbp", "_deps.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _resolved(binary):
    """{soname: path} of every library ldd resolves for binary (transitively)."""
    out = subprocess.run(["ldd", binary], capture_output=True, text=True, check=True).stdout
    libs = {}
    for m in re.finditer(r"^\s*(\S+) => (/\S+) \(0x", out, re.M):
        libs[m.group(1)] = m.group(2)
    missing = re.findall(r"^\s*(\S+) => not found", out, re.M)
    if missing:
        raise SystemExit("umbp wheel: %s links %s, which this host cannot resolve"
                         % (binary, ", ".join(missing)))
    return libs


def _bundle_ucx_modules(libucs, soname, dest):
    """UCX loads its transport modules (ib, rdmacm, cma) from ucx/ beside
    libucs, each named lib<framework>_<module> plus libucs's own suffix
    (.so.0): those files, not the .a or the -dev symlinks.  Their own
    dependencies (rdma-core's libibverbs, librdmacm) stay the host's: a
    module whose library is missing is skipped by UCX."""
    src = os.path.join(os.path.dirname(os.path.realpath(libucs)), "ucx")
    ext = soname[soname.index(".so"):]
    if not os.path.isdir(src):
        return
    os.makedirs(os.path.join(dest, "ucx"), exist_ok=True)
    for f in sorted(os.listdir(src)):
        if f.endswith(ext):
            shutil.copyfile(os.path.join(src, f), os.path.join(dest, "ucx", f))
            os.chmod(os.path.join(dest, "ucx", f), 0o755)


def _bundle_deps(dest, names):
    """Copies the libraries the binaries in dest link (not the C and C++
    runtimes) and UCX's modules into dest, and points the binaries' DT_RPATH
    (inherited by what they load, unlike DT_RUNPATH) at $ORIGIN."""
    patchelf = shutil.which("patchelf")
    if not patchelf:
        raise SystemExit("umbp wheel: patchelf is not in PATH (scripts/setup.sh installs it); "
                         "or set UMBP_BUNDLE_DEPS=0 for a wheel whose host installs the "
                         "libraries itself (docs/operations.md)")
    base = _deps_table().BASE_LIBRARIES
    libs = {}
    for n in names:
        libs.update(_resolved(os.path.join(dest, n)))
    for soname, path in sorted(libs.items()):
        if soname in base or soname.startswith("linux-vdso") or soname.startswith("ld-linux"):
            continue
        shutil.copyfile(path, os.path.join(dest, soname))  # follows the symlink
        os.chmod(os.path.join(dest, soname), 0o755)
        if soname.startswith("libucs.so"):
            _bundle_ucx_modules(path, soname, dest)
    _bundle_licenses(sorted(p for so, p in libs.items() if os.path.exists(os.path.join(dest, so))),
                     os.path.join(dest, "licenses"))
    for n in names:
        subprocess.run([patchelf, "--force-rpath", "--set-rpath", "$ORIGIN",
                        os.path.join(dest, n)], check=True)


def _bundle_licenses(paths, dest):
    """The copyright file of each bundled library's distribution package
    (Debian and Ubuntu: /usr/share/doc/<package>/copyright), as
    licenses/<package>.copyright: the wheel redistributes those libraries."""
    dpkg = shutil.which("dpkg-query")
    if not dpkg:
        return
    os.makedirs(dest, exist_ok=True)
    for path in paths:
        r = subprocess.run([dpkg, "-S", os.path.realpath(path)], capture_output=True, text=True)
        if r.returncode != 0:  # try the unresolved path (usrmerge: /lib vs /usr/lib)
            r = subprocess.run([dpkg, "-S", path], capture_output=True, text=True)
        if r.returncode != 0:
            continue
        pkg = r.stdout.split(":", 1)[0].strip()
        src = os.path.join("/usr/share/doc", pkg, "copyright")
        if os.path.isfile(src):
            shutil.copyfile(src, os.path.join(dest, pkg + ".copyright"))


class BuildWithNative(build_py):
    """build_py, then the CMake build; the native files join umbp/_lib/."""

    def run(self):
        super().run()
        if not _bundle():
            return
        bdir = _cmake_build()
        dest = os.path.join(self.build_lib, "umbp", "_lib")
        shutil.rmtree(dest, ignore_errors=True)  # all ours: nothing stale from a former build
        os.makedirs(dest)
        for src, name in NATIVE:
            path = os.path.join(bdir, src)
            if not os.path.isfile(path):
                raise SystemExit("umbp wheel: %s was not built in %s" % (src, bdir))
            shutil.copyfile(path, os.path.join(dest, name))  # follows libumbp.so's symlink
            os.chmod(os.path.join(dest, name), 0o755)
        if os.environ.get("UMBP_BUNDLE_DEPS", "1") not in ("0", "false", "no", ""):
            _bundle_deps(dest, [name for _, name in NATIVE])


class NativeDistribution(Distribution):
    def has_ext_modules(self):  # a platform wheel, and purelib -> platlib
        return _bundle()


cmdclass = {"build_py": BuildWithNative}
if bdist_wheel is not None:
    class PlatformWheel(bdist_wheel):
        def get_tag(self):
            _, _, plat = super().get_tag()
            return ("py3", "none", plat) if _bundle() else ("py3", "none", "any")

    cmdclass["bdist_wheel"] = PlatformWheel

setup(distclass=NativeDistribution, cmdclass=cmdclass)

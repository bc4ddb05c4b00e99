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

Runs in the process of pip's build backend; writes only under the build
directory and setuptools' build/.
"""
import os
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


class BuildWithNative(build_py):
    """build_py, then the CMake build; the native files join umbp/_lib/."""

    def run(self):
        super().run()
        if not _bundle():
            return
        bdir = _cmake_build()
        dest = os.path.join(self.build_lib, "umbp", "_lib")
        os.makedirs(dest, exist_ok=True)
        for src, name in NATIVE:
            path = os.path.join(bdir, src)
            if not os.path.isfile(path):
                raise SystemExit("umbp wheel: %s was not built in %s" % (src, bdir))
            shutil.copyfile(path, os.path.join(dest, name))  # follows libumbp.so's symlink
            os.chmod(os.path.join(dest, name), 0o755)


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

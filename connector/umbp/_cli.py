"""The `umbp-server` and `umbp` commands of a wheel install: each replaces
itself (exec) with the binary the wheel carries in umbp/_lib/, so that
auto_start's default server_path ("umbp-server", looked up in PATH) finds
it in an activated environment.  Does not import the ctypes bindings."""
import os
import sys

_LIB = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_lib")


def _exec(name):
    path = os.path.join(_LIB, name)
    if not os.access(path, os.X_OK):
        sys.exit("%s: %s is not in this install (a wheel built with UMBP_BUNDLE_LIBRARY=0, or "
                 "a source install); use the one `cmake --install` puts in <prefix>/bin" % (name, path))
    os.execv(path, [name] + sys.argv[1:])


def server():
    _exec("umbp-server")


def tool():
    _exec("umbp")

"""Loading libumbp.so and declaring every C function the package calls.

Lookup order (the first that exists is loaded; failure names every path):
  1. $UMBP_LIBRARY (a path to libumbp.so)
  2. umbp/_lib/libumbp.so* inside this package (the wheel, which
     connector/setup.py builds with CMake, and cmake --install put it there;
     a data directory, not a Python package: this module is umbp._lib)
  3. $UMBP_BUILD_DIR/libumbp.so
  4. <repo>/build/libumbp.so, when the package runs from a source tree
  5. ctypes.util.find_library("umbp")

Every function has argtypes and restype.  Functions of newer libraries (the
lookup service, include/umbp/lookup.h) are resolved on first use with
optional(): on a library that predates them the call raises
LibraryTooOld (an UmbpError and a NotImplementedError) instead of failing
at import.

ctypes releases the GIL around every foreign call, so umbp_op_wait and
umbp_lookup never block other Python threads.
"""
import ctypes
import ctypes.util
import errno
import glob
import os
import threading

from . import _deps, _ffi

_c_int_p = ctypes.POINTER(ctypes.c_int)
_vp = ctypes.c_void_p
_vpp = ctypes.POINTER(ctypes.c_void_p)
_sz = ctypes.c_size_t
_u32 = ctypes.c_uint32
_u64 = ctypes.c_uint64
_int = ctypes.c_int
_str = ctypes.c_char_p

# name: (restype, argtypes)
_FUNCS = {
    "umbp_strerror": (_str, [_int]),
    "umbp_last_error": (_str, []),
    "umbp_runtime_create": (_int, [_str, _vpp]),
    "umbp_config_check": (_int, [_str, _vp, _sz]),
    "umbp_mode_flags": (_int, [_str]),
    "umbp_option_lookup": (_int, [_str, _str]),
    "umbp_runtime_destroy": (None, [_vp]),
    "umbp_mem_register": (_int, [_vp, ctypes.POINTER(_ffi.MemDesc), ctypes.POINTER(_u64)]),
    "umbp_mem_deregister": (_int, [_vp, _u64]),
    "umbp_put": (_int, [_vp, _vp, _sz, _vpp]),
    "umbp_get": (_int, [_vp, _vp, _sz, _vpp]),
    "umbp_lookup": (_int, [_vp, _vp, _sz, _vp, ctypes.POINTER(_sz), ctypes.c_uint]),
    "umbp_clear": (_int, [_vp]),
    "umbp_flush": (_int, [_vp, _int]),
    "umbp_kv_register": (_int, [_vp, _vp, _u32, ctypes.POINTER(_u64)]),
    "umbp_kv_deregister": (_int, [_vp, _u64]),
    "umbp_kv_object_size": (_u64, [_vp, _u64]),
    "umbp_kv_store": (_int, [_vp, _u64, _vp, _sz, _vp, _vpp]),
    "umbp_kv_load": (_int, [_vp, _u64, _vp, _sz, _vp, _vpp]),
    "umbp_kv_warm_load": (_int, [_vp, _u64, _vp, _sz, _vp, _vpp]),
    "umbp_op_test": (_int, [_vp]),
    "umbp_op_wait": (_int, [_vp, _int]),
    "umbp_prewake": (_int, [_vp]),
    "umbp_op_num_keys": (_sz, [_vp]),
    "umbp_op_key_status": (_int, [_vp, _sz]),
    "umbp_op_statuses": (_int, [_vp, _vp, _sz]),
    "umbp_op_num_ok": (_sz, [_vp]),
    "umbp_op_release": (None, [_vp]),
    "umbp_get_stats": (_int, [_vp, ctypes.POINTER(_ffi.Stats)]),
    "umbp_events_drain": (_sz, [_vp, _vp, _sz, ctypes.POINTER(_u64)]),
    "umbp_ns_derive": (_int, [ctypes.POINTER(_ffi.NsDesc), _vp]),
    "umbp_ns_from_string": (_int, [_str, _vp]),
    "umbp_ns_to_hex": (None, [_vp, _str]),
    "umbp_ns_from_hex": (_int, [_str, _vp]),
    "umbp_keys_derive": (_int, [_vp, ctypes.POINTER(_ffi.RankId), _u32, _vp, _sz, _sz, _vp]),
    "umbp_gpu_backends_built": (ctypes.c_uint, []),
    "umbp_gpu_backend_probe": (_int, [_int, _c_int_p]),
}

# include/umbp/lookup.h (branch `lookup`): bound on first use
_OPTIONAL = {
    "umbp_lookup_socket_path": (_int, [_str, _str, _str, _u32, _u32, _vp, _sz]),
    "umbp_lookup_serve": (_int, [_vp, _str, _str, _str, _u32, _u32]),
    "umbp_lookup_client_create": (_int, [_str, _vpp]),
    "umbp_lookup_client_destroy": (None, [_vp]),
    "umbp_lookup_client_query": (_int, [_vp, _vp, _sz, _sz, _vp, _vp, ctypes.POINTER(_sz)]),
}

_PKG_DIR = os.path.dirname(os.path.abspath(__file__))
_REPO_DIR = os.path.dirname(os.path.dirname(_PKG_DIR))


def candidates():
    """The paths tried, in order (existing or not)."""
    out = []
    env = os.environ.get("UMBP_LIBRARY")
    if env:
        out.append(env)
    bundled = sorted(glob.glob(os.path.join(_PKG_DIR, "_lib", "libumbp.so*")), key=len)
    out.extend(bundled or [os.path.join(_PKG_DIR, "_lib", "libumbp.so")])
    bdir = os.environ.get("UMBP_BUILD_DIR")
    if bdir:
        out.append(os.path.join(bdir, "libumbp.so"))
    out.append(os.path.join(_REPO_DIR, "build", "libumbp.so"))
    return out


def _load():
    tried, why = [], []
    for path in candidates():
        if not os.path.exists(path):
            tried.append("%s (absent)" % path)
            continue
        try:
            return ctypes.CDLL(path), path
        except OSError as e:
            tried.append("%s (%s)" % (path, e))
            w = _deps.load_failure(path, str(e))
            if w is not None and w not in why:
                why.append(w)
    found = ctypes.util.find_library("umbp")
    if found:
        try:
            return ctypes.CDLL(found), found
        except OSError as e:
            tried.append("find_library: %s (%s)" % (found, e))
    else:
        tried.append("ctypes.util.find_library('umbp') (not found)")
    if why:  # found, but this host lacks what it links
        raise ImportError("umbp: libumbp.so was found but cannot load: " + "; ".join(why)
                          + ". docs/operations.md (Runtime libraries) lists what to install. "
                          "Tried: " + "; ".join(tried))
    raise ImportError("umbp: cannot load libumbp.so; tried: " + "; ".join(tried)
                      + ". Set UMBP_LIBRARY to its path, or install the wheel that bundles it "
                      "(pip wheel --no-build-isolation ./connector; docs/python.md)")


lib, path = _load()

for _name, (_res, _args) in _FUNCS.items():
    try:
        _f = getattr(lib, _name)
    except AttributeError:
        raise ImportError("umbp: %s lacks %s; it is older than this package (which needs "
                          "umbp/keys.h and umbp_op_statuses): rebuild it or point UMBP_LIBRARY "
                          "at a newer one" % (path, _name)) from None
    _f.restype = _res
    _f.argtypes = _args
    globals()[_name] = _f
del _name, _res, _args, _f


# ---- errors ----------------------------------------------------------------

class UmbpError(Exception):
    """A failed umbp call: .code is the negative return value, args[0] the message."""

    def __init__(self, code, message=None):
        if message is None:
            message = strerror(code)
        super().__init__(message)
        self.code = code


class LibraryTooOld(UmbpError, NotImplementedError):
    """The loaded libumbp.so lacks a function of a newer API."""


def strerror(code):
    return umbp_strerror(int(code)).decode("utf-8", "replace")


def last_error():
    return umbp_last_error().decode("utf-8", "replace")


def error(rc, what, use_last=False):
    """An UmbpError for return code rc of `what`; with use_last the message is
    umbp_last_error() (set by option, key and registration failures)."""
    msg = last_error() if use_last else ""
    if not msg:
        msg = strerror(rc)
    return UmbpError(rc, "%s: %s" % (what, msg))


def check(rc, what, use_last=False):
    if rc < 0:
        raise error(rc, what, use_last)
    return rc


# ---- functions of newer libraries ----------------------------------------

_opt_lock = threading.Lock()
_opt_cache = {}


def has(name):
    """Whether the loaded library exports `name`."""
    try:
        getattr(lib, name)
        return True
    except AttributeError:
        return False


def optional(name):
    """The C function `name` (one of _OPTIONAL), bound on first use."""
    f = _opt_cache.get(name)
    if f is not None:
        return f
    with _opt_lock:
        f = _opt_cache.get(name)
        if f is None:
            try:
                f = getattr(lib, name)
            except AttributeError:
                raise LibraryTooOld(
                    -errno.ENOSYS,
                    "%s: the loaded libumbp (%s) predates the lookup service "
                    "(include/umbp/lookup.h); rebuild it from a tree that has it"
                    % (name, path)) from None
            res, args = _OPTIONAL[name]
            f.restype = res
            f.argtypes = args
            _opt_cache[name] = f
    return f

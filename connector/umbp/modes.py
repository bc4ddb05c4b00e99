"""What a mode means, and whether a config is good, as the C library says.

The mode table (UMBP_MODES, common/options.h) has one row per mode with its
properties; connectors read :func:`mode_properties` instead of comparing
mode names, so a new mode is one row in C.  :func:`check_config` parses a
runtime config exactly as ``umbp.Runtime`` would (every option table,
UMBP_* variables, the rules between options) without creating anything:
the C option tables are the only place where a runtime option's default,
bounds and cross-checks live.  Any thread.
"""
from __future__ import annotations

import ctypes
import errno
import json
from dataclasses import dataclass

from . import _lib

# include/umbp/umbp.h UMBP_MODE_* (connector/tests/test_ffi.py checks them)
SHARED_POOL = 1 << 0
SESSIONS = 1 << 1
SHARED_LOOKUP = 1 << 2


@dataclass(frozen=True)
class ModeProperties:
    """One row of the mode table."""

    name: str
    #: one pool for every rank and engine attached: one rank's clear clears all
    shared_pool: bool
    #: runtimes are sessions of a server process (option ``role``: worker or lookup)
    sessions: bool
    #: a scheduler looks up in the shared index with its own runtime (role
    #: lookup); otherwise each rank serves its pool's lookups (serve_lookups)
    shared_lookup: bool


def mode_properties(mode: str) -> ModeProperties:
    """The properties of `mode`; UmbpError with C's message (naming the mode
    and the modes there are) for a name that is not a mode or a mode this
    library cannot run."""
    if not isinstance(mode, str):
        raise _lib.UmbpError(-22, "mode: must be a string, got %r" % (mode,))
    f = _lib.umbp_mode_flags(mode.encode("utf-8"))
    if f < 0:
        raise _lib.UmbpError(f, _lib.last_error() or _lib.strerror(f))
    return ModeProperties(mode, bool(f & SHARED_POOL), bool(f & SESSIONS), bool(f & SHARED_LOOKUP))


def check_config(options: dict | str) -> dict:
    """The value of every option of the core and of the mode's tier, as
    umbp.Runtime(options) would use them (defaults and UMBP_* variables
    applied); UmbpError with C's message (naming the option and what it
    accepts) if the runtime would refuse the config."""
    text = options if isinstance(options, str) else json.dumps(options)
    size = 16384
    while True:
        buf = ctypes.create_string_buffer(size)
        rc = _lib.umbp_config_check(text.encode("utf-8"), buf, size)
        if rc != -errno.ENOSPC:
            break
        size *= 4
    if rc < 0:
        raise _lib.UmbpError(rc, _lib.last_error() or _lib.strerror(rc))
    return json.loads(buf.value.decode("utf-8"))


def option_lookup(name: str, mode: str) -> int:
    """Whether a runtime of `mode` takes option `name`, as C says: 0 if it
    does; -EINVAL if it is another tier's option (a runtime of this mode
    refuses it); -ENOENT if there is no such option.  The message
    (:func:`umbp._lib.last_error`: which tier, or the closest name) goes with
    it as an UmbpError's text via :func:`option_error`."""
    return _lib.umbp_option_lookup(name.encode("utf-8"), mode.encode("utf-8"))


def option_error(name: str, mode: str) -> str | None:
    """None if a runtime of `mode` takes option `name`, else C's message
    saying why not (another tier's option; unknown, with the closest name)."""
    rc = option_lookup(name, mode)
    return None if rc == 0 else (_lib.last_error() or _lib.strerror(rc))

"""forking.py - running a check in a forked child, for the fork tests of
test_binding_edges.py and test_lookup.py."""
import os
import signal
import time
import traceback

import pytest


def in_child(fn, bound_s=60.0):
    """Runs fn in a forked child; its exit code is fn's return value (97: it
    returned nothing usable, 98: it raised, with the traceback printed).
    Returns os.waitpid's status; a child still running after bound_s is
    killed (SIGKILL) and fails the test: a hang is a failure, never a wait."""
    pid = os.fork()
    if pid == 0:
        code = 97
        try:
            code = fn()
        except BaseException:
            traceback.print_exc()
            code = 98
        finally:
            os._exit(code)
    deadline = time.monotonic() + bound_s
    while True:
        done, st = os.waitpid(pid, os.WNOHANG)
        if done:
            return st
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            pytest.fail("the forked child did not exit within %.0f s (hung)" % bound_s)
        time.sleep(0.01)

"""The ctypes/numpy mirrors of the C structs (umbp/_ffi.py) and the error
codes agree with include/umbp/*.h, as the C compiler lays them out."""
import os
import shutil
import subprocess

import pytest

import umbp
from umbp import _ffi, _lib

HERE = os.path.dirname(os.path.abspath(__file__))
INCLUDE = os.path.join(os.path.dirname(os.path.dirname(HERE)), "include")


@pytest.fixture(scope="module")
def c_layout(tmp_path_factory):
    cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if not cc:
        pytest.skip("no C compiler (cc) to check struct layouts against the headers")
    exe = str(tmp_path_factory.mktemp("ffi") / "ffi_layout")
    subprocess.run([cc, "-std=c11", "-I", INCLUDE, os.path.join(HERE, "ffi_layout.c"), "-o", exe],
                   check=True)
    structs, fields, consts = {}, {}, {}
    for line in subprocess.run([exe], check=True, capture_output=True, text=True).stdout.split("\n"):
        parts = line.split()
        if not parts:
            continue
        if parts[0] == "struct":
            structs[parts[1]] = int(parts[2])
        elif parts[0] == "field":
            fields.setdefault(parts[1], {})[parts[2]] = int(parts[3])
        elif parts[0] == "const":
            consts[parts[1]] = int(parts[2])
    return structs, fields, consts


def test_struct_sizes_and_offsets(c_layout):
    structs, fields, _ = c_layout
    mine = _ffi.layouts()
    assert set(mine) == set(structs)
    for name, (size, offs) in mine.items():
        assert size == structs[name], name
        assert offs == fields[name], name


def test_constants_and_error_codes(c_layout):
    _, _, consts = c_layout
    assert consts["UMBP_KEY_SIZE"] == umbp.KEY_SIZE == _ffi.KEY_SIZE
    assert consts["UMBP_NS_SIZE"] == umbp.NS_SIZE
    assert consts["UMBP_NS_HEX_SIZE"] == _ffi.NS_HEX_SIZE
    assert consts["UMBP_BLOCK_HASH_MAX"] == _ffi.BLOCK_HASH_MAX
    assert consts["UMBP_KV_MAX_DIMS"] == _ffi.KV_MAX_DIMS
    assert consts["UMBP_EVENT_STORED"] == umbp.EVENT_STORED
    assert consts["UMBP_EVENT_REMOVED"] == umbp.EVENT_REMOVED
    from umbp import modes
    assert consts["UMBP_MODE_SHARED_POOL"] == modes.SHARED_POOL
    assert consts["UMBP_MODE_SESSIONS"] == modes.SESSIONS
    assert consts["UMBP_MODE_SHARED_LOOKUP"] == modes.SHARED_LOOKUP
    c_errors = {k[len("UMBP_"):]: v for k, v in consts.items() if k.startswith("UMBP_E_")}
    assert c_errors == umbp.ERRORS
    for name, v in umbp.ERRORS.items():
        assert getattr(umbp, name) == v


def test_every_error_has_a_message():
    for v in umbp.ERRORS.values():
        assert umbp.strerror(v) and umbp.strerror(v) != umbp.strerror(-999999)


def test_every_declared_function_is_exported():
    for name in _lib._FUNCS:
        assert _lib.has(name), name

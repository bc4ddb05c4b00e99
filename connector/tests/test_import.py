"""`import umbp` needs numpy and the library, not torch: a scheduler process
(lookups only) must not pay for importing torch, nor need it installed."""
import os
import re
import shutil
import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent("""
    import sys
    sys.modules["torch"] = None        # any `import torch` now raises ImportError
    import numpy as np
    import umbp
    assert "torch" not in sys.modules or sys.modules["torch"] is None
    ns = umbp.Namespace.derive("m", "", 16, "NHD", "bfloat16")
    keys = umbp.derive_keys(ns, (0, 0, 0, 0), 0, np.zeros((4, 32), dtype=np.uint8) + np.arange(4, dtype=np.uint8)[:, None])
    with umbp.Runtime({"capacity_bytes": "8MiB", "gpu_backend": "host"}) as rt:
        buf = np.arange(256, dtype=np.uint8)
        job = rt.put(keys[:2], [buf.ctypes.data] * 2, 256)
        assert job.wait(10000) and job.ok.all()
        prefix, present = rt.lookup(keys)
        assert prefix == 2 and present.tolist() == [True, True, False, False]
        if umbp.has_lookup_service():  # the scheduler's path: serve, then ask
            import tempfile
            d = tempfile.mkdtemp()
            opts = {"mode": "embedded", "namespace": ns.hex, "num_ranks": 1, "lookup_dir": d}
            with umbp.LookupClient(opts) as cl:
                prefix, _, rc = cl.query_ex(keys[None])
                assert prefix == 0 and rc < 0  # nobody serves yet: misses, with the code
                rt.serve_lookups(ns, 0, 0, lookup_dir=d)
                deadline = 50
                while cl.query(keys[None]) != 2 and deadline:  # past the redial backoff
                    import time; time.sleep(0.05); deadline -= 1
                assert cl.query(keys[None]) == 2
        # torch-only paths fail cleanly instead of at import
        try:
            rt.register_kv_caches({"l0": np.zeros((2, 4, 16, 2, 8))})
        except TypeError as e:
            assert "not a tensor" in str(e)
        else:
            raise AssertionError("a numpy array was accepted as a KV tensor")
    print("ok", umbp.library_path)
""")


def test_import_and_lookups_without_torch():
    r = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("ok ")


def test_import_error_names_every_path_tried(tmp_path):
    code = ("import os, umbp._lib as L\n"
            "os.environ['UMBP_LIBRARY'] = %r; os.environ['UMBP_BUILD_DIR'] = %r\n"
            "L._REPO_DIR = '/nonexistent'\n" % (str(tmp_path / "nope.so"), str(tmp_path)))
    # run _load() again with nothing findable
    code += ("import ctypes.util; ctypes.util.find_library = lambda n: None\n"
             "try:\n    L._load()\nexcept ImportError as e:\n    print(e)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    msg = r.stdout
    assert "nope.so (absent)" in msg and str(tmp_path / "libumbp.so") in msg
    assert "/nonexistent/build/libumbp.so" in msg and "find_library" in msg
    assert "UMBP_LIBRARY" in msg


# ---- a host without the libraries libumbp.so links --------------------------

LOAD_AGAIN = ("import os, ctypes.util, umbp._lib as L, umbp._deps as D\n"
              "os.environ['UMBP_LIBRARY'] = %r\n"
              "os.environ.pop('UMBP_BUILD_DIR', None); L._REPO_DIR = '/nonexistent'\n"
              "L._PKG_DIR = '/nonexistent'; ctypes.util.find_library = lambda n: None\n"
              "D.RUNTIME_PACKAGES['libumbp_test_dep.so.1'] = 'libumbp-test-dep1'\n"
              "try:\n    L._load()\nexcept ImportError as e:\n    print(e)\n"
              "else:\n    print('LOADED')\n")


def _cc(tmp_path, *args):
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler to build the test's libraries")
    subprocess.run([cc, *args], cwd=tmp_path, check=True, capture_output=True)


def _lib_linking_a_dep(tmp_path, versioned):
    """libumbp.so in tmp_path/lib, linking libumbp_test_dep.so.1 (its symbol
    at version UMBP_TEST_9 when versioned); returns its path."""
    (tmp_path / "dep.c").write_text("int umbp_test_dep(void) { return 7; }\n")
    (tmp_path / "dep.map").write_text("UMBP_TEST_9 { global: umbp_test_dep; local: *; };\n")
    (tmp_path / "main.c").write_text("int umbp_test_dep(void);\n"
                                     "int umbp_test_main(void) { return umbp_test_dep(); }\n")
    (tmp_path / "lib").mkdir()
    _cc(tmp_path, "-shared", "-fPIC", "-o", "libumbp_test_dep.so.1", "dep.c",
        "-Wl,-soname,libumbp_test_dep.so.1", *(["-Wl,--version-script=dep.map"] if versioned else []))
    _cc(tmp_path, "-shared", "-fPIC", "-o", "lib/libumbp.so", "main.c",
        "./libumbp_test_dep.so.1", "-Wl,-rpath,$ORIGIN/..")
    return tmp_path / "lib" / "libumbp.so"


def _load_again(path):
    r = subprocess.run([sys.executable, "-c", LOAD_AGAIN % str(path)], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_a_missing_library_it_links_is_named_with_its_package(tmp_path):
    lib = _lib_linking_a_dep(tmp_path, versioned=False)
    assert _load_again(lib).strip() == "LOADED"  # the rig: it loads while the dependency is there
    (tmp_path / "libumbp_test_dep.so.1").unlink()
    msg = _load_again(lib)
    assert msg.startswith("umbp: libumbp.so was found but cannot load: it needs "
                          "libumbp_test_dep.so.1 (Debian/Ubuntu package libumbp-test-dep1), which "
                          "this host lacks"), msg
    assert "docs/operations.md" in msg and str(lib) in msg
    assert "Set UMBP_LIBRARY" not in msg  # the library was found: that is not the fix


def test_a_library_built_against_newer_ones_says_so(tmp_path):
    lib = _lib_linking_a_dep(tmp_path, versioned=True)
    assert _load_again(lib).strip() == "LOADED"
    # the same library with an older version only (as a host's older libc
    # lacks GLIBC_2.38; a library with no versions at all trips an assertion
    # in ld.so instead)
    (tmp_path / "dep.map").write_text("UMBP_TEST_8 { global: umbp_test_dep; local: *; };\n")
    _cc(tmp_path, "-shared", "-fPIC", "-o", "libumbp_test_dep.so.1", "dep.c",
        "-Wl,-soname,libumbp_test_dep.so.1", "-Wl,--version-script=dep.map")
    msg = _load_again(lib)
    assert "was found but cannot load: it was built against UMBP_TEST_9, newer than this " \
           "host's libraries" in msg, msg


def _needed(binary):
    out = subprocess.run(["readelf", "-d", binary], capture_output=True, text=True, check=True).stdout
    return re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", out)


def test_every_library_the_binaries_link_has_its_package():
    """A dependency added to the build without its package in umbp/_deps.py
    (and so in the ImportError and docs/operations.md) fails here."""
    import umbp
    from umbp import _deps
    if shutil.which("readelf") is None:
        pytest.skip("no readelf (binutils)")
    build = os.path.dirname(os.path.realpath(umbp.library_path))
    bins = [umbp.library_path] + [os.path.join(build, p) for p in
                                  ("server/umbp-server", "server/umbp", "master/umbp-master")]
    bins = [b for b in bins if os.path.exists(b)]
    seen = {}
    for b in bins:
        for so in _needed(b):
            seen.setdefault(so, b)
    assert "libev.so.4" in seen, seen  # the rig: readelf was read
    unknown = {so: b for so, b in seen.items()
               if so not in _deps.RUNTIME_PACKAGES and so not in _deps.BASE_LIBRARIES}
    assert not unknown, "add these to connector/umbp/_deps.py and docs/operations.md: %s" % unknown


def test_operations_doc_lists_every_runtime_package():
    from umbp import _deps
    doc = open(os.path.join(os.path.dirname(__file__), "..", "..", "docs", "operations.md")).read()
    table = doc[doc.index("### Runtime libraries"):]
    for so, pkg in _deps.RUNTIME_PACKAGES.items():
        assert "`%s`" % so in table and "`%s`" % pkg in table, (so, pkg)

"""`import umbp` needs numpy and the library, not torch: a scheduler process
(lookups only) must not pay for importing torch, nor need it installed."""
import subprocess
import sys
import textwrap

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

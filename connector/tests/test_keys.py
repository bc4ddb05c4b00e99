"""Namespaces and keys: the library (umbp.Namespace, umbp.derive_keys) and
the pure-Python reference (umbp.keys.*_py, hashlib.blake2b) agree on random
inputs, reproduce the digests pinned in tests/unit/test_keys.c, and refuse
bad inputs naming the field."""
import random

import numpy as np
import pytest

import umbp
from umbp import keys as K

GROUPS = [("full", 16, 32, "bfloat16"), ("sliding_window", 16, 8, "bfloat16")]


def llama(**kw):
    d = dict(model="meta-llama/Llama-3.1-8B", revision="main", block_size=16, layout="NHD",
             dtype="bfloat16", groups=GROUPS, tp=2, pp=1, pcp=1, dcp=1)
    d.update(kw)
    return d


def test_pinned_digests_of_test_keys_c():
    ns = umbp.Namespace.derive(**llama())
    assert ns.hex == "5a4d86d4aef73eaf6ea9ddcb8783c253"
    assert K.namespace_py(**llama()).hex() == ns.hex
    assert umbp.Namespace.from_string("my-fleet").hex == "a6417803cd0742644acc464bb3b8a3b3"
    assert K.namespace_from_string_py("my-fleet").hex() == "a6417803cd0742644acc464bb3b8a3b3"
    h = bytes(range(32))
    want = "3ed630bc974494226f4c02af0c660fbb7e48921415fe4a0b9d3856639abf3ae6"
    assert umbp.derive_keys(ns, (1, 0, 0, 0), 1, [h])[0].tobytes().hex() == want
    assert K.derive_key_py(ns, (1, 0, 0, 0), 1, h).hex() == want
    h = b"\xab" * 16
    want = "2a12d513c5db67155da762cde01a1518ae151870e4fe5e0d3759907f786ccede"
    assert umbp.derive_keys(ns, (0, 0, 0, 0), 0, [h])[0].tobytes().hex() == want
    assert K.derive_key_py(ns.bytes, (0, 0, 0, 0), 0, h).hex() == want


def _rand_str(rng, may_be_empty=False):
    alphabet = "abcXYZ019-_/.é漢"
    n = rng.randint(0 if may_be_empty else 1, 40)
    return "".join(rng.choice(alphabet) for _ in range(n))


def test_namespaces_c_equals_python_on_random_inputs():
    rng = random.Random(1234)
    for _ in range(300):
        groups = [(_rand_str(rng), rng.randint(1, 1 << 20), rng.randint(1, 200), _rand_str(rng))
                  for _ in range(rng.randint(0, 5))]
        d = dict(model=_rand_str(rng), revision=_rand_str(rng, True) if rng.random() < .8 else None,
                 block_size=rng.randint(1, 1 << 31), layout=_rand_str(rng), dtype=_rand_str(rng),
                 groups=groups, tp=rng.randint(1, 64), pp=rng.randint(1, 8), pcp=rng.randint(1, 4),
                 dcp=rng.randint(1, 4))
        assert umbp.Namespace.derive(**d).bytes == K.namespace_py(**d), d
        s = _rand_str(rng)
        assert umbp.Namespace.from_string(s).bytes == K.namespace_from_string_py(s)


def test_keys_c_equals_python_on_random_inputs():
    rng = np.random.default_rng(99)
    for it in range(200):
        ns = umbp.Namespace(rng.integers(0, 256, 16, dtype=np.uint8).tobytes())
        rank = tuple(int(x) for x in rng.integers(0, 1 << 32, 4, dtype=np.uint64))
        group = int(rng.integers(0, 1 << 32, dtype=np.uint64))
        hl = int(rng.integers(1, 65))
        n = int(rng.integers(1, 20))
        hashes = rng.integers(0, 256, (n, hl), dtype=np.uint8)
        got = umbp.derive_keys(ns, rank, group, hashes)
        assert got.shape == (n, 32) and got.dtype == np.uint8 and got.flags.c_contiguous
        for i in range(n):
            assert got[i].tobytes() == K.derive_key_py(ns, rank, group, hashes[i].tobytes())
        # the other accepted forms of the hashes give the same keys
        as_list = [hashes[i].tobytes() for i in range(n)]
        assert np.array_equal(umbp.derive_keys(ns, rank, group, as_list), got)
        assert np.array_equal(umbp.derive_keys(ns, rank, group, b"".join(as_list), hash_len=hl), got)
        assert np.array_equal(umbp.derive_keys(ns, rank, group, hashes.ravel(), hash_len=hl), got)


def test_a_large_batch_is_one_call_and_distinct():
    ns = umbp.Namespace.derive(**llama())
    hashes = np.random.default_rng(5).integers(0, 256, (5000, 32), dtype=np.uint8)
    ks = umbp.derive_keys(ns, (1, 0, 0, 0), 3, hashes)
    assert len({k.tobytes() for k in ks}) == 5000
    assert ks[4321].tobytes() == K.derive_key_py(ns, (1, 0, 0, 0), 3, hashes[4321].tobytes())


def test_every_input_changes_the_key():
    ns = umbp.Namespace.derive(**llama())
    h = [bytes(32)]
    k0 = umbp.derive_keys(ns, (0, 0, 0, 0), 0, h)[0].tobytes()
    others = [umbp.derive_keys(ns, r, 0, h)[0].tobytes()
              for r in ((1, 0, 0, 0), (0, 1, 0, 0), (0, 0, 1, 0), (0, 0, 0, 1))]
    others.append(umbp.derive_keys(ns, (0, 0, 0, 0), 1, h)[0].tobytes())
    others.append(umbp.derive_keys(umbp.Namespace.derive(**llama(tp=4)), (0, 0, 0, 0), 0, h)[0]
                  .tobytes())
    others.append(umbp.derive_keys(ns, (0, 0, 0, 0), 0, [bytes(31)])[0].tobytes())
    assert k0 not in others and len(set(others)) == len(others)


def test_namespace_hex_round_trip_and_equality():
    ns = umbp.Namespace.derive(**llama())
    assert umbp.Namespace.from_hex(ns.hex) == ns
    assert umbp.Namespace.from_hex(ns.hex.upper()) == ns
    assert len(ns.bytes) == 16 and len(ns.hex) == 32
    assert hash(umbp.Namespace(ns.bytes)) == hash(ns)


@pytest.mark.parametrize("change, field", [
    (dict(model=""), "model"), (dict(model=None), "model"), (dict(block_size=0), "block_size"),
    (dict(layout=""), "layout"), (dict(dtype=""), "dtype"), (dict(tp=0), "tp"), (dict(pp=0), "pp"),
    (dict(pcp=0), "pcp"), (dict(dcp=0), "dcp"), (dict(groups=[GROUPS[0]] * 65), "num_groups"),
    (dict(groups=[("", 16, 1, "bf16")]), "groups[].kind"),
    (dict(groups=[("full", 0, 1, "bf16")]), "groups[].block_size"),
    (dict(groups=[("full", 16, 0, "bf16")]), "groups[].num_layers"),
    (dict(model="x" * 4097), "model"), (dict(model="a\0b"), "model"),
])
def test_bad_namespace_descriptions_name_the_field(change, field):
    for f in (umbp.Namespace.derive, K.namespace_py):
        with pytest.raises(umbp.UmbpError) as ei:
            f(**llama(**change))
        assert field in str(ei.value) and ei.value.code == -22


def test_bad_key_inputs_raise():
    ns = umbp.Namespace.derive(**llama())
    with pytest.raises(umbp.UmbpError, match="hash_len"):
        umbp.derive_keys(ns, (0, 0, 0, 0), 0, [b""])
    with pytest.raises(umbp.UmbpError, match="hash_len"):
        umbp.derive_keys(ns, (0, 0, 0, 0), 0, [bytes(65)])
    with pytest.raises(umbp.UmbpError, match="same length"):
        umbp.derive_keys(ns, (0, 0, 0, 0), 0, [bytes(32), bytes(31)])
    with pytest.raises(umbp.UmbpError, match="hash_len"):
        umbp.derive_keys(ns, (0, 0, 0, 0), 0, bytes(64))  # one bytes object needs hash_len=
    with pytest.raises(umbp.UmbpError, match="multiple"):
        umbp.derive_keys(ns, (0, 0, 0, 0), 0, bytes(65), hash_len=32)
    with pytest.raises(umbp.UmbpError, match="rank"):
        umbp.derive_keys(ns, (0, 0, 0), 0, [bytes(32)])
    with pytest.raises(umbp.UmbpError):
        umbp.derive_keys(ns, (-1, 0, 0, 0), 0, [bytes(32)])
    with pytest.raises(TypeError):
        umbp.derive_keys(ns, (0, 0, 0, 0), 0, np.zeros((2, 32), dtype=np.int64))
    with pytest.raises(TypeError):
        umbp.derive_keys(ns, (0, 0, 0, 0), 0, ["abc"])
    with pytest.raises(umbp.UmbpError):
        K.derive_key_py(ns, (0, 0, 0, 0), 0, b"")
    with pytest.raises(umbp.UmbpError):
        umbp.Namespace(b"short")
    for bad in ("abc", "zz4d86d4aef73eaf6ea9ddcb8783c253", ""):
        with pytest.raises(umbp.UmbpError):
            umbp.Namespace.from_hex(bad)
    with pytest.raises(umbp.UmbpError):
        umbp.Namespace.from_string("")
    assert umbp.derive_keys(ns, (0, 0, 0, 0), 0, []).shape == (0, 32)

"""One table of mode properties (UMBP_MODES, common/options.h), read through
umbp.mode_properties: the rows, C's message for a name that is not a mode,
and no connector code that compares mode names (a new mode is one C row)."""
import os
import re

import pytest

import umbp
from conftest import CONNECTOR


def test_rows_of_the_mode_table():
    e = umbp.mode_properties("embedded")
    assert (e.shared_pool, e.sessions, e.shared_lookup) == (False, False, False)
    s = umbp.mode_properties("standalone")
    assert (s.shared_pool, s.sessions, s.shared_lookup) == (True, True, True)
    with pytest.raises(umbp.UmbpError) as ei:
        umbp.mode_properties("cluster")
    assert "cluster" in str(ei.value) and "embedded standalone distributed" in str(ei.value)


def test_sglang_refuses_a_mode_with_cs_message():
    from umbp.sglang.config import UMBPStoreConfigError, parse

    with pytest.raises(UMBPStoreConfigError, match="must be one of embedded standalone"):
        parse({"mode": "cluster"})
    assert parse({"mode": "standalone"}).props.shared_pool


MODE_NAME = re.compile(r"""(==|!=|\bin\b)\s*\(?\s*["'](embedded|standalone|distributed)["']"""
                       r"""|["'](embedded|standalone|distributed)["']\s*(==|!=)""")


def test_connectors_branch_on_properties_not_mode_names():
    offenders = []
    for sub in ("vllm", "sglang"):
        d = os.path.join(CONNECTOR, "umbp", sub)
        for name in sorted(os.listdir(d)):
            if name.endswith(".py"):
                for i, line in enumerate(open(os.path.join(d, name)), 1):
                    if MODE_NAME.search(line):
                        offenders.append(f"umbp/{sub}/{name}:{i}: {line.strip()}")
    assert not offenders, "compare properties (umbp.mode_properties), not mode names:\n" + \
        "\n".join(offenders)

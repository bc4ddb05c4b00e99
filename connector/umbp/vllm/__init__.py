"""umbp.vllm: the vLLM v1 KV connector of umbp.

Load it in vLLM with::

    --kv-transfer-config '{"kv_connector": "UMBPConnector",
                           "kv_connector_module_path": "umbp.vllm.connector",
                           "kv_role": "kv_both",
                           "kv_connector_extra_config": {"capacity_bytes": "64GiB"}}'

This package itself imports nothing from vLLM: ``import umbp`` and
``import umbp.vllm`` work without vLLM installed.  Only
``umbp.vllm.connector`` (and ``umbp.vllm.metadata``) import vLLM's base
classes; they run inside vLLM or the test harness.  ``umbp.vllm.options``
(option parsing and validation) is usable on its own, e.g. to check a config.
"""

__all__ = ["CONNECTOR_NAME", "MODULE_PATH"]

CONNECTOR_NAME = "UMBPConnector"
MODULE_PATH = "umbp.vllm.connector"


def __getattr__(name):  # lazy: UMBPConnector needs vLLM
    if name == "UMBPConnector":
        from .connector import UMBPConnector

        return UMBPConnector
    raise AttributeError(name)

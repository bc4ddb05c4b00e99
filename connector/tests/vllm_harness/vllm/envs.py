"""Fake vllm/envs.py: the one variable the connector reads.  As in vLLM, a
variable is read from the environment when it is asked for (module
__getattr__), so a process that sets it before asking sees it."""
import os


def __getattr__(name):
    if name == "VLLM_USE_V2_MODEL_RUNNER":  # selects vLLM's V2 model runner (vllm/v1/worker/gpu/)
        return bool(int(os.getenv("VLLM_USE_V2_MODEL_RUNNER", "0")))
    raise AttributeError(name)

"""Fake vllm/envs.py: the one variable the connector reads.  As in vLLM, a
variable is read from the environment when it is asked for (module
__getattr__), so a process that sets it before asking sees it.

VLLM_USE_V2_MODEL_RUNNER per version: where VllmConfig has the
use_v2_model_runner property (FAKE_VLLM_API=00f4240e, vllm/config/vllm.py at
000fc94b754f) the variable is tri-state, None when unset ("if unset, use
config defaults"); before that it was a bool, False when unset."""
import os

import vllm


def __getattr__(name):
    if name == "VLLM_USE_V2_MODEL_RUNNER":  # selects vLLM's V2 model runner (vllm/v1/worker/gpu/)
        v = os.getenv("VLLM_USE_V2_MODEL_RUNNER")
        if v is None:
            return None if vllm.API == "00f4240e" else False
        return bool(int(v))
    raise AttributeError(name)

"""Fake vllm/forward_context.py."""
from dataclasses import dataclass, field


@dataclass
class ForwardContext:
    no_compile_layers: dict = field(default_factory=dict)
    attn_metadata: dict = field(default_factory=dict)
    slot_mapping: dict = field(default_factory=dict)

"""umbp as SGLang's HiCache L3 storage backend.

``umbp.sglang.hicache.UMBPStore`` is loaded by SGLang's ``dynamic`` storage
backend (docs/sglang.md); nothing here imports SGLang unless it is installed.
"""
from .config import UMBPStoreConfigError
from .hicache import UMBPStore
from .layout import LayoutError, PageLayout

__all__ = ["UMBPStore", "UMBPStoreConfigError", "LayoutError", "PageLayout"]

"""The backend's options: SGLang's ``--hicache-storage-backend-extra-config``.

Every rank of an engine builds its backend from the same JSON object.  Its
keys fall in three groups:

1. keys SGLang itself reads (``backend_name``, ``module_path``, ``class_name``,
   ``interface_v1``, the prefetch knobs ...): accepted and ignored here;
2. this backend's own keys (``BACKEND_OPTIONS`` below), checked here;
3. everything else is a umbp runtime option (docs/configuration.md:
   ``capacity_bytes``, ``socket_dir``, ``dram_use_hugepages`` ...), passed to
   ``umbp.Runtime``, which refuses an unknown name or a bad value with a
   message naming it.

``rank`` and ``world_size`` are computed from SGLang's ranks and may not be
given.  Errors raise UMBPStoreConfigError (a ValueError) naming the key, the
accepted values and the value given.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from ..modes import ModeProperties, mode_properties
from .._lib import UmbpError

# Keys of the extra config that SGLang reads (sglang/srt/mem_cache/storage/
# backend_factory.py, managers/cache_controller.py, mem_cache/hiradix_cache.py
# at the commit in docs/sglang.md).  They are not umbp options.
SGLANG_KEYS = frozenset({
    "backend_name", "module_path", "class_name", "interface_v1",
    "prefetch_threshold", "prefetch_timeout_base", "prefetch_timeout_per_ki_token",
    "prefetch_timeout_max", "hicache_storage_pass_prefix_keys",
})

# name: (default, what it is) -- docs/sglang.md repeats this table
BACKEND_OPTIONS = {
    "mode": ("embedded", "embedded (a private pool in each rank's process), standalone "
                         "(attach to the host's umbp-server) or distributed (each rank a node "
                         "of umbp-master's cluster: master_address, secret_file)"),
    "key_namespace": (None, "non-empty string replacing the derived key namespace (model, "
                            "revision, page size, layout, dtype, parallel sizes); objects are "
                            "shared by every engine that uses the same string"),
    "model_revision": ("", "model revision mixed into the derived namespace"),
    "dp_rank": (0, "standalone: which server socket (umbp-dp<dp_rank>.sock) to attach to: an "
                   "integer, or \"auto\" for SGLang's attention-DP rank (one server per DP rank)"),
    "clear_shared_pool": (True, "standalone: clear() clears the server's whole pool, every "
                                "engine's objects (true), or only logs a warning (false)"),
    "passthrough_keys": ([], "extra keys to ignore (for SGLang keys newer than this backend)"),
}

COMPUTED = {
    "rank": "computed from SGLang's tp/pp/attention-cp ranks",
    "world_size": "computed from SGLang's tp/pp/attention-cp sizes",
}


class UMBPStoreConfigError(ValueError):
    """A bad extra-config key or value; the message names it."""


@dataclass
class BackendConfig:
    mode: str = "embedded"
    key_namespace: Optional[str] = None
    model_revision: str = ""
    dp_rank: Any = 0  # int or "auto"
    clear_shared_pool: bool = True
    passthrough_keys: List[str] = field(default_factory=list)
    runtime_options: Dict[str, Any] = field(default_factory=dict)
    interface_v1: bool = False
    #: the mode's row of the C mode table (umbp.mode_properties)
    props: ModeProperties = field(default_factory=lambda: mode_properties("embedded"))

    def runtime_config(self, rank: int, world_size: int, dp_rank: int) -> Dict[str, Any]:
        """The dict given to umbp.Runtime for one rank."""
        opts = dict(self.runtime_options)
        opts["mode"] = self.mode
        opts["rank"] = rank
        opts["world_size"] = world_size
        if self.props.sessions:  # dp_rank names the server's socket
            opts["dp_rank"] = dp_rank if self.dp_rank == "auto" else self.dp_rank
        return opts


def _bad(key: str, accepted: str, value: Any) -> UMBPStoreConfigError:
    return UMBPStoreConfigError(
        f"umbp.sglang: extra_config {key!r}: must be {accepted}, got {value!r}")


def parse(extra_config: Optional[Dict[str, Any]]) -> BackendConfig:
    """Checks the backend's own keys and splits off the umbp runtime options."""
    if extra_config is None:
        extra_config = {}
    if not isinstance(extra_config, dict):
        raise UMBPStoreConfigError(
            f"umbp.sglang: extra_config must be a JSON object, got {type(extra_config).__name__}")
    cfg = BackendConfig()
    cfg.interface_v1 = bool(extra_config.get("interface_v1", 0))

    pk = extra_config.get("passthrough_keys", [])
    if not isinstance(pk, list) or not all(isinstance(k, str) for k in pk):
        raise _bad("passthrough_keys", "a list of strings", pk)
    cfg.passthrough_keys = list(pk)

    mode = extra_config.get("mode", "embedded")
    try:
        cfg.props = mode_properties(mode)
    except UmbpError as e:  # C's message names the modes there are
        raise UMBPStoreConfigError(f"umbp.sglang: extra_config 'mode': {e}") from None
    cfg.mode = mode

    if "key_namespace" in extra_config:
        ns = extra_config["key_namespace"]
        if not isinstance(ns, str) or not ns or len(ns.encode()) > 4096:
            raise _bad("key_namespace", "a non-empty string of at most 4096 bytes", ns)
        cfg.key_namespace = ns

    rev = extra_config.get("model_revision", "")
    if not isinstance(rev, str) or len(rev.encode()) > 4096:
        raise _bad("model_revision", "a string of at most 4096 bytes", rev)
    cfg.model_revision = rev

    dp = extra_config.get("dp_rank", 0)
    if not (dp == "auto" or (isinstance(dp, int) and not isinstance(dp, bool) and 0 <= dp <= 65535)):
        raise _bad("dp_rank", "an integer 0 .. 65535 or \"auto\"", dp)
    cfg.dp_rank = dp

    csp = extra_config.get("clear_shared_pool", True)
    if not isinstance(csp, bool):
        raise _bad("clear_shared_pool", "true or false", csp)
    cfg.clear_shared_pool = csp

    for key, why in COMPUTED.items():
        if key in extra_config:
            raise UMBPStoreConfigError(
                f"umbp.sglang: extra_config {key!r} may not be set: it is {why} "
                "(every rank reads the same extra_config)")

    skip = SGLANG_KEYS | set(BACKEND_OPTIONS) | set(cfg.passthrough_keys)
    cfg.runtime_options = {k: v for k, v in extra_config.items() if k not in skip}
    return cfg

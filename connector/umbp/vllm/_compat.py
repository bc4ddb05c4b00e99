"""Version-guarded imports of vLLM for the UMBP connector.

Only the three base names of ``vllm.distributed.kv_transfer.kv_connector.v1.base``
(KVConnectorBase_V1, KVConnectorMetadata, KVConnectorRole) are required; every
other vLLM name is optional and has a fallback here, because they moved or
appeared between versions (see connector.py's docstring for the versions).
"""

from __future__ import annotations

import dataclasses
import enum
import inspect
import logging
import os
import re as _re
from collections.abc import Mapping
from typing import Any

# ---- required ---------------------------------------------------------------

from vllm.distributed.kv_transfer.kv_connector.v1.base import (  # noqa: F401
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
)

from vllm.distributed.kv_transfer.kv_connector.v1 import base as _base

# ---- logger -----------------------------------------------------------------

try:
    from vllm.logger import init_logger as _init_logger

    def get_logger(name: str):
        return _init_logger(name)

except Exception:  # pragma: no cover - depends on the vLLM build

    def get_logger(name: str):
        return logging.getLogger(name)


# ---- optional base names ----------------------------------------------------

SupportsHMA = getattr(_base, "SupportsHMA", None)
HAS_SUPPORTS_HMA = SupportsHMA is not None
if SupportsHMA is None:  # vLLM before the hybrid allocator met connectors

    class SupportsHMA:  # type: ignore[no-redef]
        """Stand-in: this vLLM has no SupportsHMA mixin."""

        def request_finished_all_groups(self, request, block_ids):
            raise NotImplementedError


KVConnectorWorkerMetadata = getattr(_base, "KVConnectorWorkerMetadata", None)
HAS_WORKER_METADATA = KVConnectorWorkerMetadata is not None
if KVConnectorWorkerMetadata is None:  # absent in base.py@13f4ad0f

    class KVConnectorWorkerMetadata:  # type: ignore[no-redef]
        """Stand-in: this vLLM carries no worker->scheduler metadata."""

        def aggregate(self, other):
            raise NotImplementedError


KVConnectorTransferResults = getattr(_base, "KVConnectorTransferResults", None)
HAS_TRANSFER_RESULTS = KVConnectorTransferResults is not None and hasattr(
    KVConnectorBase_V1, "get_transfer_results"
)

# ---- failed_recving: a set of request ids, or a mapping of failures ------------
#
# base.py@003df296 and the outputs of its period: ``failed_recving: set[str]``.
# Newer vLLM-derived trees carry ``dict[str, KVTransferFailure]`` (vllm.v1.outputs:
# KVTransferFailure(reason: KVTransferFailureReason, invalid_block_ids: frozenset)).
# The shape is read from the class the engine gives us, at call time.


def _field_is_mapping(cls, name: str) -> bool:
    import dataclasses

    for f in dataclasses.fields(cls) if dataclasses.is_dataclass(cls) else ():
        if f.name != name:
            continue
        if f.default_factory is not dataclasses.MISSING:
            try:
                return isinstance(f.default_factory(), Mapping)
            except Exception:
                pass
        t = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", str(f.type))
        return str(t).lstrip().lower().startswith(("dict", "mapping"))
    return False


def failed_recving_is_mapping(cls=None) -> bool:
    """True where the engine's KVConnectorTransferResults wants a mapping."""
    cls = KVConnectorTransferResults if cls is None else cls
    return cls is not None and _field_is_mapping(cls, "failed_recving")


def failed_recving_ids(value) -> set:
    """The request ids of a failed_recving of either shape (None: none)."""
    if not value:
        return set()
    if isinstance(value, Mapping):
        return set(value.keys())
    return set(value)


def failed_recving_blocks(value) -> set:
    """Block ids a mapping's failures name (``invalid_block_ids``); a set names none."""
    out: set = set()
    if isinstance(value, Mapping):
        for f in value.values():
            out.update(getattr(f, "invalid_block_ids", None) or ())
    return out


def make_failed_recving(req_ids, cls=None):
    """failed_recving in the shape the engine's results class declares: a set,
    or {req_id: KVTransferFailure(reason TRANSFER, no block ids)} -- umbp reports
    the failed blocks through get_block_ids_with_load_errors, as before."""
    ids = set(req_ids or ())
    if not failed_recving_is_mapping(cls):
        return ids
    failure = None
    try:
        from vllm.v1 import outputs as _outputs

        ftype = getattr(_outputs, "KVTransferFailure", None)
        rtype = getattr(_outputs, "KVTransferFailureReason", None)
        if ftype is not None and rtype is not None:
            reason = getattr(rtype, "TRANSFER", None) or next(iter(rtype))
            failure = ftype(reason=reason, invalid_block_ids=frozenset())
    except Exception:
        failure = None
    return {rid: failure for rid in ids}


# ---- KVConnectorTransferResults: every field the engine's class declares ------
#
# base.py@7ba3df63 (third-party walk): finished_sending, finished_recving,
# failed_recving.  The mixin @00f4240e also reads prefix_replay_checkpoints:
# the (req_id -> checkpoint) a load certified for a sliding-window group's
# bounded replay.  umbp certifies none (and defines no
# can_load_prefix_replay_checkpoint): the engine replays the window, which is
# always correct.  A field umbp does not know and the class gives no default
# is refused when the connector is created, naming it.

_KNOWN_RESULT_FIELDS = ("finished_sending", "finished_recving", "failed_recving")
_EMPTY_RESULT_FIELDS = {"prefix_replay_checkpoints"}


def _empty_of(f):
    t = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", str(f.type))
    t = str(t).lstrip().lower()
    if t.startswith(("dict", "mapping")):
        return {}
    if t.startswith(("set", "frozenset")):
        return set()
    if t.startswith(("list", "tuple", "sequence")):
        return []
    return None


def transfer_results_extra(cls=None) -> dict:
    """The empty values umbp passes for the fields of the engine's
    KVConnectorTransferResults beyond the three it fills.  Raises TypeError
    naming a required field it cannot fill."""
    cls = KVConnectorTransferResults if cls is None else cls
    if cls is None or not dataclasses.is_dataclass(cls):
        return {}
    out = {}
    for f in dataclasses.fields(cls):
        if f.name in _KNOWN_RESULT_FIELDS or not f.init:
            continue
        required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        if f.name in _EMPTY_RESULT_FIELDS:
            out[f.name] = _empty_of(f) if required else (
                f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default)
        elif required:
            raise TypeError(f"umbp: this vLLM's KVConnectorTransferResults has a required field {f.name!r} "
                            f"that umbp does not know how to fill; use a vLLM whose transfer results umbp "
                            f"supports (docs/vllm.md, \"Which vLLM\")")
    return out


# ---- stats and metrics ------------------------------------------------------

KVConnectorStats = None
KVConnectorPromMetrics = None
try:
    from vllm.distributed.kv_transfer.kv_connector.v1 import metrics as _metrics

    KVConnectorStats = getattr(_metrics, "KVConnectorStats", None)
    KVConnectorPromMetrics = getattr(_metrics, "KVConnectorPromMetrics", None)
except Exception:
    _metrics = None

HAS_STATS = KVConnectorStats is not None
if KVConnectorStats is None:

    @dataclasses.dataclass
    class KVConnectorStats:  # type: ignore[no-redef]
        """Stand-in with the interface of vLLM's KVConnectorStats."""

        data: dict = dataclasses.field(default_factory=dict)

# ---- KV events --------------------------------------------------------------

BlockStored = None
BlockRemoved = None
KVConnectorKVEvents = None
try:
    from vllm.distributed import kv_events as _kv_events

    BlockStored = getattr(_kv_events, "BlockStored", None)
    BlockRemoved = getattr(_kv_events, "BlockRemoved", None)
    KVConnectorKVEvents = getattr(_kv_events, "KVConnectorKVEvents", None)
except Exception:
    _kv_events = None

HAS_VLLM_EVENTS = BlockStored is not None and BlockRemoved is not None
if BlockStored is None or BlockRemoved is None:

    @dataclasses.dataclass
    class BlockStored:  # type: ignore[no-redef]
        """Stand-in for vllm.distributed.kv_events.BlockStored."""

        block_hashes: list
        parent_block_hash: Any
        token_ids: list
        block_size: int
        lora_id: Any = None
        medium: Any = None

    @dataclasses.dataclass
    class BlockRemoved:  # type: ignore[no-redef]
        """Stand-in for vllm.distributed.kv_events.BlockRemoved."""

        block_hashes: list
        medium: Any = None


HAS_KV_EVENTS_CLASS = KVConnectorKVEvents is not None
if KVConnectorKVEvents is None:

    class KVConnectorKVEvents:  # type: ignore[no-redef]
        """Stand-in: this vLLM has no worker KV-event container."""


def _accepted_params(cls) -> set[str] | None:
    """Field names a class's constructor accepts (None: anything)."""
    try:
        if dataclasses.is_dataclass(cls):
            return {f.name for f in dataclasses.fields(cls) if f.init}
        params = inspect.signature(cls).parameters
    except (TypeError, ValueError):
        return None
    if any(p.kind is p.VAR_KEYWORD for p in params.values()):
        return None
    return set(params)


_STORED_PARAMS = _accepted_params(BlockStored)
_REMOVED_PARAMS = _accepted_params(BlockRemoved)
#: whether this vLLM's events name the KV cache group (newer HMA-aware events)
EVENTS_HAVE_GROUP = _STORED_PARAMS is None or "group_idx" in (_STORED_PARAMS or ())


def _filtered(params: set[str] | None, kw: dict) -> dict:
    if params is None:
        return kw
    return {k: v for k, v in kw.items() if k in params}


# Newer vLLMs describe each KV cache group in BlockStored
# (kv_cache_spec_kind, kv_cache_spec_sliding_window) with two functions of
# vllm/v1/kv_cache_interface.py, which vLLM's own OffloadingConnector applies
# to each group's spec; where they exist they are used as they are (no copy of
# their rules here), elsewhere the fields stay None (and older BlockStored
# classes have no such fields: make_block_stored drops them).
try:
    from vllm.v1.kv_cache_interface import get_kv_cache_spec_kind as _vllm_spec_kind
    from vllm.v1.kv_cache_interface import get_kv_cache_spec_sliding_window as _vllm_spec_window
except Exception:
    _vllm_spec_kind = _vllm_spec_window = None


_spec_failures: set = set()  # spec classes whose description failed (warned once each)


def event_group_spec(spec) -> tuple:
    """(kv_cache_spec_kind, kv_cache_spec_sliding_window) of a group's
    KVCacheSpec as this vLLM's own events name them, or (None, None)."""
    if _vllm_spec_kind is None or spec is None:
        return None, None
    try:
        kind = _vllm_spec_kind(spec)
        kind = getattr(kind, "value", kind)
        window = _vllm_spec_window(spec) if _vllm_spec_window is not None else None
        return (str(kind) if kind is not None else None), (int(window) if window is not None else None)
    except Exception as e:  # a spec this vLLM's functions do not know: no description
        name = type(spec).__name__
        if name not in _spec_failures:
            _spec_failures.add(name)
            get_logger(__name__).warning(
                "umbp: vLLM's get_kv_cache_spec_kind / get_kv_cache_spec_sliding_window "
                "failed on a %s (%s: %s); this group's BlockStored events carry no "
                "kv_cache_spec_kind or kv_cache_spec_sliding_window", name,
                type(e).__name__, e)
        return None, None


def make_block_stored(**kw):
    return BlockStored(**_filtered(_STORED_PARAMS, kw))


# vLLM's events carry maybe_convert_block_hash(hash) (kv_cache_utils.py@
# 001cabc1be16): the low 64 bits of the hash bytes, big-endian, unless
# VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0 (default 1 in vllm/envs.py).  vLLM's
# own function is used where it exists, so the CPU tier's events match the
# GPU tier's under any setting.
try:
    from vllm.v1.core.kv_cache_utils import maybe_convert_block_hash as _vllm_convert
except Exception:
    _vllm_convert = None


def _int_block_hashes() -> bool:
    try:
        import vllm.envs as _envs

        return bool(_envs.VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES)
    except Exception:
        return bool(int(os.environ.get("VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES", "1")))


def uses_v2_model_runner(vllm_config=None) -> bool:
    """Whether this vLLM process runs the V2 model runner (vllm/v1/worker/gpu/),
    as vLLM itself decides.  Its execute_model (gpu/model_runner.py at
    0036d38de46c) zeroes newly allocated blocks and applies block copies in
    update_requests, before gpu/kv_connector.py's pre_forward calls the
    connector's first hook of the step (handle_preemptions, bind).

    ``vllm_config.use_v2_model_runner`` where the config has it
    (vllm/config/vllm.py at 000fc94b754f: ``VLLM_USE_V2_MODEL_RUNNER`` when
    set, else vLLM's own default, True for the models it runs on V2 by
    default, so an unset variable does not mean the V1 runner); else
    ``vllm.envs.VLLM_USE_V2_MODEL_RUNNER`` (read by the scheduler at
    00024d314514; None when unset in vLLMs that have the property).  False
    where vLLM has neither (no V2 runner)."""
    if vllm_config is not None:
        try:
            v = getattr(vllm_config, "use_v2_model_runner", None)
        except Exception:  # a property that cannot decide on this config: the variable decides
            v = None
        if v is not None:
            return bool(v)
    try:
        import vllm.envs as envs

        return bool(getattr(envs, "VLLM_USE_V2_MODEL_RUNNER", False))
    except Exception:
        return False


def convert_block_hash(h: bytes):
    """A block hash as vLLM's KV events carry it."""
    if _vllm_convert is not None:
        return _vllm_convert(h)
    if not _int_block_hashes():
        return h
    return int.from_bytes(h, byteorder="big") & ((1 << 64) - 1)


def lora_of(request) -> tuple:
    """(lora_id, lora_name) as vLLM's block pool puts them in BlockStored:
    the request's LoRA adapter id and name, or (None, None)."""
    lr = getattr(request, "lora_request", None)
    if lr is None:
        return None, None
    lid = getattr(lr, "lora_int_id", None)
    if lid is None:
        lid = getattr(lr, "adapter_id", None)
    name = getattr(lr, "lora_name", None)
    if name is None:
        name = getattr(lr, "name", None)
    return lid, name


def make_block_removed(**kw):
    return BlockRemoved(**_filtered(_REMOVED_PARAMS, kw))


# ---- parallel ranks and layout ----------------------------------------------


def parallel_ranks() -> dict | None:
    """This worker's (tp, pp, pcp, dcp) ranks from vLLM's parallel state, or
    None when the groups are not initialised (scheduler process, tests)."""
    try:
        from vllm.distributed import parallel_state as ps
    except Exception:
        return None
    try:
        out = {"tp": ps.get_tensor_model_parallel_rank()}
        out["pp"] = ps.get_pp_group().rank_in_group
        get_pcp = getattr(ps, "get_pcp_group", None)
        out["pcp"] = get_pcp().rank_in_group if get_pcp else 0
        get_dcp = getattr(ps, "get_dcp_group", None)
        out["dcp"] = get_dcp().rank_in_group if get_dcp else 0
        return out
    except Exception:
        return None


#: vLLM's legacy layout names for the KVCacheLayout members they stand for
#: (vllm/envs.py: VLLM_KV_CACHE_LAYOUT takes either; NHD = LBNHC, HND = LBHNC).
#: The namespace keeps the legacy spelling, so keys derived before vLLM named
#: layouts by KVCacheLayout member stay valid.
_LAYOUT_ALIASES = {"LBNHC": "NHD", "LBHNC": "HND"}


def normalize_kv_cache_layout(v) -> str | None:
    """A layout as vLLM names it (a KVCacheLayout member or its name, or a
    legacy "NHD"/"HND") in the one spelling the key namespace uses; None for
    an empty value."""
    if v is None:
        return None
    name = getattr(v, "name", None) if isinstance(v, enum.Enum) else None
    s = str(name if name is not None else v).strip()
    if not s:
        return None
    if s.lower().startswith("kvcachelayout."):
        s = s.split(".", 1)[1]
    s = s.upper()
    return _LAYOUT_ALIASES.get(s, s)


def kv_cache_layout(vllm_config=None) -> str:
    """vLLM's KV cache layout as its attention backends see it, in the
    spelling of normalize_kv_cache_layout: ``cache_config.kv_cache_layout``
    (vllm/config/cache.py at 002f10e0cfa1: the KVCacheLayout member name the
    engine resolved, e.g. "LBNHC", "LBHNC"; vLLM PR #51718 removed
    get_kv_cache_layout), else the older ``get_kv_cache_layout()``, else
    VLLM_KV_CACHE_LAYOUT, else "NHD"."""
    cc = getattr(vllm_config, "cache_config", None) if vllm_config is not None else None
    v = normalize_kv_cache_layout(getattr(cc, "kv_cache_layout", None))
    if v:
        return v
    for mod in ("vllm.v1.attention.backends.utils", "vllm.attention.backends.utils"):
        try:
            m = __import__(mod, fromlist=["get_kv_cache_layout"])
            fn = getattr(m, "get_kv_cache_layout", None)
            if fn is not None:
                v = normalize_kv_cache_layout(fn())
                if v:
                    return v
        except Exception:
            continue
    return normalize_kv_cache_layout(os.environ.get("VLLM_KV_CACHE_LAYOUT")) or "NHD"


def enum_name(x) -> str:
    if isinstance(x, enum.Enum):
        return x.name
    return str(x)


# ---- what the running vLLM's scheduler can recover from ----------------------
#
# Read from the engine's own scheduler source, not guessed from a version
# number (docs/vllm.md, "Which models get hits", has the matrix):
# - scheduler.py@00024d314514 and the later SchedulerKVConnectorMixin unpack
#   ONE KV cache group's block ids in _update_requests_with_invalid_blocks
#   ("(req_block_ids,) = self.kv_cache_manager.get_block_ids(req_id)"): with
#   two or more groups, the first reported invalid block raises ValueError in
#   EngineCore;
# - 00024d31's _update_waiting_for_remote_kv does the same at the first
#   completed async load;
# - _mamba_block_aligned_split asserts "External KV connector is not verified
#   yet" (mamba_cache_mode "align").
# Where the source cannot be read, each limit is assumed present.


_ONE_GROUP_UNPACK = _re.compile(r"\(\s*\w+\s*,\s*\)\s*=\s*self\.kv_cache_manager\.get_block_ids\(")
_NO_EXTERNAL = _re.compile(r"External KV connector is not verified|assert\s+num_external_computed_tokens\s*==\s*0")


@dataclasses.dataclass(frozen=True)
class EngineLimits:
    #: a reported invalid block raises with >= 2 KV cache groups
    invalid_blocks_one_group: bool = True
    #: a completed async load raises with >= 2 KV cache groups
    async_done_one_group: bool = True
    #: Mamba "align" mode asserts that no token is external
    mamba_align_no_external: bool = True
    #: where the answers come from (for the warning)
    source: str = "vLLM's scheduler could not be read"


def _method_source(cls, name: str) -> str | None:
    fn = getattr(cls, name, None)
    if fn is None:
        return None
    try:
        return inspect.getsource(fn)
    except (OSError, TypeError):
        return ""


def engine_limits() -> EngineLimits:
    """The limits of the vLLM scheduler this process runs (see above)."""
    try:
        from vllm.v1.core.sched import scheduler as _sched

        cls = _sched.Scheduler
    except Exception:
        return EngineLimits()
    inv = _method_source(cls, "_update_requests_with_invalid_blocks")
    done = _method_source(cls, "_update_waiting_for_remote_kv")
    mamba = _method_source(cls, "_mamba_block_aligned_split")
    return EngineLimits(
        invalid_blocks_one_group=not inv or bool(_ONE_GROUP_UNPACK.search(inv)),
        async_done_one_group=not done or bool(_ONE_GROUP_UNPACK.search(done)),
        # no such method: this vLLM has no align split
        mamba_align_no_external=mamba is not None and (not mamba or bool(_NO_EXTERNAL.search(mamba))),
        source="%s.%s" % (getattr(cls, "__module__", "?"), getattr(cls, "__qualname__", "?")))

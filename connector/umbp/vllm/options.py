"""``kv_connector_extra_config`` of the UMBP connector: every option, its default
and its validation.  No vLLM import: usable to check a config offline::

    python3 -c 'import json,sys; from umbp.vllm.options import ConnectorOptions; \
        print(ConnectorOptions.parse(json.load(sys.stdin)))' < extra.json

The table below holds the connector's own options (option names follow AMD's
UMBP connector where it has the option, connector-api.md §3.4).  Every other
name is a ``umbp.Runtime`` option (docs/configuration.md) and passes through
to C unchanged: C says whether the mode's runtime takes it
(``umbp.modes.option_error``: another tier's option, or unknown with the
closest name) and checks its value (``umbp.modes.check_config``, the
runtime's own parse), so no runtime option's name, bounds or mode is listed
here.  Each bad value is refused with a :class:`UMBPConfigError` naming the
option.  Unknown names are refused too, unless ``strict_options`` is false,
in which case they are logged and ignored.
"""

from __future__ import annotations

import dataclasses
import difflib
import logging
import re
from typing import Any, Callable

log = logging.getLogger("umbp.vllm")


class UMBPConfigError(ValueError):
    """A bad ``kv_connector_extra_config``; the message names the option."""


_SIZE_RE = re.compile(r"^\s*\d+(\.\d+)?\s*([kKmMgGtTpP](i?[bB])?|[bB])?\s*$")

# ---- value checkers -----------------------------------------------------------


def _bool(name, v):
    if isinstance(v, bool):
        return v
    raise UMBPConfigError(f"{name}: must be true or false, got {v!r}")


def _int(lo, hi):
    def check(name, v):
        if isinstance(v, bool) or not isinstance(v, int):
            raise UMBPConfigError(f"{name}: must be an integer between {lo} and {hi}, got {v!r}")
        if not lo <= v <= hi:
            raise UMBPConfigError(f"{name}: must be between {lo} and {hi}, got {v}")
        return v

    return check


def _number(lo, hi):
    def check(name, v):
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise UMBPConfigError(f"{name}: must be a number between {lo} and {hi}, got {v!r}")
        if not lo <= v <= hi:
            raise UMBPConfigError(f"{name}: must be between {lo} and {hi}, got {v}")
        return v

    return check


def _size(positive=False):
    def check(name, v):
        if isinstance(v, bool):
            raise UMBPConfigError(f"{name}: must be a size (bytes or e.g. \"64GiB\"), got {v!r}")
        if isinstance(v, int):
            if v < 0 or (positive and v == 0):
                raise UMBPConfigError(
                    f"{name}: must be a {'positive' if positive else 'non-negative'} size, got {v}"
                )
            return v
        if isinstance(v, str) and _SIZE_RE.match(v):
            if positive and float(re.match(r"\s*(\d+(\.\d+)?)", v).group(1)) == 0:
                raise UMBPConfigError(f"{name}: must be a positive size, got {v!r}")
            return v.strip()
        raise UMBPConfigError(
            f"{name}: must be a size: an integer of bytes or a string like \"512MiB\", \"64GiB\", got {v!r}"
        )

    return check


def _string(maxlen, allow_empty=True):
    def check(name, v):
        if not isinstance(v, str):
            raise UMBPConfigError(f"{name}: must be a string, got {v!r}")
        if not allow_empty and not v:
            raise UMBPConfigError(f"{name}: must not be empty")
        if len(v) > maxlen:
            raise UMBPConfigError(f"{name}: at most {maxlen} characters, got {len(v)}")
        return v

    return check


def _choice(*values):
    def check(name, v):
        if v not in values:
            raise UMBPConfigError(f"{name}: must be one of {', '.join(map(repr, values))}, got {v!r}")
        return v

    return check


def _runtime(name, v):
    """A umbp runtime option: C checks it (umbp.check_config, the runtime's
    own parse), so its bounds live only in the C option tables."""
    return v


def _instance(name, v):
    v = _string(31)(name, v)
    if v and not re.fullmatch(r"[A-Za-z0-9._-]+", v):
        raise UMBPConfigError(f"{name}: only letters, digits, '.', '_' and '-' are allowed, got {v!r}")
    return v


def _dp_rank(name, v):
    """"auto" (the engine's data-parallel rank) or a runtime dp_rank, which C checks."""
    return v


def _hash_block_size(name, v):
    if v == "auto":
        return v
    return _int(1, 1 << 20)(name, v)


def _abs_dir(name, v):
    v = _string(107)(name, v)
    if v and not v.startswith("/"):
        raise UMBPConfigError(f"{name}: must be an absolute directory path, got {v!r}")
    return v


# ---- the table ----------------------------------------------------------------

def _mode(name, v):
    """A mode of the C mode table; its properties come with it."""
    from ..modes import mode_properties
    from .._lib import UmbpError

    if not isinstance(v, str):
        raise UMBPConfigError(f"{name}: must be a string, got {v!r}")
    try:
        mode_properties(v)
    except UmbpError as e:  # names the mode and the modes there are
        raise UMBPConfigError(str(e)) from None
    return v


# Which modes a connector option is for, by the mode's properties
# (umbp.mode_properties), never by name: ANY, SERVER (runtimes are sessions
# of umbp-server), PRIVATE (each rank has its own pool and serves its
# lookups).  None: the C runtime option it sets decides (umbp.option_lookup).
ANY, SERVER, PRIVATE = "any", "server", "private"


def _applies(opt, props) -> str | None:
    """None if opt is an option in this mode, else why not."""
    if opt.modes is None:
        from ..modes import option_error

        why = option_error(opt.runtime, props.name) if opt.runtime else None
        if why and opt.runtime != opt.name:
            why = f"{opt.name}: not an option in {props.name} mode (it sets umbp's {why})"
        return why
    if opt.modes == ANY or (opt.modes == SERVER) == props.sessions:
        return None
    return ConnectorOptions._wrong_mode(opt.name, props.name, props)


@dataclasses.dataclass(frozen=True)
class Opt:
    name: str
    check: Callable[[str, Any], Any]
    default: Any
    modes: str | None = None
    runtime: str | None = None  # name of the umbp.Runtime option it sets
    doc: str = ""


OPTIONS: dict[str, Opt] = {
    o.name: o
    for o in [
        # -- connector behaviour (UMBP's names) --
        Opt("mode", _mode, "embedded",
            doc="embedded | standalone | distributed (the C mode table; umbp.mode_properties)"),
        Opt("key_namespace", _string(4096), "auto",
            doc="\"auto\" derives the key namespace from the model and layout; any other string is the namespace"),
        Opt("load_async", _bool, True,
            doc="load between scheduler steps (forced on with Mamba groups)"),
        Opt("lookup_async", _bool, False,
            doc="lookups on a thread pool; get_num_new_matched_tokens answers None until done"),
        Opt("lookup_workers", _int(1, 64), 2, doc="threads of the async lookup pool"),
        Opt("enable_lookup", _bool, True, doc="false: store only, never load"),
        Opt("save_decode_cache", _bool, False, doc="also store blocks filled by decode"),
        Opt("lazy_offload", _bool, False,
            doc="false: store newly full blocks every step (eager); true: store a request's blocks when it finishes"),
        Opt("hash_block_size", _hash_block_size, "auto",
            doc="tokens per engine block hash; auto = the engine's"),
        Opt("load_failure_quarantine_ms", _runtime, 0, runtime="load_failure_quarantine_ms",
            doc="a key whose load failed counts as a miss this long (0 = off)"),
        Opt("timeout_ms", _runtime, None, runtime="timeout_ms",
            doc="bound on every transfer (runtime default 10000)"),
        Opt("lookup_timeout_ms", _runtime, 100, runtime="lookup_timeout_ms",
            doc="bound on one scheduler lookup (all ranks)"),
        Opt("enable_events", _runtime, False, runtime="enable_events",
            doc="emit BlockStored/BlockRemoved KV events from the runtime's events"),
        Opt("lookup_instance", _instance, "", modes=ANY, runtime="lookup_instance",
            doc="separates engines (embedded lookup sockets) or servers (standalone) on one host"),
        Opt("num_workers", _runtime, None, runtime="copy_threads",
            doc="UMBP's transfer threads: umbp's copy_threads"),
        Opt("prefer_cross_layer_blocks", _bool, False,
            doc="ask vLLM for one cross-layer KV tensor (register_cross_layers_kv_cache) when layers are uniform"),
        Opt("strict_options", _bool, True, doc="false: unknown options are logged and ignored"),
        # -- embedded: lookup sockets --
        Opt("lookup_dir", _abs_dir, "", modes=PRIVATE,
            doc="directory of the workers' lookup sockets (\"\" = the library's default)"),
        # -- standalone: where the server is (socket_dir, auto_start ... pass through) --
        Opt("endpoint", _string(200, allow_empty=False), None, modes=SERVER,
            doc="UMBP's name: the server socket, unix:///dir/umbp-dp<N>[-<instance>].sock"),
        Opt("dp_rank", _dp_rank, 0, runtime="dp_rank",
            doc="server index in the socket path; \"auto\" = the engine's data-parallel rank"),
        Opt("tenant_namespace", _runtime, None, runtime="namespace",
            doc="the server's quota namespace (umbp option `namespace`)"),
    ]
}

_DIST = ("UMBP's distributed-mode option; umbp's distributed mode takes master_address and "
         "secret_file, and peers find each other through umbp-master (docs/distributed.md)")

#: UMBP options this connector knows but does not support, and why.
UNSUPPORTED = {
    "backend": "UMBP's in-process 'memory' validation runtime; use gpu_backend=\"host\" with CPU tensors instead",
    "enable_partial_hash_hits": "partial-block hits are not supported (hits are whole blocks)",
    "lazy_offload_max_blocks": "lazy offload stores a request's blocks at request_finished; there is no block-pool scan to bound",
    "layerwise_load": "loads are per KV cache group, not per layer stage",
    "layerwise_load_stages": "loads are per KV cache group, not per layer stage",
    # AMD UMBP's distributed-mode names with no counterpart here: peers are
    # reached by the UCX worker address the master carries (no ports or node
    # ids to set), and reads are always local first
    "peer_service_port": _DIST,
    "node_address": _DIST,
    "node_id": _DIST,
    "io_engine_host": _DIST,
    "io_engine_port": _DIST,
    "dram_page_size": _DIST,
    "ranged_scratch_size": _DIST,
    "local_first": "reads are always local first (the node's slice, then the owner the master names)",
    "rank": "set by the connector from the worker's parallel rank",
    "world_size": "set by the connector from the parallel sizes",
    "role": "set by the connector (workers: worker, scheduler: lookup)",
    "namespace": "umbp's tenant namespace is `tenant_namespace` here (`key_namespace` is the key namespace)",
    "gpu_device": "set by the connector from the KV tensors' device",
    "tier": "test-only umbp option",
}

_ENDPOINT_RE = re.compile(r"^(?:unix://)?(/.*)/umbp-dp(\d+)(?:-([A-Za-z0-9._-]{1,31}))?\.sock$")


@dataclasses.dataclass
class ConnectorOptions:
    """The validated options; ``values`` holds every option (defaults filled)."""

    values: dict
    given: frozenset
    props: Any = None  #: the mode's umbp.ModeProperties
    #: runtime options given by name, passed through to umbp.Runtime as they are
    passed: dict = dataclasses.field(default_factory=dict)
    #: every runtime option's value as C resolves it (defaults, UMBP_* variables)
    resolved: dict = dataclasses.field(default_factory=dict)

    def __getattr__(self, name):
        try:
            return self.__dict__["values"][name]
        except KeyError:
            raise AttributeError(name) from None

    # ---- parsing --------------------------------------------------------------

    @classmethod
    def parse(cls, extra: dict | None) -> "ConnectorOptions":
        extra = dict(extra or {})
        if not isinstance(extra, dict):
            raise UMBPConfigError(f"kv_connector_extra_config must be an object, got {type(extra).__name__}")
        strict = extra.get("strict_options", True)
        _bool("strict_options", strict)

        from ..modes import check_config, mode_properties, option_error
        from .._lib import UmbpError

        mode = OPTIONS["mode"].check("mode", extra.get("mode", OPTIONS["mode"].default))
        props = mode_properties(mode)
        errors, unknown, passed = [], [], {}
        for name in list(extra):
            if not isinstance(name, str):
                raise UMBPConfigError(f"kv_connector_extra_config: option names must be strings, got {name!r}")
            if name in UNSUPPORTED:
                if name == "enable_partial_hash_hits" and extra[name] is False:
                    del extra[name]
                    continue
                raise UMBPConfigError(f"{name}: not supported by the umbp connector: {UNSUPPORTED[name]}")
            if name in OPTIONS:
                continue
            why = option_error(name, mode)  # C: the mode's runtime option, another tier's, or none
            if why is None:
                if extra[name] is None:
                    raise UMBPConfigError(f"{name}: null is not a value; leave the option out for its default")
                passed[name] = extra[name]
            elif why.startswith("unknown option"):
                close = difflib.get_close_matches(name, list(OPTIONS), n=1)
                if close:  # a connector option is closer than anything C knows
                    why = f"unknown option {name!r} (did you mean {close[0]!r}?)"
                errors.append(why)
                unknown.append(name)
            else:
                raise UMBPConfigError(f"{why} (mode is {mode!r})")
        if errors:
            msg = (f"kv_connector_extra_config: {'; '.join(errors)}; docs/vllm.md lists the connector's "
                   "options, docs/configuration.md the runtime's")
            if strict:
                raise UMBPConfigError(msg)
            log.warning("umbp: %s (ignored: strict_options is false)", msg)
            for name in unknown:
                extra.pop(name, None)

        values = {}
        for name, opt in OPTIONS.items():
            if name in extra:
                v = extra[name]
                if v is None:
                    raise UMBPConfigError(f"{name}: null is not a value; leave the option out for its default")
                why = _applies(opt, props)
                if why:
                    raise UMBPConfigError(why)
                values[name] = opt.check(name, v)
            else:
                values[name] = opt.default
        given = frozenset(extra)
        self = cls(values=values, given=given, props=props, passed=passed)
        self._cross_checks()
        try:  # C's parse, as a rank's runtime will do it: its message names the option
            self.resolved = check_config(self.runtime_config(rank=0, world_size=1))
        except UmbpError as e:
            raise UMBPConfigError(f"kv_connector_extra_config: {e}") from None
        if self.props.sessions and ("capacity_bytes" in given or "total_capacity_bytes" in given) \
                and not self.resolved.get("auto_start"):
            raise UMBPConfigError(
                "capacity_bytes/total_capacity_bytes: in standalone mode the pool belongs to umbp-server "
                "(set it in the server's config); they are accepted here only with auto_start=true"
            )
        return self

    @staticmethod
    def _wrong_mode(name, mode, props):
        if props.sessions:
            what = ("the pool belongs to umbp-server: set it in the server's config or UMBP_DRAM_* environment"
                    if name.startswith("dram_") else "its lookups go to the server's socket")
            return f"{name}: not an option in {mode} mode ({what})"
        return f"{name}: only an option in a mode with a server, e.g. standalone (mode is {mode!r})"

    def _cross_checks(self):
        """The connector's own rules (a pool size given to a session runtime
        without auto_start is the connector's rule too, checked in parse once
        C has resolved auto_start); those between runtime options are C's."""
        v, given = self.values, self.given
        if self.props.sessions:
            if "endpoint" in given:
                m = _ENDPOINT_RE.match(v["endpoint"])
                if not m:
                    raise UMBPConfigError(
                        "endpoint: must be unix:///<dir>/umbp-dp<N>[-<instance>].sock (the path umbp-server "
                        f"serves: socket_dir, dp_rank, lookup_instance), got {v['endpoint']!r}"
                    )
                for o in ("socket_dir", "dp_rank", "lookup_instance"):
                    if o in given:
                        raise UMBPConfigError(f"endpoint and {o} are mutually exclusive; endpoint names all three")
                self.passed["socket_dir"] = m.group(1)
                v["dp_rank"], v["lookup_instance"] = int(m.group(2)), m.group(3) or ""
        if "copy_threads" in given and "num_workers" in given:
            raise UMBPConfigError("num_workers (UMBP's name) and copy_threads are the same option; set one")

    # ---- what the runtime gets --------------------------------------------------

    def runtime_config(self, *, rank: int, world_size: int, dp_rank: int = 0, role: str | None = None,
                       gpu_backend: str | None = None, gpu_device: int | None = None) -> dict:
        """The umbp.Runtime option dict of one worker rank (or, with role="lookup",
        of a standalone scheduler's lookup session)."""
        v = self.values
        cfg: dict = {"mode": v["mode"], "rank": rank, "world_size": world_size}
        cfg.update(self.passed)
        for name, opt in OPTIONS.items():
            if opt.runtime is None or v.get(name) is None:
                continue
            if _applies(opt, self.props):
                continue
            if name == "lookup_instance" and not self.props.sessions:
                continue  # embedded: part of the lookup socket path only
            if name == "dp_rank":
                cfg["dp_rank"] = dp_rank if v[name] == "auto" else v[name]
                continue
            if name in ("load_failure_quarantine_ms",) and v[name] == 0:
                continue
            cfg[opt.runtime] = v[name]
        if role is not None and self.props.sessions:
            cfg["role"] = role
        if gpu_backend is not None and "gpu_backend" not in self.passed:
            cfg["gpu_backend"] = gpu_backend
        if gpu_device is not None:
            cfg["gpu_device"] = gpu_device
        if role == "lookup":
            for k in ("capacity_bytes", "total_capacity_bytes", "auto_start", "gpu_backend", "gpu_device"):
                cfg.pop(k, None)
        return cfg

    def __repr__(self):
        shown = {k: self.values[k] for k in sorted(self.given) if k in self.values}
        return f"ConnectorOptions(mode={self.values['mode']!r}, {shown})"


def requires_piecewise(extra: dict | None) -> bool:
    """Whether layer-wise hooks are in use (synchronous loads wait in
    wait_for_layer_load, which CUDA graphs would skip)."""
    try:
        opts = ConnectorOptions.parse(extra)
    except UMBPConfigError:
        return False
    return opts.enable_lookup and not opts.load_async

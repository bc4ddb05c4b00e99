"""KV tensors (torch or anything shaped like one) -> umbp_kv_tensor_t.

Duck-typed: a tensor is anything with data_ptr(), shape, stride() and
element_size(), so this module never imports torch.  Strides are passed as
they are (in elements): permuted views such as vLLM's HND layout are fine,
the C side accepts chunk dims dense in any order.

Layouts (roles of dims; the other dims make up one chunk):
  flash_attn   (2, nb, bs, H, D)           block_dim 1, kv_dim 0
  flashinfer   (nb, 2, bs, H, D)           block_dim 0, kv_dim 1
  mla          (nb, bs, D)                 block_dim 0, no kv dim
  cross_layer  (nb, L, 2, bs, H, D)        block_dim 0, layer_dim 1, kv_dim 2
               (nb, L, bs, D)              MLA: block_dim 0, layer_dim 1
  {"block_dim": b, "kv_dim": k, "layer_dim": l}   explicit roles (-1: none)
"""
import errno

from . import _ffi
from ._lib import UmbpError

LAYOUTS = ("auto", "flash_attn", "flashinfer", "mla", "cross_layer")

# layout -> ndim -> (block_dim, kv_dim, layer_dim)
_ROLES = {
    "flash_attn": {5: (1, 0, -1)},
    "flashinfer": {5: (0, 1, -1)},
    "mla": {3: (0, -1, -1)},
    "cross_layer": {6: (0, 2, 1), 4: (0, -1, 1)},
}


def _bad(msg):
    return UmbpError(-errno.EINVAL, "register_kv_caches: " + msg)


def _shape(t):
    return tuple(int(s) for s in t.shape)


def _infer(name, shape, single, num_blocks):
    """The layout of one tensor from its shape (and num_blocks if given)."""
    nd = len(shape)
    if nd == 3:
        return "mla"
    if nd == 6 and single:
        return "cross_layer"
    if nd == 5:
        fa = shape[0] == 2 and (num_blocks is None or shape[1] == num_blocks)
        fi = shape[1] == 2 and (num_blocks is None or shape[0] == num_blocks)
        if fa and not fi:
            return "flash_attn"
        if fi and not fa:
            return "flashinfer"
        if fa and fi:
            raise _bad("%s: shape %s fits both flash_attn (2, nb, ...) and flashinfer "
                       "(nb, 2, ...); pass num_blocks= or layout=" % (name, shape))
        raise _bad("%s: shape %s is neither flash_attn (2, nb, bs, H, D) nor flashinfer "
                   "(nb, 2, bs, H, D)%s; pass layout=" % (
                       name, shape, "" if num_blocks is None else " with num_blocks=%d" % num_blocks))
    raise _bad("%s: cannot infer the layout of a %d-dim tensor of shape %s%s; pass layout= "
               "(flash_attn, flashinfer, mla, cross_layer or a dict of dims)" % (
                   name, nd, shape, " (cross-layer needs a single tensor)" if nd == 6 else ""))


def _roles(name, layout, shape):
    if isinstance(layout, dict):
        unknown = set(layout) - {"block_dim", "kv_dim", "layer_dim"}
        if unknown or "block_dim" not in layout:
            raise _bad("a layout dict has block_dim and optionally kv_dim, layer_dim; got %r"
                       % (layout,))
        return (int(layout["block_dim"]), int(layout.get("kv_dim", -1)),
                int(layout.get("layer_dim", -1)))
    by_nd = _ROLES.get(layout)
    if by_nd is None:
        raise _bad("unknown layout %r; expected one of %s or a dict of dims"
                   % (layout, ", ".join(LAYOUTS)))
    r = by_nd.get(len(shape))
    if r is None:
        raise _bad("%s: layout %s expects %s dims, the tensor has shape %s" % (
            name, layout, " or ".join(str(k) for k in sorted(by_nd)), shape))
    return r


def tensors_of(kv_caches):
    """[(name, tensor)] in layer order from a dict, a list or one tensor."""
    if isinstance(kv_caches, dict):
        items = list(kv_caches.items())
    elif isinstance(kv_caches, (list, tuple)):
        items = [("kv_caches[%d]" % i, t) for i, t in enumerate(kv_caches)]
    else:
        items = [("kv_cache", kv_caches)]
    if not items:
        raise _bad("no KV tensors given")
    for name, t in items:
        if not (hasattr(t, "data_ptr") and hasattr(t, "stride") and hasattr(t, "element_size")):
            raise TypeError("register_kv_caches: %s is a %s, not a tensor" % (name, type(t).__name__))
    return items


def describe(kv_caches, layout="auto", num_blocks=None):
    """(ctypes array of KvTensor, tensors list, info dict)."""
    items = tensors_of(kv_caches)
    single = len(items) == 1
    arr = (_ffi.KvTensor * len(items))()
    resolved = None
    info = {}
    for i, (name, t) in enumerate(items):
        shape = _shape(t)
        lay = _infer(name, shape, single, num_blocks) if layout == "auto" else layout
        if resolved is None:
            resolved = lay
        elif lay != resolved:
            raise _bad("%s has layout %s but the first tensor has %s; all layers must share one"
                       % (name, lay, resolved))
        b, k, l = _roles(name, lay, shape)
        if lay == "cross_layer" and not single:
            raise _bad("a cross_layer tensor must be the only one (got %d)" % len(items))
        nd = len(shape)
        if not 2 <= nd <= _ffi.KV_MAX_DIMS:
            raise _bad("%s: %d dims; 2 .. %d are accepted" % (name, nd, _ffi.KV_MAX_DIMS))
        stride = tuple(int(s) for s in t.stride())
        c = arr[i]
        c.base = int(t.data_ptr())
        c.ndim = nd
        for d in range(nd):
            c.shape[d] = shape[d]
            c.stride[d] = stride[d]
        c.elem_size = int(t.element_size())
        c.block_dim, c.kv_dim, c.layer_dim = b, k, l
        if not 0 <= b < nd:
            raise _bad("%s: block_dim %d outside the %d dims" % (name, b, nd))
        nb = shape[b]
        nl = shape[l] if 0 <= l < nd else 1
        if num_blocks is not None and nb != num_blocks:
            raise _bad("%s: %d blocks along dim %d, expected num_blocks=%d"
                       % (name, nb, b, num_blocks))
        info.setdefault("num_blocks", nb)
        info["num_layers"] = info.get("num_layers", 0) + nl
    info["layout"] = resolved
    return arr, [t for _, t in items], info

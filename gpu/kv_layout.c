/*
 * kv_layout.c - turns the engine's KV tensors (torch-style shape, strides,
 * element size and three dim roles) into one row per layer of byte offsets
 * that the copy kernels, the DMA lists and the host backend all use
 * (struct gpu_copy_layer), and fixes the object layout: layer by layer, K
 * then V, no padding.
 *
 * Every shape is checked here, once, so that transfers need to check only
 * block indices and layer ranges.  A layout is immutable after creation and
 * may be read by any thread; it belongs to the engine it was created on.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "engine.h"

#define MAX_BYTES ((uint64_t)1 << 62)

/* What one tensor contributes. */
struct tensor_info {
    uint64_t num_blocks;
    uint32_t nkv;
    uint32_t num_layers;
    uint64_t chunk_bytes;
    uint64_t block_stride, kv_stride, layer_stride; /* bytes */
};

static int check_roles(const umbp_kv_tensor_t *t, uint32_t idx, bool many)
{
    int nd = (int)t->ndim;
    if (t->block_dim < 0 || t->block_dim >= nd) {
        gpu_set_error("KV tensor %u: block_dim %d is outside [0, %d)", idx, t->block_dim, nd);
        return UMBP_E_KV_ROLE;
    }
    if (t->kv_dim < -1 || t->kv_dim >= nd || t->kv_dim == t->block_dim) {
        gpu_set_error("KV tensor %u: kv_dim %d must be -1 or a dim in [0, %d) other than "
                      "block_dim %d", idx, t->kv_dim, nd, t->block_dim);
        return UMBP_E_KV_ROLE;
    }
    if (t->layer_dim < -1 || t->layer_dim >= nd || t->layer_dim == t->block_dim ||
        (t->layer_dim >= 0 && t->layer_dim == t->kv_dim)) {
        gpu_set_error("KV tensor %u: layer_dim %d must be -1 or a dim in [0, %d) other than "
                      "block_dim and kv_dim", idx, t->layer_dim, nd);
        return UMBP_E_KV_ROLE;
    }
    if (many && t->layer_dim >= 0) {
        gpu_set_error("KV tensor %u: layer_dim is %d, but a layout of several tensors holds one "
                      "layer per tensor; set layer_dim = -1, or pass one cross-layer tensor",
                      idx, t->layer_dim);
        return UMBP_E_KV_ROLE;
    }
    return 0;
}

static bool is_role(const umbp_kv_tensor_t *t, int d)
{
    return d == t->block_dim || d == t->kv_dim || d == t->layer_dim;
}

static int check_sizes(const umbp_kv_tensor_t *t, uint32_t idx)
{
    if (t->elem_size == 0 || t->elem_size > 64) {
        gpu_set_error("KV tensor %u: elem_size %u; it must be 1..64 bytes", idx, t->elem_size);
        return UMBP_E_KV_SHAPE;
    }
    for (uint32_t d = 0; d < t->ndim; d++) {
        if (t->shape[d] < 1) {
            gpu_set_error("KV tensor %u: dim %u has size %lld; sizes must be >= 1", idx, d,
                          (long long)t->shape[d]);
            return UMBP_E_KV_SHAPE;
        }
    }
    if (t->kv_dim >= 0 && t->shape[t->kv_dim] != 2) {
        gpu_set_error("KV tensor %u: kv_dim %d has size %lld; it must be 2 (K and V)", idx,
                      t->kv_dim, (long long)t->shape[t->kv_dim]);
        return UMBP_E_KV_SHAPE;
    }
    /* The furthest byte must fit comfortably in 64 bits. */
    uint64_t span = t->elem_size;
    for (uint32_t d = 0; d < t->ndim; d++) {
        if (t->shape[d] == 1 || t->stride[d] < 0)
            continue; /* no extent, or a bad stride check_strides reports */
        /* strides in bytes too: elem_size times a stride must not wrap */
        if ((uint64_t)t->stride[d] > MAX_BYTES / t->elem_size ||
            (uint64_t)t->shape[d] > MAX_BYTES) {
            gpu_set_error("KV tensor %u: dim %u is too large", idx, d);
            return UMBP_E_KV_SHAPE;
        }
        uint64_t ext = (uint64_t)(t->shape[d] - 1);
        uint64_t st = (uint64_t)t->stride[d] * t->elem_size;
        if (ext != 0 && st > (MAX_BYTES - span) / ext) {
            gpu_set_error("KV tensor %u: spans more than 2^62 bytes", idx);
            return UMBP_E_KV_SHAPE;
        }
        span += ext * st;
    }
    return 0;
}

/* The non-role dims must be dense in some order: one contiguous chunk of
 * prod(shape) elements.  Any order, because engines hand out permuted views
 * (vLLM's HND stride order gives (2, nb, bs, H, D) with H outermost in
 * memory); the chunk's bytes are copied as they lie, so an object holds the
 * engine's own order (the connector's namespace names the layout). */
static int check_strides(const umbp_kv_tensor_t *t, uint32_t idx, struct tensor_info *ti)
{
    int dims[UMBP_KV_MAX_DIMS], n = 0;
    for (int d = 0; d < (int)t->ndim; d++)
        if (!is_role(t, d) && t->shape[d] > 1)
            dims[n++] = d;
    /* innermost first: by stride, then (for equal strides) later dims first */
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0; j--) {
            const int a = dims[j - 1], b = dims[j];
            if (t->stride[a] < t->stride[b] || (t->stride[a] == t->stride[b] && a > b))
                break;
            dims[j - 1] = b;
            dims[j] = a;
        }
    uint64_t expect = 1;
    for (int i = 0; i < n; i++) {
        int d = dims[i];
        if (t->stride[d] != (int64_t)expect) {
            gpu_set_error("KV tensor %u: dim %d has stride %lld, but the dims of one chunk (all "
                          "but block/kv/layer) must be dense in some order, so in this order it "
                          "must be %llu", idx, d, (long long)t->stride[d],
                          (unsigned long long)expect);
            return UMBP_E_KV_STRIDE;
        }
        expect *= (uint64_t)t->shape[d];
    }
    ti->chunk_bytes = expect * t->elem_size;

    const int roles[3] = {t->block_dim, t->kv_dim, t->layer_dim};
    for (int r = 0; r < 3; r++) {
        int d = roles[r];
        if (d < 0 || t->shape[d] == 1)
            continue;
        /* A stride below one chunk would make chunks overlap. */
        if (t->stride[d] <= 0 || (uint64_t)t->stride[d] * t->elem_size < ti->chunk_bytes) {
            gpu_set_error("KV tensor %u: dim %d (%s) has stride %lld elements, less than one "
                          "chunk (%llu bytes): chunks would overlap", idx, d,
                          r == 0 ? "blocks" : r == 1 ? "K/V" : "layers", (long long)t->stride[d],
                          (unsigned long long)ti->chunk_bytes);
            return UMBP_E_KV_STRIDE;
        }
    }
    uint64_t es = t->elem_size;
    ti->block_stride = (uint64_t)t->stride[t->block_dim] * es;
    ti->kv_stride = t->kv_dim >= 0 ? (uint64_t)t->stride[t->kv_dim] * es : 0;
    ti->layer_stride = t->layer_dim >= 0 ? (uint64_t)t->stride[t->layer_dim] * es : 0;
    ti->num_blocks = (uint64_t)t->shape[t->block_dim];
    ti->nkv = t->kv_dim >= 0 ? 2 : 1;
    ti->num_layers = t->layer_dim >= 0 ? (uint32_t)t->shape[t->layer_dim] : 1;
    return 0;
}

static int check_tensor(const umbp_kv_tensor_t *t, uint32_t idx, bool many, struct tensor_info *ti)
{
    if (t->ndim < 2 || t->ndim > UMBP_KV_MAX_DIMS) {
        gpu_set_error("KV tensor %u: ndim %u; it must be 2..%d", idx, t->ndim, UMBP_KV_MAX_DIMS);
        return UMBP_E_KV_NDIM;
    }
    if (t->base == NULL) {
        gpu_set_error("KV tensor %u: base is NULL", idx);
        return -EINVAL;
    }
    int rc = check_roles(t, idx, many);
    if (rc == 0)
        rc = check_sizes(t, idx);
    if (rc == 0)
        rc = check_strides(t, idx, ti);
    if (rc == 0 && t->layer_dim >= 0 && t->shape[t->layer_dim] > 65536) {
        gpu_set_error("KV tensor %u: %lld layers; at most 65536", idx,
                      (long long)t->shape[t->layer_dim]);
        rc = UMBP_E_KV_SHAPE;
    }
    return rc;
}

void umbp_kv_tensor_set_contiguous(umbp_kv_tensor_t *t)
{
    int64_t s = 1;
    for (int d = (int)t->ndim - 1; d >= 0; d--) {
        t->stride[d] = s;
        s *= t->shape[d];
    }
}

/* Fills the host table; returns the layer count or a negative code. */
static int build_layers(const umbp_kv_tensor_t *tensors, uint32_t num_tensors,
                        struct umbp_kv_layout *lay, struct gpu_copy_layer **out)
{
    bool many = num_tensors > 1;
    struct tensor_info first = {0};
    struct gpu_copy_layer *rows = NULL;
    uint32_t nl = 0;
    uint64_t off = 0;
    int rc = 0;

    for (uint32_t i = 0; i < num_tensors; i++) {
        struct tensor_info ti;
        rc = check_tensor(&tensors[i], i, many, &ti);
        if (rc < 0)
            goto fail;
        if (i == 0) {
            first = ti;
            nl = many ? num_tensors : ti.num_layers;
            rows = calloc(nl, sizeof(*rows));
            if (rows == NULL) {
                rc = -ENOMEM;
                goto fail;
            }
        } else if (ti.num_blocks != first.num_blocks || ti.nkv != first.nkv) {
            gpu_set_error("KV tensor %u: %llu blocks%s, but tensor 0 has %llu blocks%s; every "
                          "layer must have the same blocks and K/V split", i,
                          (unsigned long long)ti.num_blocks, ti.nkv == 2 ? " with K/V" : "",
                          (unsigned long long)first.num_blocks, first.nkv == 2 ? " with K/V" : "");
            rc = UMBP_E_KV_MISMATCH;
            goto fail;
        }
        for (uint32_t k = 0; k < ti.num_layers; k++) {
            struct gpu_copy_layer *r = &rows[many ? i : k];
            if (ti.nkv * ti.chunk_bytes > MAX_BYTES - off) {
                gpu_set_error("KV tensor %u: an object of its layers spans more than 2^62 "
                              "bytes", i);
                rc = UMBP_E_KV_SHAPE;
                goto fail;
            }
            r->base = (uint64_t)(uintptr_t)tensors[i].base + k * ti.layer_stride;
            r->block_stride = ti.block_stride;
            r->kv_stride = ti.kv_stride;
            r->chunk_bytes = ti.chunk_bytes;
            r->obj_off = off;
            off += ti.nkv * ti.chunk_bytes;
        }
    }
    lay->num_layers = nl;
    lay->nkv = first.nkv;
    lay->num_blocks = first.num_blocks;
    lay->object_size = off;
    *out = rows;
    return 0;
fail:
    free(rows);
    return rc;
}

int umbp_kv_layout_create(umbp_gpu_engine_t *eng, const umbp_kv_tensor_t *tensors,
                          uint32_t num_tensors, umbp_kv_layout_t **out)
{
    if (eng == NULL || tensors == NULL || out == NULL || num_tensors == 0) {
        gpu_set_error("umbp_kv_layout_create: engine, tensors and out are required, with "
                      "num_tensors >= 1");
        return -EINVAL;
    }
    struct umbp_kv_layout *lay = calloc(1, sizeof(*lay));
    if (lay == NULL)
        return -ENOMEM;
    lay->eng = eng;
    int rc = build_layers(tensors, num_tensors, lay, &lay->layers);
    if (rc < 0)
        goto fail;

    size_t bytes = (size_t)lay->num_layers * sizeof(struct gpu_copy_layer);
    int prev;
    rc = gpu_device_enter(eng->ops, eng->device, &prev);
    if (rc < 0)
        goto fail;
    void *d = NULL;
    rc = gpu_dev_alloc(eng->ops, bytes, &d);
    if (rc == 0) {
        rc = gpu_memcpy_sync(eng->ops, d, lay->layers, bytes);
        if (rc < 0)
            gpu_dev_free(eng->ops, d);
    }
    gpu_device_leave(eng->ops, eng->device, prev);
    if (rc < 0)
        goto fail;
    lay->dlayers = d;
    atomic_fetch_add(&eng->num_layouts, 1);
    *out = lay;
    return 0;
fail:
    free(lay->layers);
    free(lay);
    return rc;
}

void umbp_kv_layout_destroy(umbp_kv_layout_t *lay)
{
    if (lay == NULL)
        return;
    struct umbp_gpu_engine *eng = lay->eng;
    int prev;
    if (gpu_device_enter(eng->ops, eng->device, &prev) == 0) {
        gpu_dev_free(eng->ops, lay->dlayers);
        gpu_device_leave(eng->ops, eng->device, prev);
    }
    atomic_fetch_sub(&eng->num_layouts, 1);
    free(lay->layers);
    free(lay);
}

uint32_t umbp_kv_layout_num_layers(const umbp_kv_layout_t *l) { return l->num_layers; }
uint64_t umbp_kv_layout_num_blocks(const umbp_kv_layout_t *l) { return l->num_blocks; }
uint32_t umbp_kv_layout_num_kv(const umbp_kv_layout_t *l) { return l->nkv; }
uint64_t umbp_kv_layout_object_size(const umbp_kv_layout_t *l) { return l->object_size; }

int umbp_kv_layout_layer_span(const umbp_kv_layout_t *l, uint32_t first, uint32_t count,
                              uint64_t *offset, uint64_t *len)
{
    if (first >= l->num_layers || count > l->num_layers - first) {
        gpu_set_error("layers [%u, %u) are outside the layout's %u layers", first,
                      first + count, l->num_layers);
        return UMBP_E_KV_RANGE;
    }
    if (count == 0)
        count = l->num_layers - first;
    const struct gpu_copy_layer *last = &l->layers[first + count - 1];
    uint64_t begin = l->layers[first].obj_off;
    if (offset != NULL)
        *offset = begin;
    if (len != NULL)
        *len = last->obj_off + l->nkv * last->chunk_bytes - begin;
    return 0;
}

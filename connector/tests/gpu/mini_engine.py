#!/usr/bin/env python3
"""The miniature engine of issue 7: a real transformer over a vLLM-layout paged
KV cache, whose prompt prefix is stored through umbp and restored by another
engine (embedded: the same process; standalone: other processes, one
umbp-server; distributed: other processes, each a node, one umbp-master), which
must then decode exactly what a full prefill decodes.

The engine
----------
model      ``transformers.LlamaForCausalLM(LlamaConfig(...))``, random weights from
           a fixed seed (GQA, head_dim 128, bf16).  Without transformers (CPU
           tests only) a pure-torch stand-in with the same architecture and the
           same parameter names.
KV cache   one tensor per layer, ``(2, num_blocks, 16, num_kv_heads, head_dim)``
           as vLLM's FlashAttention backend allocates it (NHD; ``--layout HND``
           allocates ``(2, nb, H, 16, D)`` and hands out the permuted view, vLLM's
           HND stride order).  Block 0 is vLLM's null block and never used.
forward    the model's own modules: embed_tokens, per layer input_layernorm,
           q/k/v_proj, its rotary embedding, o_proj, post_attention_layernorm,
           mlp; norm and lm_head.  Attention writes the step's K/V into the
           request's blocks, gathers the blocks of the context with
           index_select and runs scaled_dot_product_attention (causal for a
           prefill from position 0, a bottom-right causal mask for a chunk after
           a prefix, none for decode).  ``validate`` checks it against the
           model's own forward (fp32: logits and greedy tokens; bf16: logits
           within bf16 tolerance) and fails loudly.
scheduler  the harness's (connector/tests/vllm_harness, branch vllm): vLLM's
           call order of connector-api.md §1.4 (get_num_new_matched_tokens,
           update_state_after_alloc, WAITING_FOR_REMOTE_KVS for async loads,
           build_connector_meta; update_from_output with
           request_finished_all_groups, delayed frees, update_connector_output),
           sync scheduling, one request at a time, its block pool handing out
           blocks in a shuffled order (so a restoring request gets other block
           ids than the storing one).  Its worker's ``execute`` drives the
           worker half (bind_connector_metadata, handle_preemptions,
           start_load_kv, per layer wait_for_layer_load / save_kv_layer,
           wait_for_save, get_transfer_results, ...) around our forward.
chunking   like vLLM's chunked prefill, except that the prompt's last block
           (what a connector can never supply: the last prompt token is always
           computed) is computed in a step of its own.  A full prefill and a
           restore then compute every token after the hit with the same shapes,
           so their logits are comparable bit for bit and their greedy decodes
           token for token, not only up to bf16 rounding.  The one-step prefill
           of the whole prompt is timed too, as the baseline vLLM would use.
connector  ``--path connector``: umbp.vllm.connector.UMBPConnector (both roles)
           over libumbp; CUDA tensors are registered as they are and stores
           wait on a torch.cuda.Event.  ``--path direct``: the same umbp calls
           without the connector (DirectConnector below), a cross-check and the
           library's restore alone.

Scenarios (``--mode``)
----------------------
embedded    one process: reference runs without a connector; request A stores
            its prompt; the KV cache is wiped (zeros); fresh requests with the
            same prompt restore from the same runtime into other blocks, compute
            the last block and decode N tokens, which must equal the reference
            token for token (and logit for logit); their restored blocks must
            equal A's byte for byte (digests).  Variants: HND layout with async
            loads; the direct path.
standalone  an umbp-server started here; process A stores and waits; process B1
            restores while A is alive; A exits; process B2 restores after A
            exited (and is timed).  B compares with A's digests, tokens and
            weights through a file.
distributed a real umbp-master (--master, $UMBP_MASTER, else
            build/master/umbp-master) on a free loopback port; every engine
            process's worker runtime is a node of its own ("mode":
            "distributed", master_address, capacity_bytes, heartbeat_ms 100);
            the scheduler asks the master through umbp.LookupClient.  Process
            A stores, then looks its prompt up through its scheduler until the
            master locates every block (bounded: 200 tries a heartbeat apart);
            process B1 restores while A is alive, its blocks fetched from A's
            node over UCX (UCX_TLS=tcp UCX_NET_DEVICES=lo unless the caller
            set either), with the standalone checks; A and B1 exit (their
            nodes, B1's replicas included, die with them); once the master has
            logged both nodes suspect, process B2 must miss cleanly (0 hit
            tokens, no lookup error, nothing loaded or failed) and decode the
            reference's tokens by recomputing.  Skipped with the reason when
            umbp.mode_properties("distributed") raises (no rdma tier) or there
            is no umbp-master.

Tensor parallelism (``--tp 2``)
-------------------------------
Each engine process (the scheduler and its UMBPConnector, SCHEDULER role)
starts two rank processes (spawn; TPRank): each builds the same weights and
keeps its Megatron shard (q/k/v_proj by heads: rank r's attention and KV heads
[r*H/2, (r+1)*H/2); o_proj and down_proj row-parallel; gate/up_proj
column-parallel; embeddings, norms, lm_head replicated), all-reduces (sum,
fp32) after o_proj and down_proj with torch.distributed (nccl with ``--gpus
2``, rank r on cuda:r; gloo otherwise), and holds a paged KV cache of its KV
heads only, (2, nb, 16, Hkv/2, D), under its own UMBPConnector (WORKER role,
its rank's keys).  A step goes to both ranks at once; their outputs are
aggregated as vLLM's KVOutputAggregator does.  Scenarios embedded-tp2 and
standalone-tp2 add to the checks above: the TP=2 paged forward equals the
model's TP=1 forward (fp32), both ranks sample the same tokens from the same
logits, digests cover every rank's bytes, and (partial) after rank 1 lost its
objects of the second half of the blocks a fresh request's hit shrinks to the
first half (a block counts only where every rank holds it), restores it and
decodes the reference's tokens.

Prints a summary table and writes every check and timing to ``--out``
(default ``$OUT/mini_engine.json`` when OUT is set).  Exit status 0 only if every
check passed; 0 with "skipped: ..." where there is no CUDA or no transformers
(unless ``--device cpu``).
"""
from __future__ import annotations

import argparse
import collections
import contextlib
import dataclasses
import hashlib
import importlib.util
import json
import math
import os
import random
import re
import select
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

# before torch creates a cuBLAS handle: fixed workspaces make its results
# identical from run to run
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
import traceback
from types import SimpleNamespace

HERE = os.path.dirname(os.path.abspath(__file__))
TESTS_DIR = os.path.dirname(HERE)  # connector/tests: holds the vllm_harness package
CONNECTOR_DIR = os.path.dirname(TESTS_DIR)
REPO = os.path.dirname(CONNECTOR_DIR)
HARNESS_DIR = os.environ.get("UMBP_VLLM_HARNESS") or os.path.join(TESTS_DIR, "vllm_harness")
BLOCK = 16

PRESETS = {
    # ~0.85 B parameters: a 10,000-token prefill is tens of milliseconds on an H200
    "gpu": dict(vocab=32000, hidden=2048, layers=16, heads=16, kv_heads=4, head_dim=128, inter=5632,
                prompt=10000, decode=32, runs=5, num_blocks=2048, dtype="bfloat16", capacity="2GiB",
                server_capacity="2GiB", timeout=420),
    "cpu-small": dict(vocab=1024, hidden=256, layers=2, heads=4, kv_heads=2, head_dim=64, inter=512,
                      prompt=500, decode=8, runs=1, num_blocks=160, dtype="float32", capacity="64MiB",
                      server_capacity="64MiB", timeout=120),
}

torch = None  # imported once the skip checks have passed
F = None
nn = None
TAG = "mini"
INJECT = None  # --inject: a fault the checks must catch (self-test)
DEADLINE = float("inf")  # perf_counter() by which the orchestrator stops waiting for its processes


def log(msg):
    print(f"[{TAG}] {msg}", flush=True)


def now():
    return time.perf_counter()


def cdiv(a, b):
    return -(-a // b)


def median(xs):
    return statistics.median(xs) if xs else None


def _import_torch():
    global torch, F, nn
    import torch as _torch
    import torch.nn as _nn
    import torch.nn.functional as _F

    torch, F, nn = _torch, _F, _nn
    torch.set_grad_enabled(False)


class Checks:
    """Named outcomes; a scenario passes only if every one of them did."""

    def __init__(self):
        self.items = []

    def add(self, name, ok, detail=""):
        ok = bool(ok)
        self.items.append({"name": name, "ok": ok, "detail": str(detail)})
        log(f"{'PASS' if ok else 'FAIL'}  {name}" + (f"  ({detail})" if detail != "" else ""))
        return ok

    @property
    def ok(self):
        return bool(self.items) and all(c["ok"] for c in self.items)


# =============================================================================
# The model: transformers' Llama, or a stand-in with the same parameter names
# =============================================================================


def rope_tables(pos, dim, theta, dtype):
    """cos and sin (T, dim) of rotary positions, as LlamaRotaryEmbedding computes them."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.int64, device=pos.device).float() / dim))
    freqs = pos[:, None].float() * inv_freq[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def standin_llama_class():
    """A Llama in plain torch (no transformers): RMSNorm, GQA attention with
    RoPE, SiLU MLP; the parameter names of LlamaForCausalLM; a dense causal
    forward (the reference the paged forward is validated against on CPU)."""

    class RMSNorm(nn.Module):
        def __init__(self, n, eps):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(n))
            self.variance_epsilon = eps

        def forward(self, x):
            dt = x.dtype
            x = x.to(torch.float32)
            x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
            return self.weight * x.to(dt)

    class MLP(nn.Module):
        def __init__(self, c):
            super().__init__()
            self.gate_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
            self.up_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
            self.down_proj = nn.Linear(c.intermediate_size, c.hidden_size, bias=False)

        def forward(self, x):
            return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))

    class Attention(nn.Module):
        def __init__(self, c):
            super().__init__()
            self.q_proj = nn.Linear(c.hidden_size, c.num_attention_heads * c.head_dim, bias=False)
            self.k_proj = nn.Linear(c.hidden_size, c.num_key_value_heads * c.head_dim, bias=False)
            self.v_proj = nn.Linear(c.hidden_size, c.num_key_value_heads * c.head_dim, bias=False)
            self.o_proj = nn.Linear(c.num_attention_heads * c.head_dim, c.hidden_size, bias=False)

    class Layer(nn.Module):
        def __init__(self, c):
            super().__init__()
            self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
            self.self_attn = Attention(c)
            self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
            self.mlp = MLP(c)

    class Inner(nn.Module):
        def __init__(self, c):
            super().__init__()
            self.embed_tokens = nn.Embedding(c.vocab_size, c.hidden_size)
            self.layers = nn.ModuleList([Layer(c) for _ in range(c.num_hidden_layers)])
            self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)

    class StandInLlama(nn.Module):
        def __init__(self, c):
            super().__init__()
            self.config = c
            self.model = Inner(c)
            self.lm_head = nn.Linear(c.hidden_size, c.vocab_size, bias=False)
            for m in self.modules():
                if isinstance(m, (nn.Linear, nn.Embedding)):
                    m.weight.data.normal_(0.0, c.initializer_range)

        def forward(self, input_ids, use_cache=False, **_kw):
            c = self.config
            H, Hkv, D = c.num_attention_heads, c.num_key_value_heads, c.head_dim
            x = self.model.embed_tokens(input_ids)  # (1, T, hidden)
            T = input_ids.shape[1]
            cos, sin = rope_tables(torch.arange(T, device=input_ids.device), D, c.rope_theta, x.dtype)
            causal = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
            for layer in self.model.layers:
                a = layer.self_attn
                h = layer.input_layernorm(x)
                q = a.q_proj(h).view(1, T, H, D).transpose(1, 2)
                k = a.k_proj(h).view(1, T, Hkv, D).transpose(1, 2)
                v = a.v_proj(h).view(1, T, Hkv, D).transpose(1, 2)
                q = q * cos + rotate_half(q) * sin
                k = k * cos + rotate_half(k) * sin
                k = k[:, :, None].expand(1, Hkv, H // Hkv, T, D).reshape(1, H, T, D)  # repeat_kv
                v = v[:, :, None].expand(1, Hkv, H // Hkv, T, D).reshape(1, H, T, D)
                s = torch.matmul(q.float(), k.float().transpose(-1, -2)) / math.sqrt(D)
                s = s.masked_fill(~causal, float("-inf"))
                o = torch.matmul(torch.softmax(s, dim=-1), v.float()).to(x.dtype)
                x = x + a.o_proj(o.transpose(1, 2).reshape(1, T, H * D))
                x = x + layer.mlp(layer.post_attention_layernorm(x))
            return SimpleNamespace(logits=self.lm_head(self.model.norm(x)))

    return StandInLlama


def build_model(mc, device, seed, use_hf):
    """fp32 model with random weights from ``seed`` (the same in every process)."""
    torch.manual_seed(seed)
    # RoPE base: 10000, the default of every transformers version (rope_theta in 4.x, rope_parameters'
    # default_theta in 5.x), so it is not passed: 5.x's strict configs take no rope_theta
    kw = dict(vocab_size=mc["vocab"], hidden_size=mc["hidden"], intermediate_size=mc["inter"],
              num_hidden_layers=mc["layers"], num_attention_heads=mc["heads"],
              num_key_value_heads=mc["kv_heads"], head_dim=mc["head_dim"],
              rms_norm_eps=1e-5, max_position_embeddings=max(16384, mc["prompt"] + mc["decode"] + 64),
              tie_word_embeddings=False, initializer_range=0.02)
    if use_hf:
        from transformers import LlamaConfig, LlamaForCausalLM

        cfg = LlamaConfig(**kw)
        ctx = device if hasattr(device, "__enter__") else contextlib.nullcontext()
        with ctx:  # initialise on the device (seconds on a GPU, a minute on a CPU)
            model = LlamaForCausalLM(cfg)
        model = model.to(device=device, dtype=torch.float32)
        hd = getattr(model.config, "head_dim", None) or mc["hidden"] // mc["heads"]
        if hd != mc["head_dim"]:
            raise RuntimeError(f"transformers built head_dim {hd}, wanted {mc['head_dim']}")
    else:
        model = standin_llama_class()(SimpleNamespace(rope_theta=10000.0, **kw)).to(device=device,
                                                                                    dtype=torch.float32)
    # the weights from the seed alone, whatever a transformers version's own init does:
    # N(0, initializer_range) as LlamaPreTrainedModel._init_weights draws them, norms 1
    torch.manual_seed(seed)
    for name, p in model.named_parameters():
        if name.endswith("norm.weight"):
            p.fill_(1.0)
        else:
            p.normal_(0.0, kw["initializer_range"])
    return model.eval()


def weights_digest(model) -> str:
    """A digest of every parameter (a strided sample of each): equal in every
    process iff the weights are (the seed and the library versions agree)."""
    h = hashlib.sha256()
    for name, p in model.named_parameters():
        flat = p.detach().reshape(-1)
        step = max(1, flat.numel() // 4096)
        h.update(name.encode())
        h.update(flat[::step].contiguous().view(torch.uint8).cpu().numpy().tobytes())
    return h.hexdigest()[:32]


def make_prompt(vocab, n, seed):
    g = torch.Generator().manual_seed(seed + 7)
    return torch.randint(0, vocab, (n,), generator=g).tolist()


class Rope:
    """cos/sin of positions: the model's own rotary module where it has one
    (transformers' LlamaRotaryEmbedding), else rope_tables with rope_theta."""

    def __init__(self, model, head_dim, device):
        self.device = device
        self.head_dim = head_dim
        self.theta = float(getattr(model.config, "rope_theta", 10000.0) or 10000.0)
        self.hf = None
        inner = getattr(model, "model", None)
        for cand in (getattr(inner, "rotary_emb", None),
                     getattr(getattr(inner.layers[0], "self_attn", None), "rotary_emb", None)):
            if cand is None:
                continue
            try:
                cos, _ = cand(torch.zeros(1, dtype=torch.float32, device=device),
                              torch.arange(2, device=device)[None])
                if tuple(cos.shape[-2:]) == (2, head_dim):
                    self.hf = cand
                    break
            except Exception:
                continue
        self.source = "model.rotary_emb" if self.hf is not None else f"rope_theta={self.theta}"

    def __call__(self, pos, dtype):
        if self.hf is not None:
            cos, sin = self.hf(torch.zeros(1, dtype=dtype, device=self.device), pos[None])
            return cos[0].to(dtype), sin[0].to(dtype)
        return rope_tables(pos, self.head_dim, self.theta, dtype)


# =============================================================================
# The paged KV cache and the paged forward
# =============================================================================


def _identity(x):
    return x


class PagedLlama:
    """The model's modules over a vLLM-layout paged KV cache."""

    def __init__(self, model, mc, device, dtype, layout, num_blocks, tp=None):
        c = model.config
        self.model, self.device, self.dtype, self.layout = model, device, dtype, layout
        self.L, self.H, self.Hkv = c.num_hidden_layers, c.num_attention_heads, c.num_key_value_heads
        # tp: (rank, world, all-reduce) of a model shard_model() sharded: this rank's heads, and
        # the sum over ranks after the row-parallel o_proj and down_proj
        self.tp_rank, self.tp_world, self.reduce = tp if tp is not None else (0, 1, _identity)
        self.H, self.Hkv = self.H // self.tp_world, self.Hkv // self.tp_world
        self.D, self.B, self.num_blocks = mc["head_dim"], BLOCK, num_blocks
        self.layers = model.model.layers
        self.rope = Rope(model, self.D, device)
        self.kv = []
        for _ in range(self.L):
            if layout == "HND":  # physical (2, nb, H, bs, D); vLLM hands out the (2, nb, bs, H, D) view
                t = torch.zeros(2, num_blocks, self.Hkv, self.B, self.D, dtype=dtype, device=device)
                self.kv.append(t.permute(0, 1, 3, 2, 4))
            else:
                self.kv.append(torch.zeros(2, num_blocks, self.B, self.Hkv, self.D, dtype=dtype, device=device))
        self.esize = torch.tensor([], dtype=dtype).element_size()
        self.object_size = self.L * 2 * self.B * self.Hkv * self.D * self.esize
        self.sdpa = getattr(F, "scaled_dot_product_attention", None)
        self.sdpa_kw = {}
        if self.sdpa is not None:
            try:
                x = torch.zeros(1, 1, 2, 8, device=device, dtype=dtype)
                self.sdpa(x, x, x, scale=0.5)
                self.sdpa_kw = {"scale": self.D ** -0.5}
            except TypeError:
                pass

    def sync(self):
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def wipe(self):
        for t in self.kv:
            t.zero_()

    def _attend(self, q, K, V, start):
        T, rep = q.shape[0], self.H // self.Hkv
        end = start + T
        qh = q.transpose(0, 1)[None]  # (1, H, T, D)
        kh = K.transpose(0, 1).repeat_interleave(rep, dim=0)[None]  # (1, H, end, D), head h <- kv head h // rep
        vh = V.transpose(0, 1).repeat_interleave(rep, dim=0)[None]
        mask = None
        causal = start == 0 and T > 1
        if start > 0 and T > 1:  # a chunk after a prefix: query i sees keys <= start + i
            mask = (torch.arange(end, device=q.device)[None, :]
                    <= torch.arange(start, end, device=q.device)[:, None])
        if self.sdpa is not None and T > 16:
            o = self.sdpa(qh, kh, vh, attn_mask=mask, is_causal=causal, **self.sdpa_kw)
        else:
            # torch 1.x (CPU tests), and every short step (decode, the last
            # block): plain fp32 matmuls, which cuBLAS computes identically in
            # every run (CUBLAS_WORKSPACE_CONFIG), where the fused SDPA
            # kernels of a one-token query did not: the reference's own
            # greedy decode differed between runs on the H200.
            s = torch.matmul(qh.float(), kh.float().transpose(-1, -2)) * (self.D ** -0.5)
            if causal:
                mask = torch.ones(T, end, dtype=torch.bool, device=q.device).tril()
            if mask is not None:
                s = s.masked_fill(~mask, float("-inf"))
            o = torch.matmul(torch.softmax(s, dim=-1), vh.float()).to(q.dtype)
        return o[0].transpose(0, 1).reshape(T, self.H * self.D)

    def forward(self, tokens, start, table, hooks=None, all_logits=False):
        """Tokens at positions [start, start+T) of a request whose blocks are
        ``table`` (a long tensor of block ids, position p in block table[p // 16]).
        Returns float logits (T, V) with all_logits, else (1, V) of the last."""
        m = self.model.model
        T = tokens.numel()
        end = start + T
        B = self.B
        pos = torch.arange(start, end, device=self.device)
        h = m.embed_tokens(tokens)
        cos, sin = self.rope(pos, h.dtype)
        cos, sin = cos[:, None, :], sin[:, None, :]
        blk, off = table[pos // B], pos % B
        ctx_blocks = table[:cdiv(end, B)]
        for i, layer in enumerate(self.layers):
            a = layer.self_attn
            x = layer.input_layernorm(h)
            q = a.q_proj(x).view(T, self.H, self.D)
            k = a.k_proj(x).view(T, self.Hkv, self.D)
            v = a.v_proj(x).view(T, self.Hkv, self.D)
            q = q * cos + rotate_half(q) * sin
            k = k * cos + rotate_half(k) * sin
            if hooks is not None:
                hooks.before_attention(i)  # vLLM: wait_for_layer_load inside the attention op
            cache = self.kv[i]
            cache[0][blk, off] = k
            cache[1][blk, off] = v
            K = cache[0].index_select(0, ctx_blocks).reshape(-1, self.Hkv, self.D)[:end]
            V = cache[1].index_select(0, ctx_blocks).reshape(-1, self.Hkv, self.D)[:end]
            h = h + self.reduce(a.o_proj(self._attend(q, K, V, start)))
            h = h + self.reduce(layer.mlp(layer.post_attention_layernorm(h)))
            if hooks is not None:
                hooks.after_attention(i)  # vLLM: save_kv_layer
        if not all_logits:
            h = h[-1:]
        return self.model.lm_head(m.norm(h)).float()

    def digests(self, block_ids):
        """sha256 (hex, 32 chars) of each block: every layer's K and V in the
        logical (2, 16, H, D) order, so layouts compare equal."""
        out = []
        for c in range(0, len(block_ids), 64):
            idx = torch.tensor(block_ids[c:c + 64], dtype=torch.long, device=self.device)
            parts = [t.index_select(1, idx).permute(1, 0, 2, 3, 4).contiguous() for t in self.kv]
            blob = torch.stack(parts, 1).view(torch.uint8).cpu().numpy()
            out.extend(hashlib.sha256(blob[j].tobytes()).hexdigest()[:32] for j in range(blob.shape[0]))
        return out


def validate(model, mc, device, dtype, prompt, C, strict, paged=None, what="paged forward = the model's forward"):
    """The paged forward (two prefill chunks, the second after a prefix, then
    teacher-forced decode steps) against the model's own forward on a short
    prompt that does not end on a block boundary.  paged: a function making
    the PagedLlama under test (TP: this rank's shard of the model)."""
    name = str(dtype).replace("torch.", "")
    pm = paged() if paged is not None else PagedLlama(model, mc, device, dtype, "NHD", 8)
    p0, steps, c1 = min(45, len(prompt) - 1), 8, 21
    seq = list(prompt[:p0])
    for _ in range(steps):  # the model's own greedy decode (full forward each step)
        logits = model(torch.tensor(seq, device=device)[None], use_cache=False).logits[0, -1]
        seq.append(int(torch.argmax(logits.float())))
    ref = model(torch.tensor(seq, device=device)[None], use_cache=False).logits[0].float()
    t = torch.tensor(seq, device=device)
    table = torch.tensor(list(range(1, 1 + cdiv(len(seq), BLOCK)))[::-1], dtype=torch.long, device=device)
    parts = [pm.forward(t[:c1], 0, table, all_logits=True), pm.forward(t[c1:p0], c1, table, all_logits=True)]
    for p in range(p0, len(seq) - 1):
        parts.append(pm.forward(t[p:p + 1], p, table, all_logits=True))
    mine = torch.cat(parts)
    want = ref[:len(seq) - 1]
    err = float((mine - want).abs().max() / want.abs().max())
    greedy = mine[p0 - 1:].argmax(-1).tolist()
    agree = sum(int(a == b) for a, b in zip(greedy, seq[p0:]))
    src = f"rope from {pm.rope.source}; {p0}-token prompt in chunks of {c1}+{p0 - c1}, {steps} decode steps"
    if strict:
        C.add(f"{what} ({name}): logits", err < 1e-3, f"max rel err {err:.2e}; {src}")
        C.add(f"{what} ({name}): greedy tokens", greedy == seq[p0:], f"{agree}/{steps} tokens agree")
    else:
        C.add(f"{what} ({name}): logits within bf16 rounding", err < 0.1,
              f"max rel err {err:.2e}; greedy {agree}/{steps} tokens agree (informational in {name})")
    del pm


# =============================================================================
# Glue to the harness (branch vllm): scheduler, worker and engine stand-ins
# =============================================================================


class NullConnector:
    """No connector (vLLM without kv_transfer_config): the reference engine."""

    def get_num_new_matched_tokens(self, request, num_computed_tokens):
        return 0, False

    def update_state_after_alloc(self, request, blocks, num_external_tokens):
        pass

    def build_connector_meta(self, scheduler_output):
        return None

    def update_connector_output(self, out):
        pass

    def request_finished_all_groups(self, request, block_ids):
        return False, None

    def take_events(self):
        return ()

    def bind_connector_metadata(self, meta):
        pass

    def handle_preemptions(self, meta=None):
        pass

    def start_load_kv(self, forward_context, **kw):
        pass

    def wait_for_layer_load(self, layer_name):
        pass

    def save_kv_layer(self, layer_name, kv_layer, attn_metadata, **kw):
        pass

    def wait_for_save(self):
        pass

    def get_finished(self, finished_req_ids):
        return None, None

    def get_block_ids_with_load_errors(self):
        return set()

    def get_kv_connector_stats(self):
        return None

    def get_kv_connector_kv_cache_events(self):
        return None

    def build_connector_worker_meta(self):
        return None

    def clear_connector_metadata(self):
        pass

    def debug_counters(self):
        return {"rank": 0, "jobs_submitted": 0, "jobs_completed": 0, "jobs_released": 0, "jobs_inflight": 0}

    def shutdown(self):
        pass


class Timed:
    """A connector with instruments, for both roles; every call passes through.
    Scheduler role: how long each get_num_new_matched_tokens took.  Worker
    role: when start_load_kv was last entered, how long each load took (sync
    loads: noted by the forward once the first layer's wait returns; async:
    from start_load_kv to the results reporting the request in finished
    recving), the stats the worker reported; the --inject faults."""

    def __init__(self, conn):
        self._conn = conn
        self.meta = None
        self.t_start_load = None
        self.lookup_s = []
        self.load_s = []  # (rid, seconds, blocks)
        self.stats = collections.Counter()
        self._async = None

    def get_num_new_matched_tokens(self, request, num_computed_tokens):
        t = now()
        try:
            return self._conn.get_num_new_matched_tokens(request, num_computed_tokens)
        finally:
            self.lookup_s.append(now() - t)

    def bind_connector_metadata(self, meta):
        self.meta = meta
        if INJECT == "rotate-loads":  # self-test: every restored block lands one position off
            for p in getattr(meta, "loads", None) or ():
                ids = [int(b) for b in _plan_ids(p)]
                p.block_ids = ids[1:] + ids[:1]
        return self._conn.bind_connector_metadata(meta)

    def start_load_kv(self, forward_context, **kw):
        self.t_start_load = now()
        mine = [p for p in (getattr(self.meta, "loads", None) or ()) if p.is_async]
        if mine:
            self._async = (mine[0].req_id, self.t_start_load, sum(len(_plan_ids(p)) for p in mine))
        return self._conn.start_load_kv(forward_context, **kw)

    def _note(self, recving):
        if self._async is not None and self._async[0] in (recving or ()):
            rid, t0, nblk = self._async
            self.load_s.append((rid, now() - t0, nblk))
            self._async = None

    def take_stats(self):
        out, self.stats = dict(self.stats), collections.Counter()
        return out

    def __getattr__(self, name):
        attr = getattr(self._conn, name)  # AttributeError where the connector has no such member
        if name == "get_finished":
            def get_finished(*a, **kw):
                res = attr(*a, **kw)
                self._note(res[1])
                return res
            return get_finished
        if name == "get_transfer_results":
            def get_transfer_results(*a, **kw):
                res = attr(*a, **kw)
                self._note(res.finished_recving)
                return res
            return get_transfer_results
        if name == "get_kv_connector_stats":
            def get_kv_connector_stats():
                st = attr()
                for k, v in (getattr(st, "data", None) or {}).items():
                    if isinstance(v, (int, float)):
                        self.stats[k] += v
                return st
            return get_kv_connector_stats
        return attr


class DirectConnector:
    """Both halves of a connector in the plain umbp calls UMBPConnector makes
    (--path direct): one Runtime per worker, keys from the engine block hashes
    (umbp.derive_keys), the scheduler's lookup (the worker's runtime in
    embedded mode, a ``role: lookup`` session in standalone mode, umbp.LookupClient
    asking umbp-master in distributed mode), load_blocks
    before the first attention, store_blocks after the forward with a CUDA
    event, delayed frees while stores are in flight.  One KV cache group, TP=1."""

    def __init__(self, umbp, spec, n_layers, is_cuda):
        self.umbp = umbp
        self.B = BLOCK
        cfg = {"mode": spec["mode"], "timeout_ms": 30000}
        if spec["mode"] == "embedded":
            cfg["capacity_bytes"] = spec["capacity"]
        elif spec["mode"] == "distributed":
            cfg.update(distributed_options(spec))
        else:
            cfg["socket_dir"] = spec["socket_dir"]
        if not is_cuda:
            cfg["gpu_backend"] = "host"
        self.rt = umbp.Runtime(cfg)
        self.lrt = self.rt
        self.client = None
        if spec["mode"] == "standalone":
            self.lrt = umbp.Runtime({"mode": "standalone", "socket_dir": spec["socket_dir"], "role": "lookup"})
        elif spec["mode"] == "distributed":  # the scheduler owns no pool: it asks the master
            self.client = umbp.LookupClient({"mode": "distributed", "master_address": spec["master_address"],
                                             "num_ranks": 1,
                                             "lookup_timeout_ms": distributed_options(spec)["lookup_timeout_ms"]})
        dt = spec["dtype"]
        self.ns = umbp.Namespace.derive(spec["model_name"] + "+direct", "", BLOCK, spec["layout"], dt,
                                        groups=[("full", BLOCK, n_layers, dt)])
        self.load_async = bool(spec["load_async"])
        self.is_cuda = is_cuda
        self.kv = None
        self.reqs, self.tables, self.stored = {}, {}, {}
        self.queued, self.meta, self.sync_jobs, self.jobs = [], None, [], []
        self.async_rids, self.delayed, self.finished, self.failed = set(), set(), set(), set()
        self.stats = collections.Counter()
        self.n_submitted = self.n_completed = 0
        self.closed = False

    # -- scheduler half --
    def _keys(self, req, lo, hi):
        return self.umbp.derive_keys(self.ns, rank=(0, 0, 0, 0), group=0,
                                     hashes=[bytes(h) for h in req.block_hashes[lo:hi]])

    def get_num_new_matched_tokens(self, request, num_computed_tokens):
        self.reqs[request.request_id] = request
        lo = num_computed_tokens // self.B
        kmax = min((request.num_tokens - 1) // self.B, len(request.block_hashes))
        if kmax <= lo:
            return 0, False
        keys = self._keys(request, lo, kmax)
        if self.client is not None:
            import numpy as np

            prefix, _present, rc = self.client.query_ex(np.asarray(keys)[None],
                                                        row_rank=np.zeros(1, dtype=np.uint32))
            prefix = int(prefix) if rc >= 0 else 0
        else:
            prefix, _ = self.lrt.lookup(keys)
        return prefix * self.B, self.load_async and prefix > 0

    def update_state_after_alloc(self, request, blocks, num_external_tokens):
        rid = request.request_id
        self.reqs[rid] = request
        ids = list(blocks.get_block_ids()[0])
        k = num_external_tokens // self.B
        self.stored[rid] = max(self.stored.get(rid, 0), k)  # hit blocks are not stored again
        if k:
            self.queued.append(SimpleNamespace(req_id=rid, keys=self._keys(request, 0, k), block_ids=ids[:k],
                                               is_async=self.load_async))
            if self.load_async:
                self.async_rids.add(rid)

    def _plan(self, rid, total, out):
        req = self.reqs[rid]
        hi = min(total // self.B, req.num_prompt_tokens // self.B, len(req.block_hashes))
        lo = self.stored.get(rid, 0)
        if hi > lo:
            out.append(SimpleNamespace(req_id=rid, keys=self._keys(req, lo, hi), block_ids=self.tables[rid][lo:hi]))
            self.stored[rid] = hi

    def build_connector_meta(self, so):
        stores = []
        for nr in so.scheduled_new_reqs:
            self.tables[nr.req_id] = list(nr.block_ids[0])
            self._plan(nr.req_id, nr.num_computed_tokens + so.num_scheduled_tokens[nr.req_id], stores)
        c = so.scheduled_cached_reqs
        for i, rid in enumerate(c.req_ids):
            if c.new_block_ids[i]:
                self.tables[rid].extend(c.new_block_ids[i][0])
            self._plan(rid, c.num_computed_tokens[i] + so.num_scheduled_tokens[rid], stores)
        meta = SimpleNamespace(loads=self.queued, stores=stores)
        self.queued = []
        return meta

    def update_connector_output(self, out):
        pass

    def request_finished_all_groups(self, request, block_ids):
        rid = request.request_id
        self.reqs.pop(rid, None)
        self.tables.pop(rid, None)
        self.stored.pop(rid, None)
        if any(j[0] == "store" and j[1] == rid for j in self.jobs):
            self.delayed.add(rid)
            return True, None
        return False, None

    def take_events(self):
        return ()

    # -- worker half --
    def register_kv_caches(self, kv_caches):
        self.kv = self.rt.register_kv_caches(kv_caches)

    def bind_connector_metadata(self, meta):
        self.meta = meta

    def handle_preemptions(self, meta=None):
        pass

    def _event(self):
        if not self.is_cuda:
            return None
        ev = torch.cuda.Event()
        ev.record(torch.cuda.current_stream())
        return ev

    def start_load_kv(self, forward_context, **kw):
        if self.meta is None or not self.meta.loads:
            return
        ev = self._event()
        for p in self.meta.loads:
            job = self.rt.load_blocks(self.kv, p.keys, p.block_ids, wait_event=ev)
            self.n_submitted += 1
            (self.jobs if p.is_async else self.sync_jobs).append(["load", p.req_id, job, p.block_ids, ev])

    def _complete(self, j):
        kind, _rid, job, ids, _ev = j
        st = job.statuses
        ok = int((st == 0).sum())
        self.stats[f"{kind}_blocks_ok"] += ok
        self.stats[f"{kind}_blocks_failed"] += len(ids) - ok
        if kind == "load":
            self.failed.update(int(ids[i]) for i in range(len(ids)) if st[i] != 0)
        job.release()
        self.n_completed += 1

    def wait_for_layer_load(self, layer_name):
        for j in self.sync_jobs:
            if not j[2].wait(35000):
                raise RuntimeError("umbp load did not complete in 35 s")
            self._complete(j)
        self.sync_jobs = []

    def save_kv_layer(self, layer_name, kv_layer, attn_metadata, **kw):
        pass

    def wait_for_save(self):
        if self.meta is None or not self.meta.stores:
            return
        ev = self._event()
        for p in self.meta.stores:
            self.jobs.append(["store", p.req_id, self.rt.store_blocks(self.kv, p.keys, p.block_ids, wait_event=ev),
                              p.block_ids, ev])
            self.n_submitted += 1

    def get_finished(self, finished_req_ids):
        self.finished |= set(finished_req_ids or ())
        keep = []
        for j in self.jobs:
            if j[2].poll():
                self._complete(j)
            else:
                keep.append(j)
        self.jobs = keep
        busy = {(j[0], j[1]) for j in keep}
        sending = {r for r in self.delayed & self.finished if ("store", r) not in busy}
        recving = {r for r in self.async_rids if ("load", r) not in busy}
        self.delayed -= sending
        self.finished -= sending
        self.async_rids -= recving
        return sending or None, recving or None

    def get_block_ids_with_load_errors(self):
        out, self.failed = self.failed, set()
        return out

    def get_kv_connector_stats(self):
        if not self.stats:
            return None
        out, self.stats = SimpleNamespace(data=dict(self.stats)), collections.Counter()
        return out

    def get_kv_connector_kv_cache_events(self):
        return None

    def build_connector_worker_meta(self):
        return None

    def clear_connector_metadata(self):
        self.meta = None

    def debug_counters(self):
        n = len(self.jobs) + len(self.sync_jobs)
        return {"rank": 0, "jobs_submitted": self.n_submitted, "jobs_completed": self.n_completed,
                "jobs_released": self.n_completed, "jobs_inflight": n, "held_requests": len(self.delayed)}

    def shutdown(self):
        if self.closed:
            return
        self.closed = True
        for j in self.jobs + self.sync_jobs:
            j[2].wait(35000)
            self._complete(j)
        self.jobs, self.sync_jobs = [], []
        if self.kv is not None:
            self.rt.deregister(self.kv)
        if self.lrt is not self.rt:
            self.lrt.close()
        if self.client is not None:
            self.client.close()
        self.rt.close()


def load_harness():
    """Imports the fake vllm and the harness (branch vllm) and builds the
    engine classes over them."""
    for p in (HARNESS_DIR, TESTS_DIR):
        if p not in sys.path:
            sys.path.insert(0, p)
    import vllm

    if not getattr(vllm, "FAKE", False):
        raise RuntimeError(f"import vllm found {vllm.__file__}, not the harness's fake vllm")
    from vllm_harness import engine as he
    from vllm_harness.config import FULL, HarnessConfig
    from vllm_harness.worker import HarnessWorker

    class _SyncModel:
        """The harness predicts async scheduling's placeholder tokens with its
        deterministic fake model; a real model cannot, so this engine schedules
        synchronously, where the tokens a step needs are the request's."""

        GARBAGE = he.model.GARBAGE

        @staticmethod
        def predict(tokens, n):
            if n:
                raise RuntimeError("the mini engine runs sync scheduling only")
            return list(tokens)

    he.model = _SyncModel  # (the fake model's digests cost ~15 ms per 10k-token step)

    @dataclasses.dataclass
    class MiniConfig(HarnessConfig):
        dtype: str = "bfloat16"

        def kv_cache_config(self):
            from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec, KVCacheTensor

            names = [n for n, *_ in self.layers()]
            esize = 4 if self.dtype == "float32" else 2
            page = 2 * self.block_size * self.heads * self.dim * esize
            spec = FullAttentionSpec(block_size=self.block_size, num_kv_heads=self.heads, head_size=self.dim,
                                     dtype=self.dtype)
            return KVCacheConfig(num_blocks=self.num_blocks,
                                 kv_cache_tensors=[KVCacheTensor(size=page * self.num_blocks, shared_by=[n])
                                                   for n in names],
                                 kv_cache_groups=[KVCacheGroupSpec(layer_names=names, kv_cache_spec=spec)])

        def vllm_config(self, rank=0):
            vc = super().vllm_config(rank)
            vc.model_config.dtype = self.dtype
            return vc

    class MiniScheduler(he.HarnessScheduler):
        """The harness's scheduler; its free queue shuffled; a prompt's last
        block computed in a step of its own (see the module docstring)."""

        def __init__(self, cfg, conn, seed):
            super().__init__(cfg, conn)
            ids = list(range(1, cfg.num_blocks))
            random.Random(seed).shuffle(ids)
            self.pool.free_q = collections.OrderedDict((b, None) for b in ids)
            self.chunks = collections.defaultdict(list)  # rid -> tokens scheduled per step

        def _split(self, req, n, new_local=0, ext=0):
            n = super()._split(req, n, new_local, ext)
            c = req.num_computed_tokens + new_local + ext
            last = (req.num_tokens - 1) // self.B * self.B
            if n > 1 and c < last < c + n:
                return last - c
            return n

        def schedule(self):
            so, tokens = super().schedule()
            for rid, n in so.num_scheduled_tokens.items():
                self.chunks[rid].append(n)
            return so, tokens

    class MiniWorker(HarnessWorker):
        """The harness's worker order around the paged forward of a real model:
        ``_write`` (the harness's two-phase step: execute_check, execute_finish)
        or ``_forward`` (its one-phase execute) runs the forward, whose layers
        call wait_for_layer_load and save_kv_layer as vLLM's attention layers
        do.  ``_check`` is empty: a real model cannot check what it attends to;
        the scenarios compare outcomes instead."""

        def __init__(self, cfg, pm, conn):  # noqa: super().__init__ builds the fake model's tensors
            self.cfg, self.rank, self.B, self.pm, self.dev, self.cross = cfg, 0, cfg.block_size, pm, pm.device, None
            self.layers = cfg.layers()
            self.conn = conn  # a Timed connector
            self.kv = {name: pm.kv[i] for i, (name, *_r) in enumerate(self.layers)}
            self.reqs, self.digest_cache, self.calls, self.preemption_args = {}, {}, [], []
            self._so = None
            self.first = {}  # rid -> (time of the first token, its logits)
            self.token_t = collections.defaultdict(list)
            self._sync_load = None
            self._loaded_ids = []

        def _check(self, tokens, work):
            return set()

        def _write(self, tokens, work, bad):
            return self._run(self._so, tokens, work)

        def _forward(self, so, tokens, work):
            return self._run(so, tokens, work), set()

        def _run(self, so, tokens, work):
            loads = list(getattr(so.kv_connector_metadata, "loads", None) or ())
            out = {}
            for rid, c, n in work:
                mine = [p for p in loads if p.req_id == rid and not p.is_async]
                self._sync_load = (rid, sum(len(_plan_ids(p)) for p in mine)) if mine else None
                self._loaded_ids = [int(b) for p in mine for b in _plan_ids(p)]
                table = torch.tensor(self.reqs[rid][0], dtype=torch.long, device=self.pm.device)
                toks = torch.tensor(tokens[rid][c:c + n], dtype=torch.long, device=self.pm.device)
                logits = self.pm.forward(toks, c, table, hooks=self)
                if c + n == len(tokens[rid]):
                    tok = int(torch.argmax(logits[-1]))  # waits for the GPU
                    t = now()
                    out[rid] = tok
                    self.token_t[rid].append(t)
                    if rid not in self.first:
                        self.first[rid] = (t, logits[-1].clone())
            return out

        def before_attention(self, i):
            self.conn.wait_for_layer_load(self.layers[i][0])
            if i == 0 and self._sync_load is not None:
                rid, nblk = self._sync_load
                self.conn.load_s.append((rid, now() - self.conn.t_start_load, nblk))
                self._sync_load = None
                lost = {"lose-restore": self._loaded_ids,
                        "lose-one-block": self._loaded_ids[len(self._loaded_ids) // 2:][:1]}.get(INJECT)
                if lost:  # self-test: the restore "succeeded" but these blocks hold zeros
                    idx = torch.tensor(lost, dtype=torch.long, device=self.pm.device)
                    for t in self.pm.kv:
                        t.index_fill_(1, idx, 0)

        def after_attention(self, i):
            name = self.layers[i][0]
            self.conn.save_kv_layer(name, self.kv[name], None)

    class MiniEngine(he.Engine):
        """The harness's Engine (add, step, run, matched, check_clean,
        shutdown) over one MiniWorker."""

        def __init__(self, cfg, worker, conn, seed):  # noqa: super().__init__ builds fake workers
            self.cfg, self.workers, self.conn = cfg, [worker], conn
            self.sched = MiniScheduler(cfg, conn, seed)
            self.agg = he.Aggregator(1)
            self.prev, self.bad, self.steps, self.closed = None, [], 0, False

    class MiniTPEngine(he.Engine):
        """TP: the harness's Engine over the MiniWorkers of a TPGroup's rank
        processes (engine ``eid`` in each).  A step goes to every rank at once
        (their forwards meet in the all-reduces) and the outputs are
        aggregated as vLLM's KVOutputAggregator does.  ``front`` is what
        run_request reads of a worker: rank 0's first tokens and timings."""

        def __init__(self, cfg, grp, eid, conn, seed):  # noqa: super().__init__ builds fake workers
            self.cfg, self.conn, self.grp, self.eid = cfg, conn, grp, eid
            self.workers = [TPWorkerProxy(grp, r, eid) for r in range(grp.world)]
            self.sched = MiniScheduler(cfg, conn, seed)
            self.agg = he.Aggregator(grp.world)
            self.prev, self.bad, self.steps, self.closed = None, [], 0, False
            self.front = SimpleNamespace(first={}, token_t=collections.defaultdict(list),
                                         conn=SimpleNamespace(load_s=[], take_stats=self._take_stats))
            self.disagree = []  # (step, rid): ranks sampled different tokens or saw different logits

        def _take_stats(self):
            per = self.grp.call_all("take_stats", self.eid)
            out = {}
            for k in set().union(*per):
                vals = [st.get(k, 0) for st in per]
                out[k] = min(vals) if k.endswith("_ok") else max(vals)  # what every rank did
            out["per_rank"] = per
            return out

        def step(self, before_execute=None):
            so, tokens = self.sched.schedule()
            if before_execute is not None:
                before_execute(so)
            outs = self.grp.call_all("execute", self.eid, so, tokens)
            minis = [o.pop("mini") for o in outs]
            f = self.front
            for rid, (t, lg) in minis[0]["first"].items():
                f.first[rid] = (t, lg)
                if any(not torch.equal(lg, m["first"][rid][1]) for m in minis[1:] if rid in m["first"]):
                    self.disagree.append((so._harness_step, rid))
            for rid, ts in minis[0]["token_t"].items():
                f.token_t[rid].extend(ts)
            for x in zip(*[m["load_s"] for m in minis]):  # the slowest rank's load
                f.conn.load_s.append((x[0][0], max(y[1] for y in x), x[0][2]))
            if any(o["sampled"] != outs[0]["sampled"] for o in outs[1:]):
                self.disagree.append((so._harness_step, "sampled"))
            out = self.agg.aggregate(outs)
            self.bad.extend((so._harness_step, r) for r in out["bad"])
            self.steps += 1
            self.sched.update_from_output(so, out)
            return so

        def shutdown(self):
            if self.closed:
                return
            self.closed = True
            try:
                self.conn.shutdown()
            finally:
                self.grp.call_all("shutdown_engine", self.eid)

    return SimpleNamespace(he=he, FULL=FULL, MiniConfig=MiniConfig, MiniWorker=MiniWorker, MiniEngine=MiniEngine,
                           MiniTPEngine=MiniTPEngine, HarnessError=he.HarnessError)


def connector_available():
    """(True, where) when umbp.vllm.connector and the harness import here."""
    if not os.path.isdir(os.path.join(HARNESS_DIR, "vllm")):
        return False, f"no fake vllm package under {HARNESS_DIR}"
    try:
        load_harness()
        import umbp.vllm.connector as c
    except Exception as e:  # noqa: BLE001
        return False, f"umbp.vllm.connector or the harness do not import: {e!r}"
    return True, c.__file__


def distributed_options(spec):
    """A node's options in the distributed scenario (each engine process's
    worker runtime is a node of its own).  lookup_timeout_ms is raised from
    the connector's 100 ms: a lookup that the loaded CI machine answers late
    would be a miss, and this scenario checks hits, not lookup latency."""
    return {"master_address": spec["master_address"], "capacity_bytes": spec["capacity"],
            "heartbeat_ms": spec["heartbeat_ms"], "lookup_timeout_ms": 5000}


def make_engine(H, spec, pm, kind, seed):
    """An engine over pm's KV tensors with no connector, UMBPConnector, or
    DirectConnector (kind: none | connector | direct)."""
    import umbp

    cfg = H.MiniConfig(groups=[(H.FULL, pm.L, 0)], block_size=BLOCK, num_blocks=pm.num_blocks, tp=1,
                       extra={}, max_num_batched_tokens=spec["max_batched"], max_num_seqs=1,
                       async_scheduling=False, heads=pm.Hkv, dim=pm.D, model=spec["model_name"], dtype=spec["dtype"],
                       device=str(pm.device))
    names = [n for n, *_ in cfg.layers()]
    if kind == "none":
        sc = wc = NullConnector()
    elif kind == "direct":
        sc = wc = DirectConnector(umbp, spec, pm.L, pm.device.type == "cuda")
        wc.register_kv_caches(dict(zip(names, pm.kv)))
    else:
        from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole

        from umbp.vllm.connector import UMBPConnector

        extra = {"mode": spec["mode"], "load_async": bool(spec["load_async"]), "timeout_ms": 30000}
        if spec["mode"] == "embedded":
            extra.update(capacity_bytes=spec["capacity"], lookup_dir=spec["lookup_dir"])
        elif spec["mode"] == "distributed":
            extra.update(distributed_options(spec))
        else:
            extra["socket_dir"] = spec["socket_dir"]
        cfg.extra = extra
        # a worker registers its KV caches at start-up, before the scheduler's first lookup
        wc = UMBPConnector(cfg.vllm_config(0), KVConnectorRole.WORKER, cfg.kv_cache_config())
        wc.register_kv_caches(dict(zip(names, pm.kv)))
        sc = UMBPConnector(cfg.vllm_config(0), KVConnectorRole.SCHEDULER, cfg.kv_cache_config())
    sc = Timed(sc)
    wc = Timed(wc) if wc is not sc._conn else sc
    return H.MiniEngine(cfg, H.MiniWorker(cfg, pm, wc), sc, seed)


@dataclasses.dataclass
class Gen:
    rid: str
    tokens: list
    hit_tokens: int
    blocks: list  # the request's block ids at finish (group 0)
    ttft_s: float
    total_s: float
    decode_s_per_token: float
    lookup_s: float
    load_s: float | None
    loaded_blocks: int
    first_logits: object
    stats: dict
    truncated: list


def _plan_ids(p):
    """A load plan's block ids as ints: the connector sends them as bytes of
    int64 (metadata.ids_of), older plans as a list."""
    f = getattr(p, "block_id_array", None)
    return f().tolist() if f else list(p.block_ids)


def run_request(E, pm, rid, prompt, n_out):
    """One request through engine E, from the scheduler's queue to its blocks'
    release (a held request is stepped until its stores finished)."""
    w = getattr(E, "front", None) or E.workers[0]  # TP: the ranks' workers seen as one
    nl, nk = len(w.conn.load_s), len(E.conn.lookup_s)
    pm.sync()
    E.add(rid, prompt, n_out)  # (the request's block hashes are computed here, outside TTFT)
    t0 = now()
    E.run(max_steps=n_out + 30000)
    t_end = now()
    t_first, logits = w.first.pop(rid)
    tt = w.token_t.pop(rid)
    m = E.matched(rid)
    loads = [x for x in w.conn.load_s[nl:] if x[0] == rid]
    return Gen(rid=rid, tokens=list(E.sched.outputs[rid]), hit_tokens=int(m[1]) if m else 0,
               blocks=list(E.sched.finished_blocks[rid][0]), ttft_s=t_first - t0, total_s=t_end - t0,
               decode_s_per_token=(tt[-1] - tt[0]) / max(1, len(tt) - 1),
               lookup_s=sum(E.conn.lookup_s[nk:]), load_s=sum(x[1] for x in loads) if loads else None,
               loaded_blocks=sum(x[2] for x in loads), first_logits=logits, stats=w.conn.take_stats(),
               truncated=[x for x in E.sched.log if x[0] == "truncated" and x[1] == rid])


# =============================================================================
# Scenario roles (each in its own process)
# =============================================================================


class Scenario:
    def __init__(self, spec):
        self.spec = spec
        self.C = Checks()
        self.timings = {}
        self.info = {}
        self.ref_digests = []

    def result(self, error=None):
        return {"name": self.spec["name"], "role": self.spec["role"], "checks": self.C.items,
                "timings": self.timings, "info": self.info, "error": error}


def setup(sc):
    """Model (validated where asked), paged cache, prompt."""
    spec, C = sc.spec, sc.C
    mc = spec["model_cfg"]
    dev = torch.device(spec["device"])
    if dev.type == "cuda":
        if dev.index is None:  # set_device wants an index
            dev = torch.device("cuda", torch.cuda.current_device())
        torch.cuda.set_device(dev)
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    t = now()
    model = build_model(mc, dev, spec["seed"], spec["model"] == "hf")
    prompt = make_prompt(mc["vocab"], mc["prompt"], spec["seed"])
    if spec["validate"]:
        validate(model, mc, dev, torch.float32, prompt, C, strict=True)
    dtype = getattr(torch, spec["dtype"])
    model = model.to(dtype)
    if spec["validate"] and dtype != torch.float32:
        validate(model, mc, dev, dtype, prompt, C, strict=False)
    pm = PagedLlama(model, mc, dev, dtype, spec["layout"], spec["num_blocks"])
    sc.info.update(model=("transformers.LlamaForCausalLM" if spec["model"] == "hf" else "stand-in Llama"),
                   params=sum(p.numel() for p in model.parameters()), weights=weights_digest(model),
                   prompt_sha=hashlib.sha256(json.dumps(prompt).encode()).hexdigest()[:32],
                   object_bytes=pm.object_size, rope=pm.rope.source, setup_s=round(now() - t, 2),
                   sdpa=pm.sdpa is not None)
    log(f"model {sc.info['model']} {sc.info['params'] / 1e6:.0f}M params, {spec['dtype']}, layout {pm.layout}, "
        f"{pm.num_blocks} blocks of {pm.object_size} bytes per object, prompt {len(prompt)} tokens "
        f"(setup {sc.info['setup_s']} s)")
    return pm, prompt


def _last_block_alone(steps, prompt_len):
    """Whether the prefill steps (tokens scheduled per step) end one step
    exactly where the prompt's last block starts."""
    last = (prompt_len - 1) // BLOCK * BLOCK
    done = 0
    for n in steps:
        if done < last < done + n:
            return False
        done += n
        if done >= prompt_len:
            return True
    return False


def reference_phase(sc, E, pm, prompt):
    """Full prefill and decode without a connector (runs+1, the first a warm-up)."""
    spec, C = sc.spec, sc.C
    R, N = spec["runs"], spec["model_cfg"]["decode"]
    runs = []
    for i in range(R + 1 if R else 1):
        runs.append(run_request(E, pm, f"{spec['tag']}-ref{i}", prompt, N))
        if i == 0:  # its blocks are released but untouched until the pool hands them out again
            sc.ref_digests = pm.digests(runs[0].blocks[:len(prompt) // BLOCK])
    ref = runs[0]
    # B computes the last prompt block alone after its restore: the reference
    # must too, or their logits differ by bf16 rounding (different kernels
    # for a 16-token and a 10,000-token step), not by anything umbp did
    chunks = getattr(E.sched, "chunks", {})
    steps = [chunks.get(r.rid, []) for r in runs]
    alone = [_last_block_alone(st, len(prompt)) for st in steps]
    C.add("reference: the prompt's last block is computed in a step of its own (as after a restore)",
          all(alone), f"{sum(alone)}/{len(runs)} runs; first steps {steps[0][:3]}")
    same = [r.tokens == ref.tokens for r in runs]
    C.add("reference: the greedy decode is the same in every run", all(same),
          f"{sum(same)}/{len(runs)} runs; {len(set(ref.tokens))} distinct tokens in {N}")
    dl = max(float((r.first_logits - ref.first_logits).abs().max()) for r in runs)
    sc.info["reference_first_logits_max_diff_across_runs"] = dl
    timed = runs[1:] if R else runs
    one = []
    if R:
        ids = E.sched.pool.allocate(cdiv(len(prompt), BLOCK))
        table = torch.tensor(ids, dtype=torch.long, device=pm.device)
        toks = torch.tensor(prompt, dtype=torch.long, device=pm.device)
        for i in range(R + 1):
            pm.sync()
            t = now()
            int(torch.argmax(pm.forward(toks, 0, table)[-1]))
            if i:
                one.append(now() - t)
        E.sched.pool.free(ids)
    sc.timings.update(ttft_full_ms=[round(r.ttft_s * 1e3, 3) for r in timed],
                      prefill_one_step_ms=[round(x * 1e3, 3) for x in one],
                      decode_ms_per_token_full=[round(r.decode_s_per_token * 1e3, 3) for r in timed])
    log(f"reference tokens: {ref.tokens}")
    return ref


def store_phase(sc, E, pm, prompt, ref_tokens=None):
    """Request A: prefill, store every full block, decode."""
    spec, C = sc.spec, sc.C
    N, B = spec["model_cfg"]["decode"], BLOCK
    nfull = len(prompt) // B
    a = run_request(E, pm, "A", prompt, N)
    C.add("A: nothing of this prompt in umbp before A (lookup miss)", a.hit_tokens == 0, f"hit {a.hit_tokens} tokens")
    if ref_tokens is not None:
        C.add("A: decode while storing through umbp = the reference", a.tokens == ref_tokens, f"A {a.tokens}")
    ok, bad = a.stats.get("store_blocks_ok", 0), a.stats.get("store_blocks_failed", 0)
    C.add("A: every full prompt block stored", ok == nfull and bad == 0,
          f"{ok} stored, {bad} failed, {nfull} full blocks")
    dig = pm.digests(a.blocks[:nfull])  # A's blocks are released but untouched until reallocated
    sc.timings["store_total_ms"] = round(a.total_s * 1e3, 3)
    sc.info["store_stats"] = a.stats
    return a, dig


def restore_phase(sc, E, pm, prompt, ref, a_tokens, a_digests, a_blocks, ref_engine):
    """Fresh requests with A's prompt: restore into other blocks, compute the
    last block, decode; compare with the reference and with A's bytes."""
    spec, C = sc.spec, sc.C
    R, N, B = spec["runs"], spec["model_cfg"]["decode"], BLOCK
    P = len(prompt)
    expect = (P - 1) // B * B
    k = expect // B
    rng = random.Random(spec["seed"])
    res = {"hit": [], "tokens": [], "logits": [], "bytes": [], "ids": [], "loads": [], "trunc": []}
    timed = []
    tail_same = None
    for i in range(R + 1 if R else 1):
        pm.wipe()  # the restored bytes can only come from umbp
        r = run_request(E, pm, f"{spec['tag']}-restore{i}", prompt, N)
        res["hit"].append(r.hit_tokens == expect)
        res["tokens"].append(r.tokens == ref.tokens)
        scale = max(1.0, float(ref.first_logits.abs().max()))
        d = float((r.first_logits - ref.first_logits).abs().max())
        res["logits"].append((d <= 1e-3 * scale, d))
        kk = min(k, r.hit_tokens // B)
        pos = list(range(kk)) if i == 0 else sorted(set([0, kk - 1] + rng.sample(range(kk), min(14, kk))))
        got = pm.digests([r.blocks[p] for p in pos]) if kk else []
        res["bytes"].append([p for p, g in zip(pos, got) if g != a_digests[p]] if kk else ["nothing loaded"])
        res["ids"].append(sum(1 for p in range(kk) if r.blocks[p] == a_blocks[p]))
        okl, badl = r.stats.get("load_blocks_ok", 0), r.stats.get("load_blocks_failed", 0)
        res["loads"].append((okl == k and badl == 0 and r.loaded_blocks == k, okl, badl))
        res["trunc"].append(r.truncated)
        if i == 0 and k < len(a_digests):
            tail_same = pm.digests([r.blocks[k]])[0] == a_digests[k]
        if i or not R:
            timed.append(r)
        log(f"restore {i}: hit {r.hit_tokens}, TTFT {r.ttft_s * 1e3:.2f} ms, load "
            f"{(r.load_s or 0) * 1e3:.2f} ms, tokens {'=' if r.tokens == ref.tokens else '!='} reference")
    n = len(res["hit"])
    C.add(f"restore: the lookup finds {expect} tokens ({k} blocks: all but the last prompt block) in every run",
          all(res["hit"]), f"{sum(res['hit'])}/{n}")
    C.add("restore: the greedy decode = the reference's, token for token, in every run", all(res["tokens"]),
          f"{sum(res['tokens'])}/{n}; reference {ref.tokens}")
    C.add("restore: the first token's logits = the reference's", all(x[0] for x in res["logits"]),
          f"max |diff| {max(x[1] for x in res['logits']):.3g}")
    C.add("restore: the restored blocks are A's bytes (all of them in the first run, a sample in the others)",
          all(not b for b in res["bytes"]), f"mismatching positions {[b for b in res['bytes'] if b][:3]}")
    C.add("restore: into other block ids than A's", all(s < k for s in res["ids"]),
          f"positions with A's block id: {res['ids']} of {k}")
    C.add("restore: every hit block loaded, no load failed, nothing recomputed",
          all(x[0] for x in res["loads"]) and not any(res["trunc"]),
          f"loaded/failed {[(x[1], x[2]) for x in res['loads']]}, truncations {[t for t in res['trunc'] if t]}")
    if a_tokens is not None:
        C.add("A's decode = the reference's (the KV A stored is what a full prefill computes)",
              a_tokens == ref.tokens, f"A {a_tokens}")
    diff = [p for p, (x, y) in enumerate(zip(sc.ref_digests, a_digests)) if x != y]
    C.add("the reference prefill computes A's bytes exactly (the comparisons above are exact, not within rounding)",
          not diff and len(sc.ref_digests) == len(a_digests), f"{len(diff)} of {len(a_digests)} blocks differ")
    sc.info["tail_block_recomputed_equal"] = tail_same
    # sensitivity: the same step over a zeroed prefix must give other logits
    ids = ref_engine.sched.pool.allocate(cdiv(P, B))
    pm.wipe()
    table = torch.tensor(ids, dtype=torch.long, device=pm.device)
    neg = pm.forward(torch.tensor(prompt[expect:], dtype=torch.long, device=pm.device), expect, table)[-1]
    ref_engine.sched.pool.free(ids)
    dn = float((neg - ref.first_logits).abs().max())
    C.add("control: with a zeroed prefix instead of the restore the logits differ", dn > 1e-3,
          f"max |diff| {dn:.3g}; token {int(torch.argmax(neg))} vs {int(torch.argmax(ref.first_logits))}")
    loads = [r for r in timed if r.load_s]
    sc.timings.update(
        ttft_restore_ms=[round(r.ttft_s * 1e3, 3) for r in timed],
        lookup_ms=[round(r.lookup_s * 1e3, 3) for r in timed],
        load_ms=[round(r.load_s * 1e3, 3) for r in loads],
        restore_gbps=[round(r.loaded_blocks * pm.object_size / r.load_s / 1e9, 3) for r in loads],
        restored_bytes=k * pm.object_size,
        decode_ms_per_token_restore=[round(r.decode_s_per_token * 1e3, 3) for r in timed],
        hit_tokens=expect)


def master_probe(sc, E, prompt):
    """Distributed mode, in A after its store: a scheduler lookup of A's
    prompt (the connector's, through umbp.LookupClient: umbp-master's index,
    never A's slice) until it finds every stored block, at most 200 tries a
    heartbeat apart.  The master learns A's blocks from A's next heartbeat;
    B's first lookup must not race it.  The probe requests are looked up and
    finished (vLLM's sequence for a request aborted while waiting): they
    leave nothing behind."""
    from vllm.v1.request import Request, SamplingParams

    spec, C = sc.spec, sc.C
    conn = E.conn._conn if isinstance(E.conn, Timed) else E.conn
    expect = (len(prompt) - 1) // BLOCK * BLOCK
    got, tries = 0, 0
    for tries in range(1, 201):
        req = Request(f"probe{tries}", prompt, SamplingParams(max_tokens=1), block_size=BLOCK,
                      hash_block_size=E.cfg.hash_block_size or None)
        got, _ = conn.get_num_new_matched_tokens(req, 0)
        conn.request_finished_all_groups(req, ([],))
        if got == expect:
            break
        time.sleep(spec["heartbeat_ms"] / 1000)
    sc.info["master_probe_tries"] = tries
    C.add("A: umbp-master locates every stored block (a scheduler lookup through umbp.LookupClient)",
          got == expect, f"{got} of {expect} tokens after {tries} lookups, {spec['heartbeat_ms']} ms apart")


def miss_phase(sc, E, pm, prompt, ref, a_tokens, a_digests):
    """Distributed mode after every node that held A's blocks exited: fresh
    requests with A's prompt must miss cleanly (the master answered, nothing
    found, nothing loaded or failed), recompute the prompt and decode the
    reference's tokens."""
    spec, C = sc.spec, sc.C
    R, N, B = spec["runs"], spec["model_cfg"]["decode"], BLOCK
    nfull = len(prompt) // B
    conn = E.conn._conn if isinstance(E.conn, Timed) else E.conn
    umbp_conn = type(conn).__name__ == "UMBPConnector"
    runs, errs = [], []
    for i in range(R + 1 if R else 1):
        pm.wipe()  # nothing left from an earlier run can help
        r = run_request(E, pm, f"{spec['tag']}-miss{i}", prompt, N)
        runs.append(r)
        if umbp_conn:  # the scheduler's lookup counters (UMBPConnector only)
            st = conn.get_kv_connector_stats()
            data = getattr(st, "data", None) or {}
            errs.append((int(data.get("lookups", 0)), int(data.get("lookup_errors", 0))))
        log(f"miss {i}: hit {r.hit_tokens}, TTFT {r.ttft_s * 1e3:.2f} ms, tokens "
            f"{'=' if r.tokens == ref.tokens else '!='} reference")
    n = len(runs)
    C.add("miss: the lookup finds nothing (0 hit tokens) in every run", all(r.hit_tokens == 0 for r in runs),
          f"hit tokens {[r.hit_tokens for r in runs]}")
    if umbp_conn:
        C.add("miss: a clean miss (umbp-master answered; no lookup error)",
              all(lk > 0 and e == 0 for lk, e in errs), f"(lookups, lookup errors) per run {errs}")
    C.add("miss: nothing loaded, no load failed, nothing truncated",
          all(r.loaded_blocks == 0 and not r.stats.get("load_blocks_ok") and not r.stats.get("load_blocks_failed")
              and not r.truncated for r in runs),
          f"loaded {[r.loaded_blocks for r in runs]}, failed {[r.stats.get('load_blocks_failed', 0) for r in runs]}")
    same = [r.tokens == ref.tokens for r in runs]
    C.add("miss: the greedy decode (recomputed) = the reference's, token for token, in every run", all(same),
          f"{sum(same)}/{n}; reference {ref.tokens}")
    d = max(float((r.first_logits - ref.first_logits).abs().max()) for r in runs)
    scale = max(1.0, float(ref.first_logits.abs().max()))
    C.add("miss: the first token's logits = the reference's", d <= 1e-3 * scale, f"max |diff| {d:.3g}")
    got = pm.digests(runs[0].blocks[:nfull])
    bad = [p for p, (g, a) in enumerate(zip(got, a_digests)) if g != a]
    C.add("miss: the recomputed blocks are A's bytes", not bad and len(got) == len(a_digests),
          f"{len(bad)} of {len(a_digests)} blocks differ")
    C.add("A's decode = the reference's (the KV A stored is what a full prefill computes)",
          a_tokens == ref.tokens, f"A {a_tokens}")
    timed = runs[1:] if R else runs
    sc.timings.update(ttft_miss_ms=[round(r.ttft_s * 1e3, 3) for r in timed],
                      lookup_miss_ms=[round(r.lookup_s * 1e3, 3) for r in timed])


def finish(sc, *engines):
    for name, E in engines:
        try:
            E.check_clean()
            sc.C.add(f"{name}: engine clean (every block back, every job released, nothing held)", True)
        except Exception as e:  # noqa: BLE001
            sc.C.add(f"{name}: engine clean (every block back, every job released, nothing held)", False, e)
    for _name, E in engines:
        E.shutdown()


def role_embedded(sc):
    pm, prompt = setup(sc)
    H = load_harness()
    ref_E = make_engine(H, sc.spec, pm, "none", sc.spec["seed"] + 101)
    E = make_engine(H, sc.spec, pm, sc.spec["path"], sc.spec["seed"] + 1)
    ref = reference_phase(sc, ref_E, pm, prompt)
    a, dig = store_phase(sc, E, pm, prompt, ref.tokens)
    restore_phase(sc, E, pm, prompt, ref, None, dig, a.blocks, ref_E)
    finish(sc, ("reference", ref_E), ("umbp", E))


def role_store(sc):
    spec = sc.spec
    pm, prompt = setup(sc)
    H = load_harness()
    E = make_engine(H, spec, pm, spec["path"], spec["seed"] + 1)
    a, dig = store_phase(sc, E, pm, prompt)
    if spec["mode"] == "distributed":
        master_probe(sc, E, prompt)
    data = {"tokens": a.tokens, "blocks": a.blocks[:len(dig)], "digests": dig, "weights": sc.info["weights"],
            "prompt_sha": sc.info["prompt_sha"], "pid": os.getpid()}
    tmp = spec["a_data"] + ".tmp"
    with open(tmp, "w") as f:
        json.dump(data, f)
    os.rename(tmp, spec["a_data"])
    log(f"stored; waiting for {spec['release']}")
    deadline = now() + spec["timeout"]
    while not os.path.exists(spec["release"]):
        if now() > deadline:
            sc.C.add("A: released by the orchestrator in time", False)
            break
        time.sleep(0.05)
    finish(sc, ("A", E))


def role_restore(sc):
    spec, C = sc.spec, sc.C
    with open(spec["a_data"]) as f:
        a = json.load(f)
    pm, prompt = setup(sc)
    C.add("B: the same weights as A", sc.info["weights"] == a["weights"], f"{sc.info['weights']} vs {a['weights']}")
    C.add("B: the same prompt as A", sc.info["prompt_sha"] == a["prompt_sha"])
    if spec.get("a_exited"):
        alive = True
        try:
            os.kill(a["pid"], 0)
        except ProcessLookupError:
            alive = False
        C.add("B: A's process has exited", not alive, f"pid {a['pid']}")
    H = load_harness()
    ref_E = make_engine(H, spec, pm, "none", spec["seed"] + 102)
    E = make_engine(H, spec, pm, spec["path"], spec["seed"] + spec["pool_seed"])
    ref = reference_phase(sc, ref_E, pm, prompt)
    if spec.get("expect_miss"):
        miss_phase(sc, E, pm, prompt, ref, a["tokens"], a["digests"])
    else:
        restore_phase(sc, E, pm, prompt, ref, a["tokens"], a["digests"], a["blocks"], ref_E)
    finish(sc, ("reference", ref_E), ("B", E))


# =============================================================================
# Tensor parallelism (--tp 2): rank processes holding shards of the model
# =============================================================================


def shard_model(model, rank, world):
    """Megatron-style shards of a (copy of a) Llama, in place: q/k/v_proj
    column-parallel by heads (rank r: attention heads and KV heads
    [r*H/world, (r+1)*H/world)), o_proj row-parallel; gate/up_proj
    column-parallel, down_proj row-parallel; embeddings, norms and lm_head
    replicated.  The partial sums of o_proj and down_proj are all-reduced by
    PagedLlama (tp=)."""
    c = model.config
    H, Hkv, D = c.num_attention_heads, c.num_key_value_heads, c.head_dim if getattr(c, "head_dim", None) else \
        c.hidden_size // c.num_attention_heads
    inter = model.model.layers[0].mlp.gate_proj.out_features
    if H % world or Hkv % world or inter % world:
        raise ValueError(f"heads {H}, kv heads {Hkv}, intermediate {inter} not divisible by TP {world}")

    def cut(lin, dim, lo, hi):
        if getattr(lin, "bias", None) is not None:
            raise ValueError("shard_model: biased projections are not supported")
        w = lin.weight.data
        w = w[lo:hi] if dim == 0 else w[:, lo:hi]
        lin.weight = nn.Parameter(w.contiguous(), requires_grad=False)
        lin.out_features, lin.in_features = lin.weight.shape

    hq, hk, ic = H // world * D, Hkv // world * D, inter // world
    for layer in model.model.layers:
        a, m = layer.self_attn, layer.mlp
        cut(a.q_proj, 0, rank * hq, (rank + 1) * hq)
        cut(a.k_proj, 0, rank * hk, (rank + 1) * hk)
        cut(a.v_proj, 0, rank * hk, (rank + 1) * hk)
        cut(a.o_proj, 1, rank * hq, (rank + 1) * hq)
        cut(m.gate_proj, 0, rank * ic, (rank + 1) * ic)
        cut(m.up_proj, 0, rank * ic, (rank + 1) * ic)
        cut(m.down_proj, 1, rank * ic, (rank + 1) * ic)
    return model


class TPRank:
    """One TP rank's process state: its device, the process group, its shard
    of the model over its paged KV cache (its KV heads only), and its
    engines' workers (eid -> MiniWorker with the connector's WORKER role for
    this rank)."""

    def __init__(self, spec, rank, world, pg_init):
        import copy
        import datetime

        import torch.distributed as dist

        self.spec, self.rank, self.world, self.dist = spec, rank, world, dist
        mc = spec["model_cfg"]
        dev = torch.device(spec["device"])
        per_gpu = dev.type == "cuda" and spec.get("gpus", 1) >= world
        if dev.type == "cuda":
            dev = torch.device("cuda", rank if per_gpu else (dev.index or 0))
            torch.cuda.set_device(dev)
            torch.backends.cuda.matmul.allow_tf32 = False
            torch.backends.cudnn.allow_tf32 = False
        self.dev = dev
        self.backend = "nccl" if per_gpu else "gloo"
        os.environ.setdefault("NCCL_NVLS_ENABLE", "0")  # no NVLink multicast (the lent machines' rule)
        t = now()
        dist.init_process_group(self.backend, init_method=pg_init, rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=max(60, spec["timeout"])))
        log(f"process group up: {self.backend}, rank {rank}/{world}, device {dev}")
        self.C = Checks()
        full = build_model(mc, dev, spec["seed"], spec["model"] == "hf")
        self.info = dict(weights=weights_digest(full), device=str(dev), backend=self.backend,
                         params_full=sum(p.numel() for p in full.parameters()))
        shard = shard_model(copy.deepcopy(full), rank, world)
        prompt = make_prompt(mc["vocab"], mc["prompt"], spec["seed"])
        tp = (rank, world, self._all_reduce)
        what = f"TP={world} paged forward (rank {rank}'s shard, all-reduced) = the model's TP=1 forward"
        if spec["validate"]:
            validate(full, mc, dev, torch.float32, prompt, self.C, strict=True, what=what,
                     paged=lambda: PagedLlama(shard, mc, dev, torch.float32, "NHD", 8, tp=tp))
        dtype = getattr(torch, spec["dtype"])
        if spec["validate"] and dtype != torch.float32:
            full, shard = full.to(dtype), shard.to(dtype)
            validate(full, mc, dev, dtype, prompt, self.C, strict=False, what=what,
                     paged=lambda: PagedLlama(shard, mc, dev, dtype, "NHD", 8, tp=tp))
        del full
        self.model = shard.to(dtype)
        self.pm = PagedLlama(self.model, mc, dev, dtype, spec["layout"], spec["num_blocks"], tp=tp)
        self.info.update(params_shard=sum(p.numel() for p in self.model.parameters()), L=self.pm.L,
                         H=self.pm.H, Hkv=self.pm.Hkv, D=self.pm.D, object_bytes=self.pm.object_size,
                         rope=self.pm.rope.source, setup_s=round(now() - t, 2), kv_shape=list(self.pm.kv[0].shape))
        self.H = load_harness()
        self.engines = {}

    def _all_reduce(self, x):
        """The sum over ranks, in fp32 (two addends: the same on every rank, in every run)."""
        y = x.float()
        if y.is_cuda and self.backend == "gloo":
            y = y.cpu()
        elif y is x:
            y = y.clone()
        self.dist.all_reduce(y)
        return y.to(device=x.device, dtype=x.dtype)

    def hello(self):
        return {"info": self.info, "checks": self.C.items}

    # -- engines --
    def make(self, eid, kind, cfg_kw):
        H = self.H
        cfg = H.MiniConfig(**cfg_kw)
        if kind == "none":
            conn = NullConnector()
        else:
            from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole

            from umbp.vllm.connector import UMBPConnector

            conn = UMBPConnector(cfg.vllm_config(self.rank), KVConnectorRole.WORKER, cfg.kv_cache_config())
            conn.register_kv_caches(dict(zip([n for n, *_ in cfg.layers()], self.pm.kv)))
        w = H.MiniWorker(cfg, self.pm, Timed(conn))
        w.rank = self.rank
        self.engines[eid] = w
        return True

    def execute(self, eid, so, tokens):
        w = self.engines[eid]
        nl = len(w.conn.load_s)
        out = w.execute(so, tokens)
        first = {rid: (t, lg.float().cpu()) for rid, (t, lg) in w.first.items()}
        w.first.clear()
        tt = {rid: list(v) for rid, v in w.token_t.items()}
        w.token_t.clear()
        out["mini"] = {"first": first, "token_t": tt, "load_s": list(w.conn.load_s[nl:])}
        return out

    def take_stats(self, eid):
        return self.engines[eid].conn.take_stats()

    def counters(self, eid):
        return self.engines[eid].conn.debug_counters()

    def shutdown_engine(self, eid):
        w = self.engines.pop(eid)
        w.conn.shutdown()
        return True

    # -- the paged model --
    def wipe(self):
        self.pm.wipe()
        return True

    def digests(self, ids):
        return self.pm.digests(list(ids))

    def forward(self, tokens, start, table, all_logits):
        toks = torch.tensor(tokens, dtype=torch.long, device=self.dev)
        tab = torch.tensor(table, dtype=torch.long, device=self.dev)
        return self.pm.forward(toks, start, tab, all_logits=all_logits).cpu()

    # -- test controls --
    def _worker(self, eid):
        return self.engines[eid].conn._conn._worker

    def present(self, eid, hashes):
        """Which of these blocks this rank's objects are in the pool of (its lookup)."""
        import umbp

        wk = self._worker(eid)
        _, present = wk.rt.lookup(umbp.derive_keys(wk.ns, rank=wk.rank_id, group=0, hashes=list(hashes)))
        return [bool(x) for x in present.tolist()]

    def drop(self, eid, hashes, keep_first, shared):
        """This rank's objects of hashes[keep_first:] disappear (the binding
        has no per-key delete: the survivors are read, the pool cleared, the
        survivors put back, as the harness's remove_objects does).  shared: a
        standalone server's pool, where every other rank's objects of these
        hashes survive too."""
        import numpy as np

        import umbp

        wk = self._worker(eid)
        rt, size = wk.rt, wk.kv[0].object_size
        mine = umbp.derive_keys(wk.ns, rank=wk.rank_id, group=0, hashes=list(hashes))
        keep = [mine[:keep_first]]
        if shared:
            keep += [umbp.derive_keys(wk.ns, rank=wk.topo.rank_id(r), group=0, hashes=list(hashes))
                     for r in range(self.world) if r != self.rank]
        keep = np.concatenate(keep)
        buf = np.zeros((max(1, len(keep)), size), dtype=np.uint8)
        ptrs = buf.ctypes.data + np.arange(len(keep), dtype=np.uint64) * np.uint64(size)
        if len(keep):
            j = rt.get(keep, ptrs, size)
            if not (j.wait(30000) and j.num_ok == len(keep)):
                raise RuntimeError(f"drop: reading the survivors failed: {j.statuses}")
            j.release()
        rt.clear()
        if len(keep):
            j = rt.put(keep, ptrs, size)
            if not (j.wait(30000) and j.num_ok == len(keep)):
                raise RuntimeError(f"drop: putting the survivors back failed: {j.statuses}")
            j.release()
        return self.present(eid, hashes)

    def close(self):
        for eid in list(self.engines):
            try:
                self.shutdown_engine(eid)
            except Exception:  # noqa: BLE001
                pass
        try:
            self.dist.destroy_process_group()
        except Exception:  # noqa: BLE001
            pass


def _orphan_watch(ppid):
    """A rank process ends when the process that started it is gone."""
    while True:
        time.sleep(0.5)
        if os.getppid() != ppid:
            os._exit(3)


def tp_worker_main(conn, spec, rank, world, pg_init, ppid):
    """Entry of a TP rank process (spawn): serves TPRank methods over a Pipe."""
    global TAG
    TAG = f"{spec['tag']}/{spec['role']}/rank{rank}"
    threading.Thread(target=_orphan_watch, args=(ppid,), daemon=True).start()
    _import_torch()
    try:
        st = TPRank(spec, rank, world, pg_init)
        conn.send(("ok", st.hello()))
    except BaseException:  # noqa: BLE001
        conn.send(("err", traceback.format_exc()))
        return
    while True:
        try:
            name, args = conn.recv()
        except (EOFError, OSError):
            break
        if name == "exit":
            st.close()
            conn.send(("ok", None))
            break
        try:
            res = getattr(st, name)(*args)
            conn.send(("ok", res))
        except BaseException:  # noqa: BLE001
            conn.send(("err", traceback.format_exc()))
    os._exit(0)  # (no interpreter teardown: the runtime and the process group are closed)


class TPGroup:
    """The rank processes of one engine process; every wait has a timeout."""

    def __init__(self, spec, world, work_prefix):
        import multiprocessing as mp

        self.world, self.timeout = world, spec["timeout"]
        ctx = mp.get_context("spawn")
        pg_init = f"file://{work_prefix}.pg"
        if os.path.exists(f"{work_prefix}.pg"):
            os.unlink(f"{work_prefix}.pg")
        self.pg_file = f"{work_prefix}.pg"
        self.conns, self.procs = [], []
        for r in range(world):
            parent, child = ctx.Pipe()
            p = ctx.Process(target=tp_worker_main, args=(child, spec, r, world, pg_init, os.getpid()), daemon=True)
            p.start()
            child.close()
            self.conns.append(parent)
            self.procs.append(p)
        self.hello = self._recv_all()

    def _recv(self, r, timeout=None):
        c = self.conns[r]
        if not c.poll(timeout or self.timeout):
            raise RuntimeError(f"TP rank {r} did not answer in {timeout or self.timeout} s")
        try:
            st, res = c.recv()
        except EOFError:
            raise RuntimeError(f"TP rank {r} exited (status {self.procs[r].exitcode})") from None
        if st != "ok":
            raise RuntimeError(f"TP rank {r} failed:\n{res}")
        return res

    def _recv_all(self):
        out, errs = [], []
        for r in range(self.world):
            try:
                out.append(self._recv(r))
            except Exception as e:  # noqa: BLE001
                out.append(None)
                errs.append(str(e))
        if errs:
            raise RuntimeError("\n".join(errs))
        return out

    def call_all(self, name, *args):
        for c in self.conns:
            c.send((name, args))
        return self._recv_all()

    def call(self, r, name, *args):
        self.conns[r].send((name, args))
        return self._recv(r)

    def close(self):
        for r, p in enumerate(self.procs):
            if p.is_alive():
                try:
                    self.conns[r].send(("exit", ()))
                    self._recv(r, timeout=20)
                except Exception:  # noqa: BLE001
                    pass
        for p in self.procs:
            p.join(10)
            if p.is_alive():
                p.kill()
                p.join(5)
        for c in self.conns:
            c.close()
        if os.path.exists(self.pg_file):
            os.unlink(self.pg_file)


class TPWorkerProxy:
    """What Engine.check_clean and shutdown ask of a worker, for one rank."""

    def __init__(self, grp, rank, eid):
        self.grp, self.rank, self.eid = grp, rank, eid

    def counters(self):
        return self.grp.call(self.rank, "counters", self.eid)


class TPPaged:
    """The PagedLlama of the ranks seen from the engine process: a forward
    runs on every rank (rank 0's logits returned), a block's digest is every
    rank's digest of its own KV heads."""

    def __init__(self, grp):
        i = grp.hello[0]["info"]
        self.grp, self.device, self.layout = grp, torch.device("cpu"), None
        self.L, self.D, self.Hkv, self.H = i["L"], i["D"], i["Hkv"] * grp.world, i["H"] * grp.world
        self.num_blocks = i["kv_shape"][1]
        self.object_size = sum(h["info"]["object_bytes"] for h in grp.hello)  # all ranks' objects of a block
        self.rank_object_size = i["object_bytes"]

    def sync(self):
        pass

    def wipe(self):
        self.grp.call_all("wipe")

    def digests(self, block_ids):
        return ["|".join(x) for x in zip(*self.grp.call_all("digests", list(block_ids)))]

    def forward(self, tokens, start, table, hooks=None, all_logits=False):
        return self.grp.call_all("forward", tokens.tolist(), int(start), table.tolist(), all_logits)[0]


def setup_tp(sc):
    spec, C = sc.spec, sc.C
    mc, world = spec["model_cfg"], spec["tp"]
    t = now()
    grp = TPGroup(spec, world, os.path.splitext(spec["result"])[0])
    for r, h in enumerate(grp.hello):
        for c in h["checks"]:
            C.add(f"rank {r}: {c['name']}", c["ok"], c["detail"])
    infos = [h["info"] for h in grp.hello]
    C.add(f"TP={world}: every rank built the same weights before sharding",
          len({i["weights"] for i in infos}) == 1, [i["weights"] for i in infos])
    C.add(f"TP={world}: each rank's paged KV cache holds its KV heads only",
          all(i["kv_shape"][3] == mc["kv_heads"] // world for i in infos) and spec["layout"] == "NHD",
          f"per-rank KV cache {infos[0]['kv_shape']} ({mc['kv_heads']} KV heads in all)")
    pm = TPPaged(grp)
    prompt = make_prompt(mc["vocab"], mc["prompt"], spec["seed"])
    sc.info.update(model=("transformers.LlamaForCausalLM" if spec["model"] == "hf" else "stand-in Llama"),
                   params=infos[0]["params_full"], params_per_rank=infos[0]["params_shard"],
                   weights=infos[0]["weights"], tp=world, ranks=infos,
                   prompt_sha=hashlib.sha256(json.dumps(prompt).encode()).hexdigest()[:32],
                   object_bytes=pm.object_size, rank_object_bytes=pm.rank_object_size, setup_s=round(now() - t, 2))
    log(f"TP={world} ({infos[0]['backend']}): model {sc.info['model']} {sc.info['params'] / 1e6:.0f}M params, "
        f"{infos[0]['params_shard'] / 1e6:.0f}M per rank, per-rank KV {infos[0]['kv_shape']}, prompt {len(prompt)} "
        f"tokens (setup {sc.info['setup_s']} s)")
    return grp, pm, prompt


def make_engine_tp(H, spec, grp, pm, kind, seed, eid):
    """make_engine at TP: the workers in the rank processes (engine eid there),
    the scheduler's connector here, after them (their pools serve its lookups)."""
    extra = {}
    if kind == "connector":
        extra = {"mode": spec["mode"], "load_async": bool(spec["load_async"]), "timeout_ms": 30000}
        if spec["mode"] == "embedded":
            extra.update(capacity_bytes=spec["capacity"], lookup_dir=spec["lookup_dir"])
        else:
            extra["socket_dir"] = spec["socket_dir"]
    elif kind != "none":
        raise ValueError(f"TP engines: no connector kind {kind!r} (connector or none)")
    cfg_kw = dict(groups=[(H.FULL, pm.L, 0)], block_size=BLOCK, num_blocks=pm.num_blocks, tp=grp.world, extra=extra,
                  max_num_batched_tokens=spec["max_batched"], max_num_seqs=1, async_scheduling=False,
                  heads=pm.Hkv // grp.world, dim=pm.D, model=spec["model_name"], dtype=spec["dtype"],
                  device=spec["device"], processes=True)
    cfg = H.MiniConfig(**cfg_kw)
    grp.call_all("make", eid, kind, cfg_kw)
    if kind == "none":
        sc = NullConnector()
    else:
        from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole

        from umbp.vllm.connector import UMBPConnector

        sc = UMBPConnector(cfg.vllm_config(0), KVConnectorRole.SCHEDULER, cfg.kv_cache_config())
    return H.MiniTPEngine(cfg, grp, eid, Timed(sc), seed)


def prompt_hashes(H, prompt):
    from vllm.v1.request import Request, SamplingParams

    return list(Request("hashes", prompt, SamplingParams(max_tokens=1), block_size=BLOCK).block_hashes)


def partial_reference(ref_E, pm, prompt, hashes, keep, n_out, tag):
    """What a restore of blocks [0, keep) must decode: the no-connector engine
    with those blocks in its local prefix cache, their KV from a full prefill
    (as A's are), computing the rest with the same step shapes as the restore.
    (The full reference computed the rest inside one 10,000-token step; a
    restore of half computes it in a step of its own, whose bf16 rounding
    differs, so only this reference is comparable bit for bit.)"""
    pool = ref_E.sched.pool
    was = pool.prefix_cache
    pool.prefix_cache = True
    try:
        run_request(ref_E, pm, f"{tag}-pfill", prompt, n_out)  # caches every full block
        for h in hashes[keep:]:
            b = pool.cached.pop(h, None)
            if b is not None:
                pool.block_hash.pop(b, None)
        held = sum(h in pool.cached for h in hashes[:keep])
        r = run_request(ref_E, pm, f"{tag}-pref", prompt, n_out)
    finally:
        pool.evict_cached()
        pool.prefix_cache = was
    return r, held


def partial_phase(sc, H, E, pm, prompt, ref, a_digests, ref_E):
    """A block counts as cached only when every rank holds it: rank 1 loses
    its objects of blocks >= keep; a fresh request's hit must shrink to the
    blocks both ranks hold, and its decode must equal a no-connector engine's
    that holds the same blocks locally (partial_reference)."""
    spec, C = sc.spec, sc.C
    N, B, P = spec["model_cfg"]["decode"], BLOCK, len(prompt)
    k = (P - 1) // B
    keep = max(1, k // 2)
    hashes = prompt_hashes(H, prompt)[:k]
    pref, held = partial_reference(ref_E, pm, prompt, hashes, keep, N, f"{spec['tag']}-partial")
    C.add(f"partial: the reference engine held blocks [0, {keep}) in its local prefix cache",
          held == keep, f"{held} of {keep}")
    grp = E.grp
    last = grp.world - 1
    left = grp.call(last, "drop", E.eid, hashes, keep, spec["mode"] == "standalone")
    others = [grp.call(r, "present", E.eid, hashes) for r in range(last)]
    C.add(f"partial: rank {last} holds blocks [0, {keep}) only, the other ranks all {k}",
          left == [True] * keep + [False] * (k - keep) and all(o == [True] * k for o in others),
          f"rank {last}: {sum(left)} of {k}; others: {[sum(o) for o in others]}")
    pm.wipe()
    r = run_request(E, pm, f"{spec['tag']}-partial", prompt, N)
    C.add(f"partial: the scheduler's hit shrinks to what every rank holds ({keep * B} tokens)",
          r.hit_tokens == keep * B, f"hit {r.hit_tokens} tokens")
    C.add("partial: the greedy decode = the reference's with the same blocks cached, token for token",
          r.tokens == pref.tokens, f"{r.tokens} vs {pref.tokens}")
    scale = max(1.0, float(pref.first_logits.abs().max()))
    d = float((r.first_logits - pref.first_logits).abs().max())
    C.add("partial: the first token's logits = that reference's", d <= 1e-3 * scale, f"max |diff| {d:.3g}")
    d_full = float((r.first_logits - ref.first_logits).abs().max())
    kk = min(keep, r.hit_tokens // B)
    got = pm.digests(r.blocks[:kk]) if kk else []
    C.add("partial: the restored blocks are A's bytes on every rank",
          kk == keep and got == list(a_digests[:kk]), f"{sum(g == a for g, a in zip(got, a_digests))} of {keep}")
    okl, badl = r.stats.get("load_blocks_ok", 0), r.stats.get("load_blocks_failed", 0)
    C.add("partial: every rank loaded the shrunk hit, nothing failed, nothing truncated",
          okl == keep and badl == 0 and not r.truncated, f"loaded {okl}, failed {badl}, truncations {r.truncated}")
    sc.info["partial"] = {"keep": keep, "of": k, "hit_tokens": r.hit_tokens, "first_logits_max_diff": d,
                          "first_logits_max_diff_vs_full_prefill": d_full,
                          "tokens_equal_full_prefill": r.tokens == ref.tokens,
                          "ttft_ms": round(r.ttft_s * 1e3, 3)}


def tp_consistency(sc, *engines):
    for name, E in engines:
        sc.C.add(f"{name}: every rank sampled the same tokens from the same logits (the all-reduce agrees)",
                 not E.disagree, E.disagree[:5])


def role_embedded_tp(sc):
    spec = sc.spec
    grp, pm, prompt = setup_tp(sc)
    engines = []
    try:
        H = load_harness()
        ref_E = make_engine_tp(H, spec, grp, pm, "none", spec["seed"] + 101, "ref")
        engines.append(("reference", ref_E))
        E = make_engine_tp(H, spec, grp, pm, "connector", spec["seed"] + 1, "umbp")
        engines.append(("umbp", E))
        ref = reference_phase(sc, ref_E, pm, prompt)
        a, dig = store_phase(sc, E, pm, prompt, ref.tokens)
        restore_phase(sc, E, pm, prompt, ref, None, dig, a.blocks, ref_E)
        partial_phase(sc, H, E, pm, prompt, ref, dig, ref_E)
        tp_consistency(sc, *engines)
        finish(sc, *engines)
    finally:
        for _n, e in engines:
            with contextlib.suppress(Exception):
                e.shutdown()
        grp.close()


def role_store_tp(sc):
    spec = sc.spec
    grp, pm, prompt = setup_tp(sc)
    engines = []
    try:
        H = load_harness()
        E = make_engine_tp(H, spec, grp, pm, "connector", spec["seed"] + 1, "umbp")
        engines.append(("A", E))
        a, dig = store_phase(sc, E, pm, prompt)
        data = {"tokens": a.tokens, "blocks": a.blocks[:len(dig)], "digests": dig, "weights": sc.info["weights"],
                "prompt_sha": sc.info["prompt_sha"], "pid": os.getpid(), "rank_pids": [p.pid for p in grp.procs]}
        tmp = spec["a_data"] + ".tmp"
        with open(tmp, "w") as f:
            json.dump(data, f)
        os.rename(tmp, spec["a_data"])
        log(f"stored; waiting for {spec['release']}")
        deadline = now() + spec["timeout"]
        while not os.path.exists(spec["release"]):
            if now() > deadline:
                sc.C.add("A: released by the orchestrator in time", False)
                break
            time.sleep(0.05)
        tp_consistency(sc, *engines)
        finish(sc, *engines)
    finally:
        for _n, e in engines:
            with contextlib.suppress(Exception):
                e.shutdown()
        grp.close()


def role_restore_tp(sc):
    spec, C = sc.spec, sc.C
    with open(spec["a_data"]) as f:
        a = json.load(f)
    grp, pm, prompt = setup_tp(sc)
    engines = []
    try:
        C.add("B: the same weights as A", sc.info["weights"] == a["weights"], f"{sc.info['weights']} vs {a['weights']}")
        C.add("B: the same prompt as A", sc.info["prompt_sha"] == a["prompt_sha"])
        if spec.get("a_exited"):
            alive = []
            for pid in [a["pid"]] + a.get("rank_pids", []):
                try:
                    os.kill(pid, 0)
                    alive.append(pid)
                except ProcessLookupError:
                    pass
            C.add("B: A's process (and its rank processes) have exited", not alive, f"alive: {alive}")
        H = load_harness()
        ref_E = make_engine_tp(H, spec, grp, pm, "none", spec["seed"] + 102, "ref")
        engines.append(("reference", ref_E))
        E = make_engine_tp(H, spec, grp, pm, "connector", spec["seed"] + spec["pool_seed"], "umbp")
        engines.append(("B", E))
        ref = reference_phase(sc, ref_E, pm, prompt)
        restore_phase(sc, E, pm, prompt, ref, a["tokens"], a["digests"], a["blocks"], ref_E)
        if spec.get("partial"):
            partial_phase(sc, H, E, pm, prompt, ref, a["digests"], ref_E)
        tp_consistency(sc, *engines)
        finish(sc, *engines)
    finally:
        for _n, e in engines:
            with contextlib.suppress(Exception):
                e.shutdown()
        grp.close()


ROLES = {"embedded": role_embedded, "store": role_store, "restore": role_restore}
TP_ROLES = {"embedded": role_embedded_tp, "store": role_store_tp, "restore": role_restore_tp}


def child_main(args):
    global TAG, INJECT
    with open(args.spec) as f:
        spec = json.load(f)
    TAG = f"{spec['tag']}/{spec['role']}"
    INJECT = spec.get("inject")
    _import_torch()
    import umbp

    sc = Scenario(spec)
    sc.info.update(umbp_library=umbp.library_path, torch=torch.__version__, pid=os.getpid())
    if spec["device"].startswith("cuda"):
        sc.info["gpu"] = torch.cuda.get_device_name(0)
    if spec["model"] == "hf":
        import transformers

        sc.info["transformers"] = transformers.__version__
    os.environ["VLLM_KV_CACHE_LAYOUT"] = spec["layout"]  # what the connector's namespace records
    err = None
    try:
        (TP_ROLES if spec.get("tp", 1) > 1 else ROLES)[spec["role"]](sc)
    except Exception:  # noqa: BLE001
        err = traceback.format_exc()
        log(err)
        sc.C.add(f"{spec['role']} ran to the end", False, err.strip().splitlines()[-1])
    with open(spec["result"], "w") as f:
        json.dump(sc.result(err), f, indent=1, default=str)
    return 0 if sc.C.ok else 1


# =============================================================================
# The orchestrator
# =============================================================================


class Server:
    """An umbp-server on a private socket directory."""

    def __init__(self, binary, socket_dir, capacity, log_path):
        cfg = {"capacity_bytes": capacity, "socket_dir": socket_dir, "log_level": "warn"}
        self.log_path = log_path
        self.p = subprocess.Popen([binary, "--json", json.dumps(cfg)], stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True)
        r, _, _ = select.select([self.p.stdout], [], [], 30)
        line = self.p.stdout.readline() if r else ""
        if "serving" not in line:
            self.p.kill()
            raise RuntimeError(f"umbp-server did not start: {line!r} {self.p.stdout.read()[-2000:]}")
        log(line.strip())
        self.logf = open(log_path, "w")
        self.logf.write(line)
        self.drain = threading.Thread(target=self._drain, daemon=True)
        self.drain.start()

    def _drain(self):
        for line in self.p.stdout:
            self.logf.write(line)
            self.logf.flush()

    def alive(self):
        return self.p.poll() is None

    def stop(self):
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGTERM)
            try:
                self.p.wait(15)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait(5)
                return None
        return self.p.returncode


class Master:
    """An umbp-master on a free loopback port (listen port 0: the kernel picks
    it, the "serving" line says which).  Its log is kept: which nodes
    registered and which went suspect."""

    def __init__(self, binary, log_path):
        cfg = {"listen": "127.0.0.1:0", "log_level": "info"}
        self.lines = []
        self.lock = threading.Lock()
        self.p = subprocess.Popen([binary, "--json", json.dumps(cfg)], stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True)
        r, _, _ = select.select([self.p.stdout], [], [], 30)
        line = self.p.stdout.readline() if r else ""
        m = re.search(r"serving (\S+:\d+)", line)
        if m is None:
            self.p.kill()
            raise RuntimeError(f"umbp-master did not start: {line!r} {self.p.stdout.read()[-2000:]}")
        self.address = m.group(1)
        log(line.strip())
        self.logf = open(log_path, "w")
        self.logf.write(line)
        self.drain = threading.Thread(target=self._drain, daemon=True)
        self.drain.start()

    def _drain(self):
        for line in self.p.stdout:
            with self.lock:
                self.lines.append(line)
            self.logf.write(line)
            self.logf.flush()

    def nodes(self, what):
        """Names of the nodes the log says `what` (registered, suspect) of."""
        with self.lock:
            lines = list(self.lines)
        pat = re.compile(r"(node \d+ \([^)]*\)):? " + what + r"\b")  # "node 3 (host pid 123)"
        return {m.group(1) for m in map(pat.search, lines) if m}

    def alive(self):
        return self.p.poll() is None

    def stop(self):
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGTERM)
            try:
                self.p.wait(15)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait(5)
                return None
        return self.p.returncode


class Child:
    def __init__(self, spec, env):
        with open(spec["spec_path"], "w") as f:
            json.dump(spec, f, indent=1)
        self.spec = spec
        self.t0 = now()
        self.p = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--role", spec["role"],
                                   "--spec", spec["spec_path"]], env=env)

    def wait(self):
        try:
            rc = self.p.wait(max(1, min(self.spec["timeout"] - (now() - self.t0), DEADLINE - now())))
        except subprocess.TimeoutExpired:
            self.p.kill()
            self.p.wait()
            rc = "timeout"
        res = None
        if os.path.exists(self.spec["result"]):
            with open(self.spec["result"]) as f:
                res = json.load(f)
        if res is None:
            res = {"name": self.spec["name"], "role": self.spec["role"], "checks": [], "timings": {}, "info": {},
                   "error": f"no result (exit status {rc})"}
        if rc != 0 and not any(not c["ok"] for c in res["checks"]):
            res["checks"].append({"name": f"{self.spec['role']} process exited cleanly", "ok": False,
                                  "detail": f"exit status {rc}"})
        return res

    def kill(self):
        if self.p.poll() is None:
            self.p.kill()
            self.p.wait()


def base_spec(args, mc, name, role, work, **kw):
    spec = dict(name=name, role=role, tag=name, device=args.device, dtype=mc["dtype"], seed=args.seed,
                model=args.model, model_cfg=mc, num_blocks=mc["num_blocks"], capacity=mc["capacity"],
                max_batched=args.max_batched_tokens, runs=mc["runs"], validate=False, layout="NHD",
                load_async=False, path="connector", mode="embedded", timeout=args.timeout or mc["timeout"],
                model_name=f"mini-llama/{args.preset}-L{mc['layers']}-seed{args.seed}/{name}", inject=args.inject,
                lookup_dir=os.path.join(work, "lk"), socket_dir=os.path.join(work, "s"), pool_seed=2,
                tp=args.tp, gpus=args.gpus)
    spec.update(kw)
    d = os.path.join(work, f"{name}-{role}{kw.get('suffix', '')}")
    spec.update(spec_path=d + ".spec.json", result=d + ".result.json")
    return spec


def merge(name, mode, parts, spec):
    """One scenario's result from its processes' results."""
    checks, errors = [], []
    for label, res in parts:
        for c in res["checks"]:
            cname = c["name"]
            if label and cname.split(": ", 1)[0] in ("A", "B"):  # the label says who already
                cname = cname.split(": ", 1)[1]
            checks.append(dict(c, name=f"{label}{cname}"))
        if res.get("error"):
            errors.append(f"{label}{res['error'][-1500:]}")
    timed = [res for _label, res in parts if res["timings"].get("ttft_restore_ms")]
    last = timed[-1] if timed else parts[-1][1]
    return {"name": name, "mode": mode, "path": spec["path"], "layout": spec["layout"],
            "load_async": spec["load_async"], "ok": bool(checks) and all(c["ok"] for c in checks) and not errors,
            "checks": checks, "errors": errors, "timings": last["timings"],
            "info": {label.rstrip(": ") or "main": res["info"] for label, res in parts}}


def run_embedded(args, mc, name, work, env, **kw):
    spec = base_spec(args, mc, name, "embedded", work, **kw)
    log(f"--- {name}: embedded, path {spec['path']}, layout {spec['layout']}, "
        f"{'async' if spec['load_async'] else 'sync'} loads, {spec['runs']} timed runs")
    return merge(name, "embedded", [("", Child(spec, env).wait())], spec)


def run_standalone(args, mc, name, work, env, **kw):
    server_bin = args.server or os.environ.get("UMBP_SERVER") or os.path.join(REPO, "build", "server", "umbp-server")
    kw = dict(kw, mode="standalone")
    spec = base_spec(args, mc, name, "store", work, **kw)
    log(f"--- {name}: standalone ({server_bin}), path {spec['path']}; A stores, B restores while A is alive, "
        "then after A exited")
    parts = []
    if not os.access(server_bin, os.X_OK):
        fail = {"checks": [{"name": "umbp-server binary found", "ok": False,
                            "detail": f"{server_bin} is not executable: set UMBP_SERVER"}],
                "timings": {}, "info": {}, "error": None}
        return merge(name, "standalone", [("", fail)], spec)
    server = Server(server_bin, spec["socket_dir"], mc["server_capacity"], os.path.join(work, f"{name}-server.log"))
    a = b1 = b2 = None
    try:
        a_data, release = os.path.join(work, f"{name}-a.json"), os.path.join(work, f"{name}-a.release")
        a = Child(dict(spec, a_data=a_data, release=release, timeout=3 * spec["timeout"]), env)
        while not os.path.exists(a_data) and a.p.poll() is None and now() - a.t0 < spec["timeout"]:
            time.sleep(0.1)
        if not os.path.exists(a_data):
            a.kill()
            return merge(name, "standalone", [("A: ", a.wait())], spec)
        b1_spec = base_spec(args, mc, name, "restore", work, suffix="-alive", a_data=a_data, pool_seed=3,
                            tag=f"{name}-alive", **dict(kw, runs=0, validate=False, partial=False))
        b1 = Child(b1_spec, env)
        r_b1 = b1.wait()
        open(release, "w").close()
        r_a = a.wait()
        b2_spec = base_spec(args, mc, name, "restore", work, suffix="-exited", a_data=a_data, pool_seed=4,
                            tag=f"{name}-exited", a_exited=True, **dict(kw, validate=False))
        b2 = Child(b2_spec, env)
        r_b2 = b2.wait()
        parts = [("A: ", r_a), ("B (A alive): ", r_b1), ("B (A exited): ", r_b2)]
        alive = server.alive()
    finally:
        for c in (a, b1, b2):
            if c is not None:
                c.kill()
        rc = server.stop()
    out = merge(name, "standalone", parts, spec)
    for c in [{"name": "umbp-server alive through A's exit and both restores", "ok": alive, "detail": ""},
              {"name": "umbp-server stops cleanly on SIGTERM", "ok": rc == 0, "detail": f"exit status {rc}"}]:
        log(f"{'PASS' if c['ok'] else 'FAIL'}  {c['name']}")
        out["checks"].append(c)
    out["ok"] = out["ok"] and alive and rc == 0
    return out


def master_binary(args):
    """The umbp-master to start: --master, $UMBP_MASTER, this tree's build,
    the one beside the loaded library, the PATH's; None when there is none."""
    import umbp

    lib_dir = os.path.dirname(umbp.library_path)
    for cand in (args.master, os.environ.get("UMBP_MASTER"), os.path.join(REPO, "build", "master", "umbp-master"),
                 os.path.join(lib_dir, "master", "umbp-master"), os.path.join(lib_dir, "umbp-master"),
                 shutil.which("umbp-master")):
        if cand and os.path.isfile(cand) and os.access(cand, os.X_OK):
            return cand
        if cand and (cand == args.master or cand == os.environ.get("UMBP_MASTER")):
            return None  # named but not there: do not fall back to another binary
    return None


def distributed_skip_reason(args):
    """Why the distributed scenario cannot run here, or None."""
    import umbp

    try:
        umbp.mode_properties("distributed")
    except Exception as e:  # noqa: BLE001
        return f"this libumbp cannot run distributed mode (no rdma tier: built without UCX?): {e}"
    if master_binary(args) is None:
        named = args.master or os.environ.get("UMBP_MASTER")
        return (f"umbp-master {named} is not an executable file" if named else
                "no umbp-master binary (pass --master, set UMBP_MASTER or build build/master/umbp-master)")
    return None


def skipped_result(name, mode, spec, why):
    log(f"SKIPPED {name}: {why}")
    return {"name": name, "mode": mode, "path": spec["path"], "layout": spec["layout"],
            "load_async": spec["load_async"], "ok": True, "skipped": why, "checks": [], "errors": [],
            "timings": {}, "info": {}}


def ucx_env(env):
    """The children's UCX settings: everything runs on this host, so UCX over
    TCP on loopback unless the caller chose transports (UCX_TLS or
    UCX_NET_DEVICES set); UCX's memory-event hooks off (umbp maps its pool
    once and needs none)."""
    env = dict(env)
    if "UCX_TLS" not in env and "UCX_NET_DEVICES" not in env:
        env.update(UCX_TLS="tcp", UCX_NET_DEVICES="lo")
    env.setdefault("UCX_MEM_EVENTS", "no")
    return env


def run_distributed(args, mc, name, work, env, **kw):
    """A real umbp-master; A (a node) stores and waits; B1 (another node, in
    another process) restores while A is alive: its blocks come from A over
    UCX; A exits, B1 exits; once the master has marked every node that held
    the blocks suspect, B2 (a third node) must miss cleanly and recompute."""
    kw = dict(kw, mode="distributed", heartbeat_ms=100)
    spec = base_spec(args, mc, name, "store", work, **kw)
    why = distributed_skip_reason(args)
    if why:
        return skipped_result(name, "distributed", spec, why)
    master_bin = master_binary(args)
    env = ucx_env(env)
    log(f"--- {name}: distributed ({master_bin}; UCX_TLS={env.get('UCX_TLS')} "
        f"UCX_NET_DEVICES={env.get('UCX_NET_DEVICES')}), path {spec['path']}; A stores, B restores from A's node "
        "while A is alive, then after A exited")
    master = Master(master_bin, os.path.join(work, f"{name}-master.log"))
    kw["master_address"] = master.address
    spec["master_address"] = master.address
    parts, gone, alive, rc = [], None, False, None
    a = b1 = b2 = None
    try:
        a_data, release = os.path.join(work, f"{name}-a.json"), os.path.join(work, f"{name}-a.release")
        a = Child(dict(spec, a_data=a_data, release=release, timeout=3 * spec["timeout"]), env)
        while not os.path.exists(a_data) and a.p.poll() is None and now() - a.t0 < spec["timeout"]:
            time.sleep(0.1)
        if not os.path.exists(a_data):
            a.kill()
            return merge(name, "distributed", [("A: ", a.wait())], spec)
        b1_spec = base_spec(args, mc, name, "restore", work, suffix="-alive", a_data=a_data, pool_seed=3,
                            tag=f"{name}-alive", **dict(kw, runs=0, validate=False))
        b1 = Child(b1_spec, env)
        r_b1 = b1.wait()
        open(release, "w").close()
        r_a = a.wait()
        # A's node and B1's (its replicas) are gone; the master drops them from
        # lookups once they are suspect (heartbeat_suspect_ms after their last
        # heartbeat).  Until then a lookup would still name them: wait for it.
        nodes = master.nodes("registered")
        t = now()
        while now() - t < 60 and not nodes <= master.nodes("suspect"):
            time.sleep(0.2)
        gone = {"name": "umbp-master marks every node that held A's blocks (A's, B1's) suspect after they exited",
                "ok": len(nodes) >= 2 and nodes <= master.nodes("suspect"),
                "detail": f"registered {sorted(nodes)}, suspect {sorted(master.nodes('suspect'))}"}
        b2_spec = base_spec(args, mc, name, "restore", work, suffix="-exited", a_data=a_data, pool_seed=4,
                            tag=f"{name}-exited", a_exited=True, expect_miss=True,
                            **dict(kw, runs=0, validate=False))
        b2 = Child(b2_spec, env)
        r_b2 = b2.wait()
        parts = [("A: ", r_a), ("B (A alive): ", r_b1), ("B (A exited): ", r_b2)]
        alive = master.alive()
    finally:
        for c in (a, b1, b2):
            if c is not None:
                c.kill()
        rc = master.stop()
    out = merge(name, "distributed", parts, spec)
    extra = [gone] if gone else []
    extra += [{"name": "umbp-master alive through the nodes' exits and both restores", "ok": alive, "detail": ""},
              {"name": "umbp-master stops cleanly on SIGTERM", "ok": rc == 0, "detail": f"exit status {rc}"}]
    for c in extra:
        log(f"{'PASS' if c['ok'] else 'FAIL'}  {c['name']}")
        out["checks"].append(c)
    out["ok"] = out["ok"] and all(c["ok"] for c in extra)
    return out


def summary_rows(results):
    rows = []
    for r in results:
        t = r["timings"]
        full, rest = median(t.get("ttft_full_ms")), median(t.get("ttft_restore_ms"))
        rows.append({
            "scenario": r["name"], "path": r["path"], "checks": f"{sum(c['ok'] for c in r['checks'])}/{len(r['checks'])}",
            "hit_tokens": t.get("hit_tokens"), "ttft_full_ms": full, "prefill_one_step_ms": median(t.get("prefill_one_step_ms")),
            "ttft_restore_ms": rest, "speedup": round(full / rest, 2) if full and rest else None,
            "speedup_vs_one_step": round(median(t["prefill_one_step_ms"]) / rest, 2)
            if t.get("prefill_one_step_ms") and rest else None,
            "lookup_ms": median(t.get("lookup_ms")), "load_ms": median(t.get("load_ms")),
            "restore_gbps": median(t.get("restore_gbps")), "restored_mb": round(t["restored_bytes"] / 1e6, 1)
            if t.get("restored_bytes") else None,
            "decode_ms_per_token": median(t.get("decode_ms_per_token_restore"))})
    return rows


def print_table(rows):
    cols = [("scenario", "scenario", 20), ("path", "path", 9), ("checks", "checks", 7), ("hit_tokens", "hit tok", 7),
            ("ttft_full_ms", "TTFT full", 9), ("prefill_one_step_ms", "1-step", 8),
            ("ttft_restore_ms", "TTFT rest", 9), ("speedup", "speedup", 7), ("lookup_ms", "lookup", 7),
            ("load_ms", "load", 7), ("restore_gbps", "GB/s", 6), ("restored_mb", "MB", 6),
            ("decode_ms_per_token", "dec/tok", 7)]

    def fmt(v, w):
        if v is None:
            s = "-"
        elif isinstance(v, float):
            s = f"{v:.3g}" if abs(v) < 100 else f"{v:.0f}"
        else:
            s = str(v)
        return s.rjust(w) if not isinstance(v, str) else s.ljust(w)

    print("\nmedians; times in ms.  TTFT full: the engine's prefill (the last block in a step of its own) to the "
          "first token; 1-step: one forward of the whole prompt;\nTTFT rest: lookup + restore + the last block to the "
          "first token; load: start_load_kv to the first layer's wait_for_layer_load returning (keys, submission, "
          "copy;\nasync loads: to the step that reports them finished); GB/s: restored bytes / load; dec/tok: decode "
          "time per token after a restore")
    print("  ".join(h.ljust(w) if i < 3 else h.rjust(w) for i, (_k, h, w) in enumerate(cols)))
    for r in rows:
        print("  ".join(fmt(r[k], w) for k, _h, w in cols))


def skip_reason(args):
    try:
        import torch as _t
    except Exception as e:  # noqa: BLE001
        return f"no torch ({e})"
    if args.device.startswith("cuda"):
        if not _t.cuda.is_available():
            return "no CUDA device (torch.cuda.is_available() is false)"
        if importlib.util.find_spec("transformers") is None:
            return "no transformers (the GPU run uses transformers.LlamaForCausalLM)"
    return None


def torch_cuda_count():
    import torch as _t

    return _t.cuda.device_count()


def write_json(path, obj):
    if not path:
        return
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(obj, f, indent=1, default=str)
    log(f"results in {path}")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mode", choices=["embedded", "standalone", "distributed", "all"], default="all")
    ap.add_argument("--device", default="cuda", help="cuda (default) or cpu (tests: the small config)")
    ap.add_argument("--preset", choices=sorted(PRESETS), help="default: gpu on cuda, cpu-small on cpu")
    ap.add_argument("--path", choices=["auto", "connector", "direct"], default="auto",
                    help="auto: UMBPConnector where it imports (plus one embedded run of the direct path), "
                         "else the direct umbp calls")
    ap.add_argument("--model", choices=["auto", "hf", "standin"], default="auto")
    ap.add_argument("--prompt-tokens", type=int)
    ap.add_argument("--decode-tokens", type=int)
    ap.add_argument("--runs", type=int, help="timed runs per phase (plus one warm-up)")
    ap.add_argument("--layers", type=int)
    ap.add_argument("--dtype", choices=["bfloat16", "float16", "float32"], help="model and KV dtype")
    ap.add_argument("--max-batched-tokens", type=int, default=16384,
                    help="prefill chunk budget (vLLM's max_num_batched_tokens)")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--server", help="umbp-server binary (default $UMBP_SERVER, else build/server/umbp-server)")
    ap.add_argument("--master", help="umbp-master binary (default $UMBP_MASTER, else build/master/umbp-master)")
    ap.add_argument("--timeout", type=int, help="seconds per process")
    ap.add_argument("--deadline", type=int, default=540,
                    help="seconds for the whole run (the GPU tool's commands get 600); scenarios not started "
                         "by then fail as not run")
    ap.add_argument("--out", help="result JSON (default $OUT/mini_engine.json when OUT is set)")
    ap.add_argument("--keep", action="store_true", help="keep the work directory")
    ap.add_argument("--only", help="comma-separated scenario names (embedded, embedded-hnd-async, "
                    "embedded-direct, standalone, distributed)")
    ap.add_argument("--tp", type=int, choices=[1, 2], default=1,
                    help="tensor parallelism: 2 runs the model's shards in two rank processes (embedded-tp2, "
                         "standalone-tp2)")
    ap.add_argument("--gpus", type=int, choices=[1, 2], default=1,
                    help="with --tp 2 on CUDA: 2 puts rank r on cuda:r (NCCL), 1 both ranks on one GPU (gloo)")
    ap.add_argument("--inject", choices=["rotate-loads", "lose-restore", "lose-one-block"], help=argparse.SUPPRESS)
    ap.add_argument("--role", help=argparse.SUPPRESS)
    ap.add_argument("--spec", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.role:
        return child_main(args)

    out = args.out or (os.path.join(os.environ["OUT"], "mini_engine.json") if os.environ.get("OUT") else None)
    why = skip_reason(args)
    if why:
        print(f"skipped: {why}", flush=True)
        write_json(out, {"ok": True, "skipped": why})
        return 0
    lib = os.environ.get("UMBP_LIBRARY")
    if lib and not os.path.exists(lib):
        print(f"FAIL: UMBP_LIBRARY={lib} does not exist (build libumbp.so or point UMBP_LIBRARY at it)", flush=True)
        return 1
    import umbp

    if args.device.startswith("cuda") and "cuda" not in umbp.gpu_backends_built():
        print(f"FAIL: {umbp.library_path} was built without the CUDA backend ({umbp.gpu_backends_built()})",
              flush=True)
        return 1
    mc = dict(PRESETS[args.preset or ("gpu" if args.device.startswith("cuda") else "cpu-small")])
    for k, v in (("prompt", args.prompt_tokens), ("decode", args.decode_tokens), ("runs", args.runs),
                 ("layers", args.layers), ("dtype", args.dtype)):
        if v is not None:
            mc[k] = v
    if args.preset is None:
        args.preset = "gpu" if args.device.startswith("cuda") else "cpu-small"
    if args.model == "auto":
        args.model = "hf" if importlib.util.find_spec("transformers") is not None else "standin"
    have_conn, where = connector_available()
    if args.path == "connector" and not have_conn:
        print(f"FAIL: --path connector, but {where}", flush=True)
        return 1
    path = "connector" if args.path in ("auto", "connector") and have_conn else "direct"
    log(f"umbp {umbp.library_path}; path {path} ({where}); model {args.model}; preset {args.preset}")
    if path == "direct" and args.path == "auto":
        log("NOTE: the vLLM connector is not importable here; the scenarios use the direct umbp calls")

    env = dict(os.environ)
    pkg_root = os.path.dirname(os.path.dirname(os.path.abspath(umbp.__file__)))
    env["PYTHONPATH"] = pkg_root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    env["UMBP_LIBRARY"] = umbp.library_path
    work = tempfile.mkdtemp(prefix="umbp-mini-", dir="/tmp")
    os.makedirs(os.path.join(work, "lk"))
    plan = []
    if args.tp > 1:
        for k, v in (("heads", mc["heads"]), ("kv_heads", mc["kv_heads"]), ("inter", mc["inter"])):
            if v % args.tp:
                print(f"FAIL: --tp {args.tp}: {k} {v} is not divisible by it", flush=True)
                return 1
        if path != "connector":
            print(f"FAIL: --tp {args.tp} runs through the vLLM connector only, which does not import here ({where})",
                  flush=True)
            return 1
        if args.device.startswith("cuda") and args.gpus > 1 and torch_cuda_count() < args.gpus:
            print(f"FAIL: --gpus {args.gpus}, but this machine has {torch_cuda_count()} CUDA device(s)", flush=True)
            return 1
    if args.tp > 1:
        if args.mode in ("embedded", "all"):
            plan.append(("embedded-tp2", run_embedded, dict(path=path, validate=True)))
        if args.mode in ("standalone", "all"):
            plan.append(("standalone-tp2", run_standalone, dict(path=path, validate=args.mode == "standalone",
                                                                 partial=True)))
    elif args.mode in ("embedded", "all"):
        plan.append(("embedded", run_embedded, dict(path=path, validate=True)))
        plan.append(("embedded-hnd-async", run_embedded, dict(path=path, layout="HND", load_async=True, runs=0)))
        if path == "connector" and args.path == "auto":
            plan.append(("embedded-direct", run_embedded, dict(path="direct")))
    if args.mode in ("standalone", "all") and args.tp == 1:
        plan.append(("standalone", run_standalone, dict(path=path, validate=args.mode == "standalone")))
    if args.mode in ("distributed", "all"):
        if args.tp == 1:
            plan.append(("distributed", run_distributed, dict(path=path, validate=args.mode == "distributed")))
        elif args.mode == "distributed":
            print("FAIL: --mode distributed runs at --tp 1 only", flush=True)
            return 1
    if args.only:
        want = set(args.only.split(","))
        plan = [x for x in plan if x[0] in want]
    global DEADLINE
    DEADLINE = now() + args.deadline
    results = []
    t0 = now()
    meta = {"path": path, "connector": where, "preset": args.preset, "model_cfg": mc, "model": args.model,
            "device": args.device, "umbp_library": umbp.library_path, "date": time.strftime("%Y-%m-%d %H:%M:%S")}
    try:
        for name, fn, kw in plan:
            if DEADLINE - now() < 30:
                results.append({"name": name, "mode": "-", "path": kw.get("path", path), "layout": "-",
                                "load_async": None, "ok": False, "errors": [], "timings": {}, "info": {},
                                "checks": [{"name": "run", "ok": False,
                                            "detail": f"not started: the run's deadline ({args.deadline} s)"}]})
                continue
            results.append(fn(args, mc, name, work, env, **kw))
            write_json(out, dict(meta, ok=False, partial=True, skipped=None, summary=summary_rows(results),
                                 scenarios=results))
    finally:
        ok = bool(results) and all(r["ok"] for r in results)
        rows = summary_rows(results)
        print_table(rows)
        for r in results:
            for c in r["checks"]:
                if not c["ok"]:
                    print(f"FAILED  {r['name']}: {c['name']}  ({c['detail']})")
            if r.get("skipped"):
                print(f"SKIPPED {r['name']}: {r['skipped']}")
            for e in r["errors"]:
                print(f"ERROR   {r['name']}: {e}")
        n = sum(len(r["checks"]) for r in results)
        npass = sum(c["ok"] for r in results for c in r["checks"])
        print(f"\n{'PASS' if ok else 'FAIL'}: {npass}/{n} checks in {len(results)} scenarios "
              f"({now() - t0:.0f} s)", flush=True)
        write_json(out, dict(meta, ok=ok, partial=False, skipped=None, summary=rows, scenarios=results))
        if ok and not args.keep:
            shutil.rmtree(work, ignore_errors=True)
        else:
            log(f"work directory kept: {work}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

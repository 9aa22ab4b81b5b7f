"""The naive reference implementation — the oracle the cached engine and the decoders are tested against.

Obviously correct and slow, written independently of the engine's attention/MoE/router code:

* no KV cache — every forward runs the **whole** sequence ``[0, end of the current block)`` from token
  embeddings, HF-generate style (docs/engine.md §6.1);
* attention with an explicit ``T×T`` additive block-causal mask built as in HF
  (``tril(ones(nb, nb))`` expanded by ``B×B``, docs/engine.md §4), K/V heads repeated for GQA;
* router written out step by step (sigmoid, +bias, group top-2 sums, kept groups, top-k, renormalise,
  × scaling; docs/engine.md §2) and a plain loop over **every** expert, each applied to all tokens and
  weighted by its (possibly zero) routing weight.

It shares only the elementwise primitives (RMSNorm, RoPE, SwiGLU) and the parameter dict with the engine.
Two ways to decode with it:

* :class:`ReferenceBackend` drives the engine's decoders through :func:`repro.engine.decode_loop.generate_ids`
  (checks the cached forward, any decoder setting);
* :func:`reference_generate` is the decoding loop itself written out from the LLaDA2.1 reference ``generate``
  (Hugging Face remote code of ``inclusionAI/LLaDA2.1-mini``, ``modeling_llada2_moe.py``) and SGLang's
  ``LowConfidence`` / ``JointThreshold`` (``python/sglang/srt/dllm/algorithm/``), sharing no decoder code
  with :mod:`repro.engine.decoders` (checks the decoders and their on-device step; greedy, no
  self-conditioning).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch

from repro.engine.layers.mlp import swiglu
from repro.engine.layers.norm import rms_norm
from repro.engine.layers.rotary import apply_rope, rope_cos_sin
from repro.engine.model import LLaDA2Model

if TYPE_CHECKING:
    from repro.engine.request import GenerationResult


def block_causal_mask(T: int, B: int, device) -> torch.Tensor:
    """Additive ``[T, T]`` fp32 mask: 0 where key block ≤ query block, −inf elsewhere (HF construction)."""
    nb = -(-T // B)
    allowed = torch.tril(torch.ones(nb, nb, device=device))
    allowed = allowed.repeat_interleave(B, 0).repeat_interleave(B, 1)[:T, :T]
    return torch.zeros(T, T, device=device).masked_fill(allowed == 0, float("-inf"))


def naive_route(x: torch.Tensor, router: torch.Tensor, bias: torch.Tensor | None, k: int, n_group: int,
                topk_group: int, scaling: float, norm: bool) -> torch.Tensor:
    """Dense routing matrix ``[n, E]`` fp32: the combine weight of expert e for token t (0 if unchosen)."""
    n, E = x.shape[0], router.shape[0]
    scores = torch.sigmoid(x.float() @ router.float().t())
    biased = scores + (bias.float() if bias is not None else 0.0)
    per = E // n_group
    group_score = torch.stack([biased[:, g * per:(g + 1) * per].sort(dim=-1, descending=True).values[:, :2].sum(-1)
                               for g in range(n_group)], dim=-1)
    kept_groups = group_score.argsort(dim=-1, descending=True)[:, :topk_group]
    allowed = torch.zeros(n, E, dtype=torch.bool, device=x.device)
    for t in range(n):
        for g in kept_groups[t].tolist():
            allowed[t, g * per:(g + 1) * per] = True
    cand = torch.where(allowed, biased, torch.full_like(biased, float("-inf")))
    chosen = cand.argsort(dim=-1, descending=True)[:, :k]
    dense = torch.zeros(n, E, device=x.device)
    dense.scatter_(1, chosen, scores.gather(1, chosen))
    if norm:
        dense = dense / (dense.sum(-1, keepdim=True) + 1e-20)
    return dense * scaling


def naive_forward(model: LLaDA2Model, embeds: torch.Tensor, block_size: int) -> torch.Tensor:
    """Full-sequence forward: embeds ``[T, D]`` at positions 0..T-1 → logits ``[T, V]`` fp32."""
    c, p = model.cfg, model.params
    T = embeds.shape[0]
    H, K, hd = c.num_attention_heads, c.num_key_value_heads, c.head_dim
    mask = block_causal_mask(T, block_size, embeds.device)
    cos, sin = rope_cos_sin(torch.arange(T, device=embeds.device), c.rotary_dim, c.rope_theta, embeds.dtype)
    h = embeds
    for l in range(c.num_hidden_layers):
        q_ = f"layers.{l}."
        a = rms_norm(h, p[q_ + "attn_norm"], c.rms_norm_eps)
        qkv = a @ p[q_ + "wqkv"].t()
        q = qkv[:, : H * hd].view(T, H, hd)
        k = qkv[:, H * hd:(H + K) * hd].view(T, K, hd)
        v = qkv[:, (H + K) * hd:].view(T, K, hd)
        q = apply_rope(rms_norm(q, p[q_ + "q_norm"], c.rms_norm_eps), cos, sin)
        k = apply_rope(rms_norm(k, p[q_ + "k_norm"], c.rms_norm_eps), cos, sin)
        outs = []
        for head in range(H):
            kv = head // (H // K)
            s = (q[:, head].float() @ k[:, kv].float().t()) / math.sqrt(hd) + mask
            outs.append(torch.softmax(s, dim=-1).to(v.dtype) @ v[:, kv])
        o = torch.stack(outs, dim=1).reshape(T, H * hd)
        h = h + o @ p[q_ + "wo"].t()
        m = rms_norm(h, p[q_ + "mlp_norm"], c.rms_norm_eps)
        if l < c.first_k_dense_replace:
            h = h + swiglu(m, p[q_ + "mlp.w_gate_up"], p[q_ + "mlp.w_down"])
            continue
        e_ = q_ + "moe."
        wts = naive_route(m, p[e_ + "router"], p.get(e_ + "expert_bias"), c.num_experts_per_tok, c.n_group,
                          c.topk_group, c.routed_scaling_factor, c.norm_topk_prob)
        routed = torch.zeros(T, c.hidden_size, dtype=torch.float32, device=m.device)
        for e in range(c.num_experts):
            y = swiglu(m, p[e_ + "w_gate_up"][e], p[e_ + "w_down"][e])
            routed = routed + wts[:, e:e + 1] * y.float()
        out = routed.to(m.dtype)
        if e_ + "shared_gate_up" in p:
            out = out + swiglu(m, p[e_ + "shared_gate_up"], p[e_ + "shared_down"])
        h = h + out
    h = rms_norm(h, p["final_norm"], c.rms_norm_eps)
    return (h @ p["lm_head"].t()).float()


class ReferenceBackend:
    """No-cache :class:`~repro.engine.decode_loop.ForwardBackend`: keeps the final token prefix, recomputes everything."""

    def __init__(self, model: LLaDA2Model):
        self.model = model

    def begin(self, capacity: int, block_size: int) -> None:
        """Start a request (no cache to allocate)."""
        self.block_size = block_size
        self.prefix = torch.empty(0, dtype=torch.long, device=self.model.device)

    def prefill(self, ids, start: int = 0):
        """Append prompt blocks ``ids`` (at ``start``, the prefix so far) and run one full forward over the
        prefix (result unused, as a prefill)."""
        if start != self.prefix.shape[0]:
            raise RuntimeError(f"reference prefix has {self.prefix.shape[0]} tokens, prefill starts at {start}")
        self.prefix = torch.cat([self.prefix, ids])
        naive_forward(self.model, self.model.embed(self.prefix), self.block_size)

    def denoise(self, ids, start, embeds):
        """Full forward over ``prefix + block``; logits of the block positions."""
        if start != self.prefix.shape[0]:
            raise RuntimeError(f"reference prefix has {self.prefix.shape[0]} tokens, block starts at {start}")
        blk = embeds if embeds is not None else self.model.embed(ids)
        x = torch.cat([self.model.embed(self.prefix), blk], dim=0)
        return naive_forward(self.model, x, self.block_size)[start:]

    def commit_block(self, ids, start, run_forward):
        """Append the final block to the prefix; the commit forward (if asked) recomputes it, unused."""
        self.prefix = torch.cat([self.prefix, ids])
        if run_forward:
            naive_forward(self.model, self.model.embed(self.prefix), self.block_size)


def reference_generate(model: LLaDA2Model, prompt_ids: list[int], decoder: dict, *, mask_id: int, eos_id: int,
                       max_new_tokens: int) -> "GenerationResult":
    """Greedy block decoding written out from the references (module docstring), on :func:`naive_forward`.

    ``decoder``: engine decoder keys (``algorithm`` ``low_confidence`` | ``joint_threshold`` | ``orl``
    without self-conditioning; ``threshold``, ``edit_threshold``, ``editing``, ``max_post_steps``,
    ``num_to_transfer``, ``exclude_mask_token``, ``block_size``); missing keys take the algorithm's defaults.
    Per block (positions ``[s, s+B)``, prompt positions fixed), loop:

    1. no ``<|mask|>`` left: without editing the block is done; else ``post += 1`` and done once
       ``post > max_post_steps`` (LLaDA2.1 ``generate``);
    2. forward over ``[0, s+B)``; ``x = argmax``, ``p = softmax[x]`` over the full vocabulary (``<|mask|>``
       logit −inf only with ``exclude_mask_token``);
    3. fill: masked positions with ``p > threshold``, else the ``num_to_transfer`` most confident masked;
    4. edit (editing on): non-mask, non-prompt positions with ``p > edit_threshold`` and ``x ≠ current``;
    5. write ``x`` on fill ∪ edit; with editing, a step that started without masks and edited nothing ends
       the block (its forward saw the final tokens).

    A block stops after ``block_size`` forwards for ``low_confidence`` (the LLaDA2.0 generate's ``steps``), else
    after SGLang's ``max_steps``, ``block_size (+ max_post_steps with editing) + 1``, tokens as they are (listed in
    ``stalled_blocks``). Counting as the engine's loop: one prefill forward for the full prompt blocks, the
    denoising forwards, and a commit forward unless the last forward already saw the final tokens. Stops after
    the block holding an EOS or the ``max_new_tokens``-th position. Returns a
    :class:`~repro.engine.decode_loop.GenerationResult`. Raises ValueError for sampling or self-conditioning.
    """
    from repro.engine.request import GenerationResult
    from repro.engine.decoders import algorithm_defaults

    algo = decoder.get("algorithm", "joint_threshold")
    d = {**algorithm_defaults(algo), **{k: v for k, v in decoder.items() if v is not None}}
    if d["temperature"] > 0 or d["self_conditioning"]:
        raise ValueError("reference_generate is greedy without self-conditioning; use ReferenceBackend with "
                         "generate_ids for sampling or the ORL residual")
    B, P, G = d["block_size"], len(prompt_ids), max_new_tokens
    editing = algo != "low_confidence" and d["editing"]
    cap = B if algo == "low_confidence" else B + (d["max_post_steps"] if editing else 0) + 1
    dev = model.device
    n_blocks = -(-(P + G) // B)
    x_all = torch.full((n_blocks * B,), mask_id, dtype=torch.long, device=dev)
    x_all[:P] = torch.tensor(prompt_ids, dtype=torch.long, device=dev)
    counts = {"prefill": 0, "denoise": 0, "commit": 0}
    per_block, stalled = [], []

    def forward(end):
        return naive_forward(model, model.embed(x_all[:end]), B)

    first = P // B
    if first:
        forward(first * B)
        counts["prefill"] += 1
    end = P
    for b in range(first, n_blocks):
        s, end = b * B, (b + 1) * B
        is_prompt = torch.arange(s, end, device=dev) < P
        post, n, seen = 0, 0, None
        while True:
            cur = x_all[s:end]
            mask_index = (cur == mask_id) & ~is_prompt
            if not bool(mask_index.any()):
                if not editing:
                    break
                post += 1
                if post > d["max_post_steps"]:
                    break
            if n == cap:
                stalled.append(b)
                break
            logits = forward(end)[s:end]
            if d["exclude_mask_token"]:
                logits[:, mask_id] = float("-inf")
            p, x = torch.softmax(logits, dim=-1).max(dim=-1)
            n += 1
            seen = cur.clone()
            fill = torch.zeros_like(mask_index)
            if bool(mask_index.any()):
                conf = torch.where(mask_index, p, torch.full_like(p, float("-inf")))
                fill = conf > d["threshold"]
                if int(fill.sum()) < d["num_to_transfer"]:
                    k = min(d["num_to_transfer"], int(mask_index.sum()))
                    fill = torch.zeros_like(mask_index)
                    fill[torch.topk(conf, k).indices] = True
            edit = torch.zeros_like(mask_index)
            if editing:
                edit = (p > d["edit_threshold"]) & (cur != x) & ~mask_index & ~is_prompt
            x_all[s:end] = torch.where(fill | edit, x, cur)
            if editing and not bool(mask_index.any()) and not bool(edit.any()):
                break
        reuse = seen is not None and bool(torch.equal(seen, x_all[s:end]))
        if not reuse:
            forward(end)
        counts["denoise"] += n
        counts["commit"] += 0 if reuse else 1
        per_block.append(n + (0 if reuse else 1))
        if bool((x_all[P:end] == eos_id).any()) or end - P >= G:
            break
    raw = x_all[P:min(P + G, end)].tolist()
    out, finish = raw, "length"
    if eos_id in raw:
        out, finish = raw[: raw.index(eos_id)], "eos"
    return GenerationResult(token_ids=out, raw_ids=raw, forwards=counts, finish_reason=finish,
                            block_forwards=per_block, stalled_blocks=stalled)

"""NVFP4 (ModelOpt Hugging Face export) for the routed-expert weights: quantize (tiny writer) and dequantize (loader).

Format (docs/engine.md §14; NVIDIA ModelOpt NVFP4 export as shipped by LLaDA2.1-mini-ORL-NVFP4): for each quantized
Linear weight ``W [out, in]`` (here: every routed expert's ``gate_proj`` / ``up_proj`` / ``down_proj``) the
checkpoint holds, under the module prefix ``X`` (``X.weight`` in the bf16 checkpoint):

* ``X.weight`` — uint8 ``[out, in/2]``: FP4 E2M1 codes, two per byte, element ``2j`` in the **low** nibble and
  ``2j+1`` in the high nibble (this project's stated packing order);
* ``X.weight_scale`` — float8 E4M3 ``[out, in/16]``: one scale per 16-element block along ``in``;
* ``X.weight_scale_2`` — fp32 scalar: the global scale, ``amax(|W|) / (6 · 448)``;
* ``X.input_scale`` — fp32 scalar: activation global scale (FP4 activations on Blackwell; unused when
  dequantizing to bf16 on Hopper, kept so the file layout is the export's).

E2M1 code ``c`` (bit 3 = sign, bits 0–2 index) has magnitude ``[0, 0.5, 1, 1.5, 2, 3, 4, 6][c & 7]``.
Dequantization: ``W ≈ e2m1(c) · float(weight_scale[block]) · weight_scale_2``.
Quantization (round to nearest on the E2M1 grid, ties to the lower magnitude): block scale
``s_b = e4m3(amax_b / 6 / weight_scale_2)``, ``c = nearest(W / (s_b · weight_scale_2))``, clamped to ±6.

``config.json`` gets ``quantization_config`` (``quant_method`` modelopt, ``quant_algo`` NVFP4,
``group_size`` 16) and the directory gets ``hf_quant_config.json``; :mod:`repro.engine.weights` dequantizes
on load when ``quant_algo`` is NVFP4 (precision ``bf16``/``fp32``), or keeps the experts packed in an
:class:`NVFP4Experts` (precision ``nvfp4-w4a16``: the MoE kernels dequantize in registers to exactly the
values of :func:`dequantize`). Not here: FP4 tensor-core kernels (Blackwell only).
"""

from __future__ import annotations

import re

import torch

GROUP = 16
E4M3_MAX = 448.0
E2M1_VALUES = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
#: Checkpoint tensors quantized by the tiny writer (routed experts only; everything else stays bf16).
QUANTIZED = re.compile(r"model\.layers\.\d+\.mlp\.experts\.\d+\.(gate|up|down)_proj\.weight\Z")
SUFFIXES = ("weight_scale", "weight_scale_2", "input_scale")


def quantization_config() -> dict:
    """The ``quantization_config`` block written into config.json."""
    return {"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": GROUP,
            "ignore": ["lm_head", "model.word_embeddings", "*attention*", "*mlp.gate", "*shared_experts*",
                       "model.layers.0.mlp*", "model.orl_adapter*"]}


def hf_quant_config() -> dict:
    """Content of ``hf_quant_config.json`` (ModelOpt layout)."""
    q = quantization_config()
    return {"producer": {"name": "modelopt", "version": "repro-tiny"},
            "quantization": {"quant_algo": "NVFP4", "kv_cache_quant_algo": None, "group_size": GROUP,
                             "exclude_modules": q["ignore"]}}


def quantize(w: torch.Tensor) -> dict[str, torch.Tensor]:
    """Quantize ``w`` ``[out, in]`` (in divisible by 16) → ``{weight, weight_scale, weight_scale_2, input_scale}``.

    Raises ValueError if ``in`` is not a multiple of 16.
    """
    out_f, in_f = w.shape
    if in_f % GROUP:
        raise ValueError(f"NVFP4 needs in_features divisible by {GROUP}, got {tuple(w.shape)}")
    wf = w.float()
    gscale = (wf.abs().max() / (6.0 * E4M3_MAX)).clamp(min=1e-12)
    blocks = wf.view(out_f, in_f // GROUP, GROUP)
    bscale = (blocks.abs().amax(-1) / 6.0 / gscale).clamp(max=E4M3_MAX).to(torch.float8_e4m3fn)
    eff = bscale.float() * gscale
    scaled = blocks / torch.where(eff > 0, eff, torch.ones_like(eff))[..., None]
    mag = scaled.abs().clamp(max=6.0)
    idx = (mag[..., None] - E2M1_VALUES).abs().argmin(-1)  # first minimum → ties to the lower magnitude
    code = (idx | ((scaled < 0).to(torch.long) << 3)).to(torch.uint8).view(out_f, in_f)
    packed = code[:, 0::2] | (code[:, 1::2] << 4)
    return {"weight": packed.contiguous(), "weight_scale": bscale.contiguous(),
            "weight_scale_2": gscale.reshape(()).float(), "input_scale": torch.tensor(1.0)}


def dequantize(packed: torch.Tensor, weight_scale: torch.Tensor, weight_scale_2: torch.Tensor,
               dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Inverse of :func:`quantize`: packed uint8 ``[out, in/2]``, E4M3 ``[out, in/16]``, fp32 scalar →
    ``[out, in]`` in ``dtype``. Raises ValueError on inconsistent shapes."""
    out_f, half = packed.shape
    in_f = half * 2
    if packed.dtype != torch.uint8 or tuple(weight_scale.shape) != (out_f, in_f // GROUP):
        raise ValueError(f"NVFP4 shapes: weight {tuple(packed.shape)} {packed.dtype}, "
                         f"weight_scale {tuple(weight_scale.shape)} (expected ({out_f}, {in_f // GROUP}))")
    lo, hi = packed & 0xF, packed >> 4
    code = torch.stack([lo, hi], dim=-1).reshape(out_f, in_f).long()
    vals = E2M1_VALUES.to(packed.device)[code & 7] * torch.where(code >= 8, -1.0, 1.0)
    s = weight_scale.float().repeat_interleave(GROUP, dim=1) * weight_scale_2.float()
    return (vals * s).to(dtype)


def check_group(packed: torch.Tensor, weight_scale: torch.Tensor, weight_scale_2: torch.Tensor, out_f: int,
                in_f: int) -> None:
    """Check one NVFP4 group against the logical weight ``[out_f, in_f]``: ``weight`` uint8 ``[out, in/2]``,
    ``weight_scale`` float8_e4m3fn ``[out, in/16]``, ``weight_scale_2`` one float. Raises ValueError naming the
    part, its shape and dtype, and the expected ones."""
    want = {"weight": (packed, (out_f, in_f // 2), torch.uint8),
            "weight_scale": (weight_scale, (out_f, in_f // GROUP), torch.float8_e4m3fn)}
    for name, (t, shp, dt) in want.items():
        if tuple(t.shape) != shp or t.dtype != dt:
            raise ValueError(f"NVFP4 {name} is {list(t.shape)} {t.dtype}, expected {list(shp)} {dt} (ModelOpt "
                             f"NVFP4 export layout)")
    if weight_scale_2.numel() != 1 or not weight_scale_2.dtype.is_floating_point:
        raise ValueError(f"NVFP4 weight_scale_2 must be one float (the per-tensor global scale), got "
                         f"{list(weight_scale_2.shape)} {weight_scale_2.dtype}")


def check_export(root, quantization_config: dict) -> None:
    """Check that a checkpoint directory is an NVFP4 ModelOpt export this engine reads: ``quant_algo`` NVFP4,
    ``group_size`` 16 in config.json's ``quantization_config``, and an ``hf_quant_config.json`` that agrees.

    Raises ValueError naming the file, the key and the fix."""
    import json
    from pathlib import Path

    algo = str(quantization_config.get("quant_algo", "")).upper()
    if algo != "NVFP4":
        raise ValueError(f"{root}/config.json: quantization_config.quant_algo {quantization_config.get('quant_algo')!r} "
                         f"is not supported (this engine reads NVFP4 ModelOpt exports, or unquantized checkpoints)")
    if int(quantization_config.get("group_size", GROUP)) != GROUP:
        raise ValueError(f"{root}/config.json: NVFP4 group_size {quantization_config.get('group_size')} != {GROUP}")
    hq = Path(root) / "hf_quant_config.json"
    if not hq.is_file():
        raise ValueError(f"{hq} is missing: config.json declares an NVFP4 ModelOpt export, whose directory holds "
                         f"hf_quant_config.json (a partial download? re-download the checkpoint)")
    try:
        q = json.loads(hq.read_text())["quantization"]
    except (ValueError, KeyError, TypeError) as e:
        raise ValueError(f"{hq}: not a ModelOpt hf_quant_config.json with a 'quantization' block ({e!r})") from None
    if str(q.get("quant_algo", "")).upper() != "NVFP4" or int(q.get("group_size", GROUP)) != GROUP:
        raise ValueError(f"{hq}: quant_algo {q.get('quant_algo')!r} / group_size {q.get('group_size')} disagree "
                         f"with config.json (NVFP4, {GROUP})")


def quantize_experts(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Replace every routed-expert ``X.weight`` of a checkpoint dict by its four NVFP4 tensors."""
    out = {}
    for name, t in tensors.items():
        if QUANTIZED.match(name):
            prefix = name[: -len("weight")]
            for k, v in quantize(t).items():
                out[prefix + k] = v
        else:
            out[name] = t
    return out


def group_quantized_names(names: list[str], expected: dict[str, tuple[int, ...]]) -> tuple[dict[str, dict], list[str]]:
    """Fold each complete NVFP4 group (``X.weight`` + ``X.weight_scale`` + ``X.weight_scale_2`` [+ ``X.input_scale``])
    whose logical name ``X.weight`` is expected into that one logical name.

    Returns ``(groups, logical_names)``: ``groups[X.weight] = {"weight", "weight_scale", "weight_scale_2",
    "input_scale" (or None)}``; ``logical_names`` = ``names`` with each group's
    parts replaced by ``X.weight``. Incomplete groups are left as they are (the loader then lists the parts
    as unexpected and the weight as missing).
    """
    present = set(names)
    groups: dict[str, dict] = {}
    consumed: set[str] = set()
    for n in names:
        if not n.endswith(".weight_scale"):
            continue
        prefix = n[: -len("weight_scale")]
        w = prefix + "weight"
        if w in expected and w in present and prefix + "weight_scale_2" in present:
            parts = {"weight": w, "weight_scale": n, "weight_scale_2": prefix + "weight_scale_2",
                     "input_scale": prefix + "input_scale" if prefix + "input_scale" in present else None}
            groups[w] = parts
            consumed.update(v for v in parts.values() if v)
    logical = [n for n in names if n not in consumed] + list(groups)
    return groups, sorted(set(logical))


#: ``NVFP4Experts.layout`` values: "modelopt" = the export's byte order (element 2j in the low nibble of byte j);
#: "lut" = the same bits permuted inside each 4-byte word for the lookup-table decode of the 4-bit kernels;
#: "hop" = permuted for the shift-and-mask decode (W4_DECODE 5 / 6, :func:`to_hop_layout`).
LAYOUTS = ("modelopt", "lut", "hop")


def _words(q: torch.Tensor) -> torch.Tensor:
    """uint8 ``[..., in/2]`` (in/2 a multiple of 4) -> int64 ``[..., in/8]`` little-endian 32-bit words."""
    b = q.reshape(*q.shape[:-1], q.shape[-1] // 4, 4).long()
    return b[..., 0] | (b[..., 1] << 8) | (b[..., 2] << 16) | (b[..., 3] << 24)


def _bytes(w: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`_words`."""
    return torch.stack([(w >> (8 * i)) & 0xFF for i in range(4)], -1).reshape(*w.shape[:-1], -1).to(torch.uint8)


def to_lut_layout(q: torch.Tensor) -> torch.Tensor:
    """ModelOpt packed codes uint8 ``[..., in/2]`` -> the "lut" layout (same shape, same bytes per weight).

    A 4-byte word holds the 8 codes of inputs 8t..8t+7 (all in one 16-input scale block). With X_i = input 8t+2i and
    X_{4+i} = input 8t+2i+1 (i = 0..3; the even / odd inputs of byte i in the export), the word carries the 3
    magnitude bits of X_k in bits 4k..4k+2 (k = 0..7), the sign of X_i in bit 8i+7 and the sign of X_{4+i} in bit
    8i+3. So ``w & 0x77777777`` is four byte-permute selectors per 16-bit half and ``w & 0x80808080`` (``(w << 4) &
    0x80808080``) puts the signs of X_0..X_3 (X_4..X_7) on the high byte of each bf16 (the decode in
    repro/engine/kernels/moe_w4.py). Raises ValueError unless the last dimension is a multiple of 4."""
    if q.dtype != torch.uint8 or q.shape[-1] % 4:
        raise ValueError(f"to_lut_layout: need uint8 [..., in/2] with in/2 a multiple of 4, got {list(q.shape)} "
                         f"{q.dtype}")
    w = _words(q)
    out = torch.zeros_like(w)
    for i in range(4):
        lo = (w >> (8 * i)) & 0xF         # X_i (even input)
        hi = (w >> (8 * i + 4)) & 0xF     # X_{4+i} (odd input)
        out |= ((lo & 7) << (4 * i)) | ((hi & 7) << (16 + 4 * i))
        out |= ((lo >> 3) << (8 * i + 7)) | ((hi >> 3) << (8 * i + 3))
    return _bytes(out)


def from_lut_layout(q: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`to_lut_layout` (back to the ModelOpt byte order)."""
    w = _words(q)
    out = torch.zeros_like(w)
    for i in range(4):
        lo = ((w >> (4 * i)) & 7) | (((w >> (8 * i + 7)) & 1) << 3)
        hi = ((w >> (16 + 4 * i)) & 7) | (((w >> (8 * i + 3)) & 1) << 3)
        out |= (lo | (hi << 4)) << (8 * i)
    return _bytes(out)


#: "hop" layout: (half, field) of input 8t+j in its 4-byte word (j = 0..7): fields A, B, C, D of each 16-bit half
#: hold the sign at bit 15 / 12 / 9 / 14 and the 3 magnitude bits at 8..6 / 5..3 / 2..0 / (11, 10, 13)
_HOP_SLOTS = ((0, 0), (0, 2), (1, 0), (1, 2), (0, 1), (0, 3), (1, 1), (1, 3))
_HOP_SIGN = (15, 12, 9, 14)


def _hop_field(code: torch.Tensor, f: int) -> torch.Tensor:
    """A 4-bit e2m1 code (int64 tensor) placed in field ``f`` of a 16-bit half (the "hop" layout)."""
    s, em = (code >> 3) & 1, code & 7
    if f == 3:
        return (s << 14) | (((em >> 1) & 3) << 10) | ((em & 1) << 13)
    return (s << _HOP_SIGN[f]) | (em << (6 - 3 * f))


def to_hop_layout(q: torch.Tensor) -> torch.Tensor:
    """ModelOpt packed codes uint8 ``[..., in/2]`` -> the "hop" layout (same shape, same bytes per weight).

    A 4-byte word holds the 8 codes of inputs 8t..8t+7 (one 16-input scale block), placed so that masks and
    shifts put each code's sign and magnitude bits straight into the sign / exponent-LSB / mantissa-MSB bits of a
    bf16 (bits 15, 8..6) — the bit interleave of OpenAI triton_kernels' Hopper MXFP4 value layout
    (``tensor_details/layout_details/hopper_value.py``, ``_pack_bits``) inside each word: ``w & M``, ``(w << 3) &
    M``, ``(w << 6) & M`` (M = 0x81C081C0) give the bf16 pairs of inputs (0, 2), (4, 6), (1, 3) and five more
    operations (5, 7); see ``moe_w4_hop``. Raises ValueError unless uint8 with the last dimension a multiple of 4."""
    if q.dtype != torch.uint8 or q.shape[-1] % 4:
        raise ValueError(f"to_hop_layout: need uint8 [..., in/2] with in/2 a multiple of 4, got {list(q.shape)} "
                         f"{q.dtype}")
    w = _words(q)
    out = torch.zeros_like(w)
    for j, (half, f) in enumerate(_HOP_SLOTS):
        code = (w >> (4 * j)) & 0xF  # input 8t+j: nibble j of the ModelOpt word (byte j//2, low nibble if j even)
        out |= _hop_field(code, f) << (16 * half)
    return _bytes(out)


def from_hop_layout(q: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`to_hop_layout` (back to the ModelOpt byte order)."""
    w = _words(q)
    out = torch.zeros_like(w)
    for j, (half, f) in enumerate(_HOP_SLOTS):
        h = (w >> (16 * half)) & 0xFFFF
        s = (h >> _HOP_SIGN[f]) & 1
        em = ((((h >> 10) & 3) << 1) | ((h >> 13) & 1)) if f == 3 else (h >> (6 - 3 * f)) & 7
        out |= (em | (s << 3)) << (4 * j)
    return _bytes(out)


_TO_LAYOUT = {"modelopt": lambda q: q, "lut": to_lut_layout, "hop": to_hop_layout}
_FROM_LAYOUT = {"modelopt": lambda q: q, "lut": from_lut_layout, "hop": from_hop_layout}


class NVFP4Experts:
    """The routed experts' stacked projection ``[E, out, in]`` of one MoE layer, kept in NVFP4 in memory.

    ``q`` uint8 ``[E, out, in/2]``: the e2m1 codes in ``layout`` "lut" (the default: the export's bits permuted
    inside each 4-byte word for the kernels' lookup-table decode, :func:`to_lut_layout`) or "modelopt" (the
    export's order, even element in the low nibble; read by the older decodes ``W4_DECODE`` 0/1), ``s`` uint8
    ``[E, out, in/16]`` (the E4M3 block scales' bits), ``g`` fp32 ``[E, parts]``: the per-tensor global scale
    ``weight_scale_2`` of each checkpoint tensor stacked along ``out`` (``w_gate_up``: parts = 2, rows
    ``[0, out/2)`` from ``gate_proj``, the rest from ``up_proj``; ``w_down``: parts = 1). ``dtype``: the
    dtype the values are dequantized to (the model dtype). ``shared``: optional ``[out, in]`` tensor of
    the shared expert in ``dtype`` (not quantized), which the MoE kernels treat as expert index E.

    ``experts[e]`` dequantizes expert e to ``[out, in]`` in ``dtype`` — bit-identical to loading the same
    checkpoint with dequantize-at-load (:func:`dequantize` in fp32, then one rounding to ``dtype``) — so
    the plain torch MoE path runs on it unchanged (slowly: one dequantization per expert per call).
    """

    def __init__(self, E: int, out_f: int, in_f: int, parts: int, dtype: torch.dtype, device="cpu",
                 layout: str = "lut"):
        if in_f % GROUP or out_f % parts:
            raise ValueError(f"NVFP4Experts: in_features {in_f} must be a multiple of {GROUP} and out {out_f} "
                             f"of parts {parts}")
        if layout not in LAYOUTS:
            raise ValueError(f"NVFP4Experts: layout {layout!r} is not one of {LAYOUTS}")
        self.E, self.out_f, self.in_f, self.parts, self.dtype = E, out_f, in_f, parts, dtype
        self.layout = layout
        self.q = torch.zeros(E, out_f, in_f // 2, dtype=torch.uint8, device=device)
        self.s = torch.zeros(E, out_f, in_f // GROUP, dtype=torch.uint8, device=device)
        self.g = torch.zeros(E, parts, dtype=torch.float32, device=device)
        self.shared: torch.Tensor | None = None

    @property
    def shape(self) -> tuple[int, int, int]:
        return (self.E, self.out_f, self.in_f)

    @property
    def device(self) -> torch.device:
        return self.q.device

    @property
    def nbytes(self) -> int:
        """Bytes held in memory (packed values + block scales + global scales; the shared expert excluded)."""
        return self.q.nbytes + self.s.nbytes + self.g.nbytes

    def load_part(self, e: int, part: int, packed: torch.Tensor, weight_scale: torch.Tensor,
                  weight_scale_2: torch.Tensor) -> None:
        """Copy one checkpoint tensor's NVFP4 group into rows of part ``part`` of expert ``e``.

        Raises ValueError naming the dtype or shape that does not fit (:func:`check_group`)."""
        rows = self.out_f // self.parts
        check_group(packed, weight_scale, weight_scale_2, rows, self.in_f)
        r = slice(part * rows, (part + 1) * rows)
        self.q[e, r].copy_(_TO_LAYOUT[self.layout](packed))
        self.s[e, r].copy_(weight_scale.view(torch.uint8))
        self.g[e, part] = weight_scale_2.float().reshape(())

    def with_shared(self, shared: torch.Tensor | None) -> "NVFP4Experts":
        """The same packed tensors (no copy) with ``shared`` as expert index E for the MoE kernels."""
        o = object.__new__(NVFP4Experts)
        o.__dict__.update(self.__dict__)
        o.shared = shared
        return o

    def _dequantize(self, sel) -> torch.Tensor:
        """Experts ``sel`` (an index or a slice) → ``[n, out, in]`` in ``dtype``: per element e2m1 · (E4M3 · g) in
        fp32, then one rounding — the operations of :func:`dequantize` in the same order, so bit-identical."""
        q, sc, g = self.q[sel], self.s[sel].view(torch.float8_e4m3fn).float(), self.g[sel]
        q = _FROM_LAYOUT[self.layout](q)
        n = q.shape[0]
        code = torch.stack([q & 0xF, q >> 4], dim=-1).reshape(n, self.out_f, self.in_f).long()
        vals = E2M1_VALUES.to(q.device)[code & 7] * torch.where(code >= 8, -1.0, 1.0)
        gs = g.repeat_interleave(self.out_f // self.parts, dim=1)[:, :, None]  # [n, out, 1]
        return (vals * (sc.repeat_interleave(GROUP, dim=2) * gs)).to(self.dtype)

    def __getitem__(self, e: int) -> torch.Tensor:
        return self._dequantize(slice(e, e + 1))[0]

    def dequantize(self, chunk: int = 16) -> torch.Tensor:
        """All experts ``[E, out, in]`` in ``dtype`` (what dequantize-at-load holds), ``chunk`` experts at a time."""
        return torch.cat([self._dequantize(slice(i, i + chunk)) for i in range(0, self.E, chunk)], 0)

    def with_layout(self, layout: str, chunk: int = 16) -> "NVFP4Experts":
        """The same experts with ``q`` in ``layout`` (self when it already is; else a converted copy of q, s, g
        shared, ``chunk`` experts at a time). Raises ValueError for an unknown layout."""
        if layout == self.layout:
            return self
        o = NVFP4Experts(self.E, self.out_f, self.in_f, self.parts, self.dtype, self.device, layout)
        for i in range(0, self.E, chunk):
            o.q[i:i + chunk].copy_(_TO_LAYOUT[layout](_FROM_LAYOUT[self.layout](self.q[i:i + chunk])))
        o.s, o.g, o.shared = self.s, self.g, self.shared
        return o

    def to(self, device) -> "NVFP4Experts":
        """A copy on ``device`` (the shared expert too)."""
        o = NVFP4Experts(self.E, self.out_f, self.in_f, self.parts, self.dtype, device, self.layout)
        o.q.copy_(self.q)
        o.s.copy_(self.s)
        o.g.copy_(self.g)
        o.shared = None if self.shared is None else self.shared.to(device)
        return o

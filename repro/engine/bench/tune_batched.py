"""The batched round's tiles by slot count, tuned on this card: the ``batched`` family of the tile files.

Called by ``python -m repro.engine.kernels.tune`` (families ``batched`` and ``batched-w4``; it needs this layer's
measuring tools, hence the module lives here). LLaDA2.1-mini in its real shapes with deterministic random weights
(:func:`~repro.engine.bench.graph_round._model`), every slot a block of 32 random tokens at prefix 1024
(:func:`~repro.engine.bench.graph_round._fill`).

Method. Each tuning *unit* is one GEMM or pair of GEMMs whose tiles are chosen together: ``qkv``, ``o``,
``lm_head``, ``moe`` (the routed+shared expert gate_up and down, sharing BLOCK_M so that both launch over one tile
table), ``dense`` (layer 0's FFN, likewise), ``router`` (router GEMM + route kernel: one setting for every S, since
its split-K fixes a row's summation order), ``attn`` (the batched path's attention tiles, entry ``attn`` merged over
the single-request ``attn`` file's: one setting for every S, since the key tile sets the order of a row's softmax
chunks; the single-request tuner times them for one slot only, and a 16-row tile that wins there re-reads each
slot's K/V four times as often at 32 slots) and, with packed 4-bit experts, ``w4`` (their gate_up / down). Set i
takes candidate i of every unit (cycling shorter lists), so one eager forward per set and slot count S times every
unit at once: the device time of each kernel family comes from a torch.profiler trace
(:func:`~repro.engine.bench.graph_round.kernel_breakdown`; 20 layers, so no weight is re-read from L2). Per unit:

* 16-bit GEMMs (``qkv``, ``o``, ``lm_head``, ``moe``, ``dense``): per S the fastest candidate (a new choice only
  when it beats the previous S's by more than :data:`HYSTERESIS`); the base tiles are the smallest S's, and every
  change becomes a ``by_slots`` step holding the whole tile (``TMA`` written out, 0 when off);
* ``w4``: ``by_slots`` may change only BLOCK_M (16 / 32) and stages (:data:`~repro.engine.kernels.fastpath_batch.
  SLOT_KEYS_W4`), so candidates are grouped by their other keys; the group with the least sum over S of its
  members' best times wins, then per S its fastest member;
* ``router``, ``attn``: the candidate with the least sum over S.

The per-unit choice is then checked as a whole round (:func:`round_check`): the batched graph round is timed at
every tuned S with the per-unit choice and with each tuned entry of another card of this compute capability (and
this card's previous entry), their missing keys filled from the per-unit choice (:func:`seed_entries`); the entry
with the least mean time relative to the best at each S is saved (:func:`pick_by_rounds`; another entry must beat the
per-unit choice by more than :data:`HYSTERESIS`). Kernel times summed per unit miss what the round sees between
kernels (on an H100 the H200's entry ran batch 32 at 13.77 ms where its own per-unit choice ran 14.97 ms,
docs/perf.md), so the round decides; the entry saved records every candidate's round times.

Row invariance is then checked, not assumed: with the saved file, slot 0's logits at every S must equal those at
the smallest S (:func:`verify`); if not, the steps are dropped (one setting for every S) and it is checked again.
"""
from __future__ import annotations

import json
import time

import torch

#: slot counts tuned (full / ``--quick``)
SLOTS = (1, 2, 4, 8, 16, 32)
QUICK_SLOTS = (1, 8, 32)
#: a later S takes a new tile only when it is faster than keeping the previous one by more than this fraction
HYSTERESIS = 0.02
PREFIX = 1024


def _t(bm, bn, bk, w, st, tma=0) -> dict:
    d = dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, num_warps=w, num_stages=st)
    if tma:
        d["TMA"] = tma
    return d


# candidates, the likeliest first (``--quick`` keeps the first QUICK of each unit); the H200's session-8 choices
# are among them (docs/perf_history.md "Session 8: tiles by slot count")
LINEAR = [_t(32, 32, 256, 4, 3), _t(64, 64, 64, 4, 4, 2), _t(32, 16, 256, 4, 3), _t(64, 128, 64, 4, 4, 1),
          _t(32, 32, 128, 4, 4), _t(128, 64, 64, 4, 4, 2), _t(64, 64, 64, 4, 4, 1), _t(64, 32, 128, 4, 4),
          _t(128, 128, 64, 8, 3, 2), _t(32, 64, 128, 4, 4)]
LM_HEAD = [_t(32, 256, 64, 8, 3, 2), _t(128, 256, 64, 8, 3, 2), _t(64, 256, 64, 8, 3, 2), _t(32, 64, 128, 4, 3),
           _t(128, 128, 64, 8, 4, 2), _t(64, 128, 64, 4, 4, 2), _t(128, 256, 64, 8, 4, 2), _t(32, 128, 64, 4, 4, 2),
           _t(256, 128, 64, 8, 3, 2)]
MOE = [(_t(16, 32, 128, 4, 4), _t(16, 64, 64, 2, 4)), (_t(64, 64, 64, 4, 4), _t(64, 128, 64, 4, 3, 1)),
       (_t(32, 64, 128, 4, 4), _t(32, 64, 128, 4, 4)), (_t(64, 64, 64, 4, 3), _t(64, 128, 64, 4, 3, 1)),
       (_t(16, 64, 128, 4, 4), _t(16, 64, 128, 4, 4)), (_t(16, 32, 256, 4, 3), _t(16, 32, 256, 4, 3)),
       (_t(32, 32, 256, 4, 3), _t(32, 64, 64, 4, 4)), (_t(64, 128, 64, 4, 4), _t(64, 64, 64, 4, 4)),
       (_t(16, 64, 64, 4, 4), _t(16, 128, 64, 4, 4)), (_t(64, 64, 64, 4, 4, 1), _t(64, 128, 64, 8, 3, 1))]
DENSE = [(_t(16, 64, 128, 4, 4), _t(16, 32, 256, 4, 3)), (_t(64, 128, 64, 4, 4, 1), _t(64, 64, 64, 4, 4, 1)),
         (_t(16, 32, 128, 4, 4), _t(16, 16, 256, 4, 3)), (_t(64, 64, 64, 4, 4, 1), _t(64, 64, 64, 4, 4, 1)),
         (_t(32, 64, 128, 4, 4), _t(32, 32, 256, 4, 3)), (_t(128, 128, 64, 8, 3, 1), _t(128, 64, 64, 4, 4, 1)),
         (_t(64, 128, 64, 4, 3), _t(64, 128, 64, 4, 3))]
ROUTER = [(dict(BLOCK_E=64, BLOCK_K=64, PREC="tf32x3", ROWS=64, SPLIT_K=8, num_warps=4, num_stages=2), 2),
          (dict(BLOCK_E=32, BLOCK_K=64, PREC="tf32x3", ROWS=32, SPLIT_K=8, num_warps=4, num_stages=2), 2),
          (dict(BLOCK_E=64, BLOCK_K=64, PREC="tf32x3", ROWS=64, SPLIT_K=16, num_warps=4, num_stages=2), 4),
          (dict(BLOCK_E=64, BLOCK_K=128, PREC="tf32x3", ROWS=64, SPLIT_K=4, num_warps=4, num_stages=2), 2),
          (dict(BLOCK_E=32, BLOCK_K=64, PREC="ieee", ROWS=32, SPLIT_K=16, num_warps=4, num_stages=2), 1)]
#: the batched path's attention tiles (merged over the single-request ``attn`` entry; one setting for every S: the
#: key tile BLOCK_N sets the order of a row's softmax chunks)
ATTN = [dict(BLOCK_M=64, BLOCK_N=64, num_warps=4, num_stages=3), dict(BLOCK_M=32, BLOCK_N=64, num_warps=4, num_stages=3),
        dict(BLOCK_M=16, BLOCK_N=32, num_warps=4, num_stages=2), dict(BLOCK_M=64, BLOCK_N=32, num_warps=4, num_stages=2),
        dict(BLOCK_M=32, BLOCK_N=32, num_warps=4, num_stages=2), dict(BLOCK_M=16, BLOCK_N=64, num_warps=4, num_stages=3)]
W4 = [(_t(bm, 64, 64, 4, st), _t(bm, 128, 64, 4, st)) for bm in (16, 32) for st in (3, 4)] + \
     [(_t(bm, 32, 64, 4, st), _t(bm, 64, 64, 4, st)) for bm in (16, 32) for st in (3, 4)] + \
     [(_t(bm, 64, 128, 4, 3), _t(bm, 128, 128, 4, 3)) for bm in (16, 32)] + \
     [(_t(bm, 64, 64, 8, 3), _t(bm, 128, 64, 8, 3)) for bm in (16, 32)]
QUICK = 4

#: unit -> (breakdown families whose times it owns, file entries it writes)
UNITS = {"qkv": (("qkv",), ("qkv",)), "o": (("o",), ("o",)), "lm_head": (("lm_head",), ("lm_head",)),
         "moe": (("gate_up", "down"), ("moe_gate_up", "moe_down")),
         "dense": (("dense_gate_up", "dense_down"), ("dense_gate_up", "dense_down")),
         "router": (("router/route",), ("moe_router", "moe_route")), "attn": (("attention",), ("attn",)),
         "w4": (("gate_up", "down"), ("moe_w4_gate_up", "moe_w4_down"))}


def candidates(precision: str, quick: bool) -> dict:
    """``{unit: [candidate, ...]}`` tuned at ``precision`` ("bf16": every 16-bit unit and the router;
    "nvfp4-w4a16": the 4-bit experts only, the rest as the bf16 pass chose)."""
    if precision == "bf16":
        c = {"qkv": LINEAR, "o": LINEAR, "lm_head": LM_HEAD, "moe": MOE, "dense": DENSE, "router": ROUTER,
             "attn": ATTN}
    else:
        c = {"w4": W4}
    if quick:  # 4-bit: the two likeliest groups, each at BLOCK_M 16 / 32, 3 stages
        c = {u: ([v for v in W4[:8] if v[0]["num_stages"] == 3] if u == "w4" else v[:QUICK]) for u, v in c.items()}
    return c


def set_configs(cands: dict, i: int) -> dict:
    """The ``BatchedBlockForward`` configs of set ``i``: candidate ``i % len`` of every unit."""
    pick = {u: v[i % len(v)] for u, v in cands.items()}
    cfg: dict = {}
    if "qkv" in pick:
        cfg["linear"] = {"qkv": pick["qkv"], "o": pick["o"], "lm_head": pick["lm_head"]}
        cfg["dense"] = {"gate_up": pick["dense"][0], "down": pick["dense"][1]}
        router, route_warps = pick["router"]
        cfg["moe"] = {"gate_up": pick["moe"][0], "down": pick["moe"][1], "router": router,
                      "route": {"num_warps": route_warps}}
        cfg["attn"] = dict(pick["attn"])
    if "w4" in pick:
        cfg["moe"] = {"gate_up": pick["w4"][0], "down": pick["w4"][1]}
    return cfg


def measure(cands: dict, slots, precision: str, seed: int = 0, log=print) -> list[dict]:
    """Per set (:func:`set_configs`): ``{S: {family: ms}}`` from one profiled eager forward at each S, or
    ``{"error": text}`` when the set does not build or run (e.g. out of shared memory)."""
    from ..kernels.fastpath_batch import BatchedBlockForward
    from .graph_round import _fill, _model, kernel_breakdown

    shape, W, _ = _model(None, precision, seed)
    n_sets = max(len(v) for v in cands.values())
    out = []
    for i in range(n_sets):
        cfg = set_configs(cands, i)
        t0 = time.perf_counter()
        try:
            per_s = {}
            for S in slots:
                fw = BatchedBlockForward(W, shape, PREFIX + 64, slots=S, T=32, device="cuda", configs=cfg)
                _fill(fw, S, PREFIX, seed, shape)
                fw.forward()
                per_s[S] = kernel_breakdown(fw)
                del fw
            out.append(per_s)
            log(f"set {i + 1}/{n_sets} ({precision}): {time.perf_counter() - t0:.1f} s; "
                + ", ".join(f"S={S} {b['total']:.2f} ms" for S, b in per_s.items()))
        except Exception as exc:  # noqa: BLE001 - one bad candidate must not end the tuning
            out.append({"error": f"{type(exc).__name__}: {str(exc)[:200]}"})
            log(f"set {i + 1}/{n_sets} ({precision}) failed: {out[-1]['error']}")
        torch.cuda.empty_cache()
    del W
    torch.cuda.empty_cache()
    return out


def unit_times(unit: str, cands: dict, sets: list[dict], slots) -> list[dict]:
    """``[{S: ms}]`` per candidate of ``unit``: the fastest of the sets that ran it (a candidate appears in every
    set ``i`` with ``i % len == its index``); a candidate no set ran gets no entry for that S."""
    fams, _ = UNITS[unit]
    n = len(cands[unit])
    times = [dict() for _ in range(n)]
    for i, per_s in enumerate(sets):
        if "error" in per_s:
            continue
        for S in slots:
            ms = sum(per_s[S][f] for f in fams)
            j = i % n
            times[j][S] = min(ms, times[j].get(S, float("inf")))
    return times


def _with_tma(tile: dict) -> dict:
    return {**tile, "TMA": tile.get("TMA", 0)}


def steps_entry(per_s: list[tuple[int, dict]], keys: tuple[str, ...] | None = None) -> dict:
    """One file entry from the tile chosen at each S (ascending): the first S's tiles as the base, every later
    change as a ``by_slots`` step holding ``keys`` of the new tile (default: every key, ``TMA`` written out)."""
    base = dict(per_s[0][1])
    steps, cur = {}, per_s[0][1]
    for S, tile in per_s[1:]:
        if tile != cur:
            new = _with_tma(tile) if keys is None else {k: tile[k] for k in keys if k in tile}
            steps[str(S)] = new
            cur = tile
    if steps:
        base["by_slots"] = steps
    return base


def choose_per_slot(times: list[dict], slots, allowed=None) -> list[tuple[int, int]]:
    """``[(S, candidate index)]``: per S the fastest of ``allowed`` (default every candidate), keeping the previous
    S's choice unless the new one is faster by more than :data:`HYSTERESIS`. Raises RuntimeError when no candidate
    ran at some S."""
    allowed = range(len(times)) if allowed is None else allowed
    out, prev = [], None
    for S in slots:
        ran = [(times[j][S], j) for j in allowed if S in times[j]]
        if not ran:
            raise RuntimeError(f"no candidate ran at S={S}")
        ms, j = min(ran)
        if prev is not None and S in times[prev] and times[prev][S] <= ms * (1 + HYSTERESIS):
            j = prev
        out.append((S, j))
        prev = j
    return out


def choose(unit: str, cands: list, times: list[dict], slots) -> dict:
    """``{file entry: tiles}`` for ``unit`` (module doc)."""
    from ..kernels.fastpath_batch import SLOT_KEYS_W4

    _, entries = UNITS[unit]
    if unit in ("router", "attn"):  # one setting for every S: the least sum over S
        ran = [(sum(t.values()), j) for j, t in enumerate(times) if len(t) == len(slots)]
        if not ran:
            raise RuntimeError(f"no {unit} candidate ran at every S")
        best = cands[min(ran)[1]]
        if unit == "attn":
            return {"attn": dict(best)}
        router, warps = best
        return {"moe_router": dict(router), "moe_route": {"num_warps": warps}}
    allowed = None
    if unit == "w4":  # one group of non-slot keys for every S: the least sum over S of its members' best
        def group(c):
            return tuple(tuple(sorted((k, v) for k, v in t.items() if k not in SLOT_KEYS_W4)) for t in c)
        groups: dict = {}
        for j, c in enumerate(cands):
            groups.setdefault(group(c), []).append(j)
        scored = []
        for members in groups.values():
            best = [min((times[j][S] for j in members if S in times[j]), default=None) for S in slots]
            if None not in best:
                scored.append((sum(best), members))
        if not scored:
            raise RuntimeError("no 4-bit tile group ran at every S")
        allowed = min(scored)[1]
    picks = choose_per_slot(times, slots, allowed)
    keys = SLOT_KEYS_W4 if unit == "w4" else None
    out = {}
    for side, name in enumerate(entries):
        per_s = [(S, cands[j][side] if isinstance(cands[j], tuple) else cands[j]) for S, j in picks]
        out[name] = steps_entry(per_s, keys)
    return out


#: the split-attention keys the batched ``attn`` unit sets (the rest, NSPLIT and MIN_KEYS, stay the ``attn`` file's)
ATTN_KEYS = ("BLOCK_M", "BLOCK_N", "num_warps", "num_stages")


def unit_keys(precision: str) -> tuple[str, ...]:
    """The batched file's entries tuned at ``precision`` (the units of :func:`candidates`, their ``UNITS`` entries)."""
    return tuple(name for unit in candidates(precision, quick=False) for name in UNITS[unit][1])


def seed_entries(tuned: dict, keys, batched_file: dict, attn_file: dict, card: str, others: list[str]) -> dict:
    """Candidate entries for :func:`round_check`: ``{label: {file key: tiles}}`` over ``keys``, ``"tuned"`` (the
    per-unit choice, ``tuned``) first, then ``"previous"`` (``card``'s entry in ``batched_file``, if any) and each
    card of ``others`` (names in ``batched_file``, nearest first). A key an entry lacks comes from ``tuned``, except
    ``attn``: a card whose batched entry has none ran its ``attn_file`` entry's split keys (:data:`ATTN_KEYS`), so
    those are used. An entry equal to an earlier one, or with none of ``keys``, is left out."""
    out = {"tuned": {k: tuned[k] for k in keys if k in tuned}}
    for label, name in [("previous", card)] + [(n, n) for n in others]:
        entry = batched_file.get(name)
        if not isinstance(entry, dict) or not any(k in entry for k in keys):
            continue
        cand = {k: entry.get(k, out["tuned"].get(k)) for k in keys if k in entry or k in out["tuned"]}
        split = (attn_file.get(name) or {}).get("split") or {}
        if "attn" in keys and "attn" not in entry and split:
            cand["attn"] = {k: split[k] for k in ATTN_KEYS if k in split}
        if cand not in out.values():
            out[label] = cand
    return out


def pick_by_rounds(times: dict) -> str:
    """The label of ``times`` (``{label: {S: round ms}}``, ``"tuned"`` among them) to save: the least mean over S of
    ms / the best ms at that S, over the S ``"tuned"`` ran (a label missing one of them is out); another label
    replaces ``"tuned"`` only when its mean is lower by more than :data:`HYSTERESIS`. Raises RuntimeError when ``"tuned"`` has no time."""
    if not times.get("tuned"):
        raise RuntimeError("round check: the per-unit choice did not run")
    common = set(times["tuned"])
    ran = {lab: t for lab, t in times.items() if t and common <= set(t)}
    best = {S: min(t[S] for t in ran.values()) for S in common}
    score = {lab: sum(t[S] / best[S] for S in common) / len(common) for lab, t in ran.items()}
    lab = min(score, key=lambda k: (score[k], k != "tuned"))
    return lab if score[lab] < score["tuned"] - HYSTERESIS else "tuned"


def round_check(tuned: dict, slots, precision: str, seed: int = 0, log=print, iters: int = 20) -> tuple[dict, dict]:
    """Time the batched graph round (:func:`~repro.engine.bench.graph_round.bench_slots`) at each S of ``slots`` with
    each entry of :func:`seed_entries` written as this card's, and return ``(entries to save, record)``: the
    :func:`pick_by_rounds` winner's tiles for :func:`unit_keys` of ``precision``, and ``{"chosen", "ms": {label:
    {S: ms}}, "entries": {label: tiles}}``. Leaves the file with the per-unit choice (the caller saves the winner)."""
    from ..kernels.configs import config_path, current_card, nearest_cards, save_config
    from .common import copy_bandwidth
    from .graph_round import _model, bench_slots

    key = dict(E=257, N=512, H=2048, T=32)
    card = current_card()
    path = config_path("batched", **key)
    data = json.loads(path.read_text()) if path.exists() else {}
    apath = config_path("attn", NQ=16, NKV=4, D=128, T=32)
    adata = json.loads(apath.read_text()) if apath.exists() else {}
    keys = unit_keys(precision)
    cands = seed_entries(tuned, keys, data, adata, card.name, nearest_cards(data, card))
    model, bw = _model(None, precision, seed), copy_bandwidth()
    ms: dict = {}
    try:
        for label, entry in cands.items():
            save_config("batched", entry, **key)
            try:
                doc = bench_slots(slots, PREFIX, iters, None, precision, seed, log=lambda *a: None, model=model,
                                  single=False, copy_bw=bw)
                ms[label] = {r["slots"]: r["ms"] for r in doc["rounds"]}
            except Exception as exc:  # noqa: BLE001 - a seed that does not run here is skipped
                ms[label] = {}
                log(f"round check {precision} {label}: failed ({type(exc).__name__}: {str(exc)[:120]})")
                continue
            log(f"round check {precision} {label}: " + ", ".join(f"S={S} {v:.3f} ms" for S, v in ms[label].items()))
            torch.cuda.empty_cache()
    finally:
        save_config("batched", cands["tuned"], **key)
        del model
        torch.cuda.empty_cache()
    chosen = pick_by_rounds(ms)
    log(f"round check {precision}: saving {chosen!r}" + ("" if chosen == "tuned" else " (faster round than the "
                                                          "per-unit choice)"))
    rec = {"chosen": chosen, "ms": {lab: {str(S): round(v, 4) for S, v in t.items()} for lab, t in ms.items()},
           "entries": cands}
    return dict(cands[chosen]), rec


def verify(slots, precision: str, seed: int = 0, log=print) -> bool:
    """Slot 0's logits at every S bit-identical to those at the smallest S, with the tiles the files give now."""
    from ..kernels.fastpath_batch import BatchedBlockForward
    from .graph_round import _fill, _model

    shape, W, _ = _model(None, precision, seed)
    ref, ok = None, True
    for S in slots:
        fw = BatchedBlockForward(W, shape, PREFIX + 64, slots=S, T=32, device="cuda")
        _fill(fw, S, PREFIX, seed, shape)
        fw.forward()
        lg = fw.logits[0].clone()
        ref = lg if ref is None else ref
        same = bool(torch.equal(lg, ref))
        ok = ok and same
        log(f"verify {precision} S={S}: slot 0 logits = S={slots[0]}'s: {same}")
        del fw
    del W
    torch.cuda.empty_cache()
    return ok


def tune_batched(quick: bool = False, precisions=("bf16", "nvfp4-w4a16"), seed: int = 0, save: bool = True,
                 log=print, check: bool = True) -> dict:
    """Tune, check as a round (``check``, with ``save``), save under this card's name in
    ``configs/batched_E=257_N=512_H=2048_T=32.json`` and verify (module doc). Returns ``{"entries", "times",
    "round_check", "verified", "seconds"}`` (``times``: per precision and unit, per candidate ``{S: ms}``;
    ``round_check``: per precision, :func:`round_check`'s record)."""
    from ..kernels.configs import save_config

    slots = QUICK_SLOTS if quick else SLOTS
    t0 = time.perf_counter()
    entries, times = {}, {}
    for prec in precisions:
        cands = candidates(prec, quick)
        sets = measure(cands, slots, prec, seed, log)
        times[prec] = {}
        for unit in cands:
            ut = unit_times(unit, cands, sets, slots)
            times[prec][unit] = [{"candidate": c, "ms": {str(S): round(v, 4) for S, v in t.items()}}
                                 for c, t in zip(cands[unit], ut)]
            entries.update(choose(unit, cands[unit], ut, slots))
    meta = {"source": f"python -m repro.engine.kernels.tune{' --quick' if quick else ''} (repro/engine/bench/"
                      f"tune_batched.py): per unit the fastest candidate at each S of {list(slots)}, prefix {PREFIX}"
                      + ("; then the round check of that choice against other cards' entries (round_check_*)"
                         if save and check else ""),
            "date": time.strftime("%Y-%m-%d")}
    verified, checked = {}, {}
    if save:
        key = dict(E=257, N=512, H=2048, T=32)
        save_config("batched", entries, extra=meta, **key)
        for prec in precisions if check else ():  # BF16 first: the 4-bit round runs the BF16 pass's other kernels
            win, checked[prec] = round_check({k: entries[k] for k in unit_keys(prec) if k in entries}, slots, prec,
                                             seed, log)
            entries.update(win)
            meta[f"round_check_{prec}"] = {"chosen": checked[prec]["chosen"], "ms": checked[prec]["ms"]}
            save_config("batched", entries, extra=meta, **key)
        for prec in precisions:
            verified[prec] = verify(slots, prec, seed, log)
        if not all(verified.values()):  # one setting for every S, then check again
            log("row invariance failed with the by_slots steps: saving one tile set for every S")
            entries = {k: {kk: vv for kk, vv in v.items() if kk != "by_slots"} for k, v in entries.items()}
            save_config("batched", entries, extra={**meta, "by_slots_dropped": True}, **key)
            verified = {prec: verify(slots, prec, seed, log) for prec in precisions}
            if not all(verified.values()):
                raise RuntimeError(f"batched tiles: slot 0 differs across S even with one tile set ({verified})")
    return {"entries": entries, "times": times, "round_check": checked, "verified": verified,
            "seconds": time.perf_counter() - t0}


def summary_table(times: dict, entries: dict) -> str:
    """Markdown: per precision and unit, each candidate's ms at each S (the chosen base marked)."""
    lines = []
    for prec, units in times.items():
        for unit, rows in units.items():
            lines.append(f"{prec} {unit}: " + "; ".join(
                json.dumps(r["candidate"], separators=(",", ":")) + " " + ",".join(f"{S}:{ms}" for S, ms in r["ms"].items())
                for r in rows))
    lines.append("chosen: " + json.dumps(entries, sort_keys=True))
    return "\n".join(lines)

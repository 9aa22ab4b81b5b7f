"""Cards users own: every kernel the engine launches builds for sm_80, sm_89, sm_90a, sm_100 and sm_120 (no GPU).

``test_every_launch_builds_for_every_card`` runs ``python -m repro.engine.aot`` (the engine's own launch sites driven
at LLaDA2.1-mini's shapes, recorded through Triton's binder, then compiled with ptxas for each card, on the tested
Triton of ``repro/stack.py`` that ``scripts/setup.sh`` installs beside the interpreter's) and checks that every
launch built, that the 4-bit decode each card got is the one it builds, and that no kernel of the package is left
out. It takes about 4 minutes on two cores (4 min 2 s measured), so it runs in the CI's later stage (``.ci/run``:
``ORL_EVAL_AOT=1``), not in the README's test command. The other tests check the pieces it rests on, without
compiling.
"""
import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]
KERNELS = REPO / "repro" / "engine" / "kernels"

def _kernels_in_package() -> set[str]:
    """Names of the module-level @triton.jit functions named ``*_kernel`` in repro/engine/kernels."""
    out = set()
    for path in KERNELS.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef) and node.name.endswith("_kernel") and any(
                    "jit" in ast.unparse(d) for d in node.decorator_list):
                out.add(node.name)
    return out


def _build_env():
    """The environment of the build: no interpreter; the tested Triton must be this one or installed beside it (the
    command then runs itself on it)."""
    from importlib.metadata import version

    from repro.engine.aot import tested_triton_dir
    from repro.stack import TESTED, release

    if release(version("triton")) != TESTED["triton"] and tested_triton_dir() is None:
        pytest.fail(f"the tested Triton {TESTED['triton']} is not installed beside this one ({version('triton')}): "
                    f"run bash scripts/setup.sh")
    return {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("ORL_EVAL_AOT") != "1",
                    reason="4 minutes on two cores: set ORL_EVAL_AOT=1 (the CI's later stage does)")
def test_every_launch_builds_for_every_card(tmp_path):
    from repro.stack import TESTED

    out = tmp_path / "aot.json"
    env = dict(_build_env(), TRITON_CACHE_DIR=str(tmp_path / "cache"))
    p = subprocess.run([sys.executable, "-m", "repro.engine.aot", "--json", str(out), "--jobs", "2"], cwd=REPO,
                       env=env, capture_output=True, text=True, timeout=1800)
    report = json.loads(out.read_text()) if out.exists() else None
    assert report is not None, p.stdout[-3000:] + p.stderr[-3000:]
    rows = report["launches"]
    failed = [f"{r['target']} {r['launch']}: {r['error']}" for r in rows if not r["ok"]]
    assert not failed and p.returncode == 0, "\n".join(failed[:20]) + p.stdout[-2000:] + p.stderr[-2000:]
    assert report["triton"].split("+")[0] == TESTED["triton"]
    targets = {"sm_80", "sm_89", "sm_90a", "sm_100", "sm_120"}
    assert {r["target"] for r in rows} == targets
    # every kernel of the package is launched, on every card (by the engine's paths or the variants its flags and
    # tile keys turn on): a new kernel without a launch site in repro/engine/aot_launches.py fails here
    launched = {t: {r["kernel"].rsplit(".", 1)[-1] for r in rows if r["target"] == t} for t in targets}
    every = _kernels_in_package()
    assert len(every) >= 20
    for t in targets:
        assert launched[t] == every, (t, every ^ launched[t])
    # the 4-bit decode each card got is the one it builds (moe_w4.DECODE_MIN_CC): the graph paths take 4 from sm_90
    # (3 for global scales outside decode 4's range), 3 on sm_89, 2 below; the eager seam's down GEMM takes 2
    # everywhere (its BLOCK_K 32 x BLOCK_N 64 tile gives a thread fewer than 16 packed bytes: moe_w4.pick_decode)
    def decodes(t, graph):
        return {r["constexprs"]["W4_DECODE"] for r in rows if r["target"] == t and r["constexprs"].get("W4")
                and any(not s.startswith("eager") for s in r["scenarios"]) == graph}

    assert {t: decodes(t, True) for t in targets} == {"sm_80": {2}, "sm_89": {3}, "sm_90a": {3, 4},
                                                      "sm_100": {3, 4}, "sm_120": {3, 4}}
    assert {t: decodes(t, False) for t in targets} == {"sm_80": {2}, "sm_89": {2, 3}, "sm_90a": {2, 4},
                                                       "sm_100": {2, 4}, "sm_120": {2, 4}}
    # the tuned entries of sm_90a cards were read (their tiles differ from the built-in defaults): TMA and the
    # batched path's 64-row tiles appear on sm_90a only
    tma = {t for t in targets for r in rows if r["target"] == t and r["constexprs"].get("TMA") not in (None, 0, False)}
    assert tma == {"sm_90a"}


# ---- the pieces, without compiling ------------------------------------------------------------------------


@pytest.fixture
def card(monkeypatch):
    """Set the compute capability the host code sees (as the recording does) for the test's tensors."""
    from repro.engine.kernels import _triton

    def set_cc(cc):
        monkeypatch.setattr(_triton, "_RECORDING", [cc])

    return set_cc


def test_decode_follows_the_card(card):
    from repro.engine.kernels.moe_w4 import pick_decode

    act = torch.zeros(4, 8, dtype=torch.bfloat16)
    tile = (64, 128, 4)
    picks = {}
    for cc in ((8, 0), (8, 6), (8, 9), (9, 0), (10, 0), (12, 0)):
        card(cc)
        picks[cc] = (pick_decode("lut", act, tile=tile), pick_decode("lut", act, tile=tile, derived_ok=False))
    assert picks == {(8, 0): (2, 2), (8, 6): (2, 2), (8, 9): (3, 3), (9, 0): (4, 3), (10, 0): (4, 3), (12, 0): (4, 3)}
    card((8, 9))
    with pytest.raises(ValueError, match=r"W4_DECODE 4 needs compute capability 9.0 \(mul.rn.bf16x2\); this card is "
                                         r"8.9: use 2 or 3"):
        pick_decode("lut", act, 4, tile=tile)
    card((8, 0))
    with pytest.raises(ValueError, match=r"W4_DECODE 3 needs compute capability 8.9 .* this card is 8.0: use 2,"):
        pick_decode("lut", act, 3, tile=tile)
    with pytest.raises(ValueError, match=r"layout 'hop' need compute capability 8.9 .* use layout 'lut'"):
        pick_decode("hop", act, tile=tile)
    assert pick_decode("modelopt", act, tile=tile) == 1


def test_interpreter_decodes_unchanged():
    """Off the GPU (no card recorded) the choice is the interpreter's, as before: the pure-Triton twins."""
    from repro.engine.kernels.moe_w4 import pick_decode

    act = torch.zeros(4, 8, dtype=torch.bfloat16)
    assert (pick_decode("lut", act), pick_decode("hop", act), pick_decode("modelopt", act)) == (2, 6, 1)


def test_recorded_weights_have_the_engine_layout():
    """aot_launches.weights (allocated, never filled) has fastpath.random_weights' names, shapes and dtypes, and
    packed experts the layout graph.kernel_weights attaches (NVFP4Experts with the shared expert)."""
    from repro.checkpoint.nvfp4 import NVFP4Experts
    from repro.engine import aot_launches as L
    from repro.engine.kernels.fastpath import preset_shape, random_weights

    shape = preset_shape(vocab_size=512, hidden_size=256, num_hidden_layers=3, num_experts=16,
                         moe_intermediate_size=64, intermediate_size=320, head_dim=64, num_attention_heads=4,
                         num_key_value_heads=2, n_group=4, topk_group=2, rotary_dim=32)

    def layout(W):
        return {k: (tuple(v.shape), v.dtype) if isinstance(v, torch.Tensor) else
                [{n: (tuple(t.shape), t.dtype) for n, t in L_.items() if t is not None} for L_ in v]
                for k, v in W.items()}

    want = random_weights(shape, "cpu", torch.bfloat16)
    assert layout(L.weights(shape, torch.bfloat16)) == layout(want)
    w4 = L.weights(shape, torch.bfloat16, "nvfp4-w4a16", g=2.0)
    moe = w4["layers"][-1]
    assert isinstance(moe["w13"], NVFP4Experts) and moe["w13"].shape == (16, 128, 256) and moe["w13"].layout == "lut"
    assert moe["w13"].shared.shape == (128, 256) and moe["w2"].shared.shape == (256, 64)
    assert float(moe["w13"].g.min()) == float(moe["w2"].g.max()) == 2.0


def test_slot_counts_cover_every_step():
    """The batched scenarios' slot counts include every 'by_slots' step of the tile files and the attention's
    switch to whole mode, so no tile set of the files goes unbuilt."""
    from repro.engine import aot_launches as L
    from repro.engine.kernels import attention_slots
    from repro.engine.kernels.configs import CONFIG_DIR

    steps = set()
    for path in CONFIG_DIR.glob("batched_*.json"):
        for entry in json.loads(path.read_text()).values():
            for name, kern in entry.items():
                if not name.startswith("_") and isinstance(kern, dict):
                    steps.update(int(s) for s in kern.get("by_slots", {}))
    counts = L.slot_counts()
    assert steps and steps <= set(counts) and {1, 32, attention_slots.WHOLE_MIN_SLOTS} <= set(counts)


def test_size_constexprs_never_shape_a_tile():
    """The build classes (repro.engine.aot.classes) merge launches that differ only in SIZE_CONSTEXPRS: sound while
    those names only enter index arithmetic — never a block shape, an unrolled loop or a reshape in any kernel."""
    from repro.engine.aot import SIZE_CONSTEXPRS

    shaping = {"arange", "zeros", "full", "static_range", "reshape", "broadcast_to", "view", "expand_dims"}
    found = []
    for path in KERNELS.glob("*.py"):
        for fn in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(fn, ast.FunctionDef) and any("jit" in ast.unparse(d) for d in fn.decorator_list)):
                continue
            for call in ast.walk(fn):
                name = getattr(getattr(call, "func", None), "attr", None) or getattr(getattr(call, "func", None),
                                                                                     "id", None)
                if isinstance(call, ast.Call) and name in shaping:
                    used = {n.id for a in call.args + [k.value for k in call.keywords] for n in ast.walk(a)
                            if isinstance(n, ast.Name)}
                    found += [f"{path.name}:{call.lineno} {fn.name}: {ast.unparse(call)[:80]}"
                              for _ in used & set(SIZE_CONSTEXPRS)]
    assert not found, found

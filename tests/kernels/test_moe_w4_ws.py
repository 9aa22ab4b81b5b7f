"""The warp-specialised Gluon gate+up GEMM (repro/engine/kernels/moe_w4_ws.py): its torch reference against the
Triton hop-layout kernels (CPU, interpreter), its ahead-of-time build for sm_90a on the tested Triton 3.6 (CPU, a
subprocess), and on a Hopper GPU its output against the Triton decode-5 kernel's at the real shapes."""
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("triton")

from repro.checkpoint import nvfp4 as Q  # noqa: E402
from repro.engine.kernels import moe as M  # noqa: E402
from repro.engine.kernels import moe_w4 as W4  # noqa: E402
from repro.engine.kernels.moe_w4_hop import hop_decode_reference, hop_shift  # noqa: E402
from repro.engine.kernels.moe_w4_ws import down_ws_reference, gate_up_ws_reference  # noqa: E402

from .conftest import rel_err  # noqa: E402
from .test_moe_w4 import CFG, _experts  # noqa: E402

REPO = Path(__file__).resolve().parents[2]


def _hop_case(T, shared, dtype, dev, seed, H=128, N=64, E=16, k=4):
    """A small routed case: ``(x, w13, w2, ws, ids, wts, ids_r, wts_r)``, experts in layout "hop", random distinct
    expert ids [T, k] with random weights aligned into ``ws``; ``ids_r`` / ``wts_r`` the same with, when ``shared``,
    the shared expert E appended as a last column of weight 1 (the pairs T·k + t of the workspace)."""
    x, _, _, w13, w2 = _experts(T, H, N, E, shared, dtype, dev, seed)
    g = torch.Generator().manual_seed(seed)
    ids = torch.stack([torch.randperm(E, generator=g)[:k] for _ in range(T)]).to(dev)
    wts = torch.rand(T, k, generator=g).to(dev)
    ws = M.MoEWorkspace(T, H, N, E, E + int(shared), k, dtype, dev, split_k=1, pair_dtype=torch.float32)
    M.moe_align(ids, wts, ws)
    ids_r = torch.cat([ids, torch.full((T, 1), E, device=dev)], 1) if shared else ids
    wts_r = torch.cat([wts, torch.ones(T, 1, device=dev)], 1) if shared else wts
    return x, w13.with_layout("hop"), w2.with_layout("hop"), ws, ids_r, wts_r


def _workspace_inter(ws, T, k, shared):
    """ws.inter as [T, k(+1), N]: routed pairs t·k + j, then the shared expert's T·k + t."""
    r = ws.inter[: T * k].view(T, k, -1)
    return torch.cat([r, ws.inter[T * k:][:, None]], 1) if shared else r


def test_reference_weights_are_dequantize_exactly():
    """The reference's MMA operand times its accumulator scale is dequantize-at-load in fp32, bit for bit:
    w' = e2m1 · e4m3 · 2^-8 exact in bf16, then one fp32 rounding of w' · (g · 2^8) = fl32(e2m1 · e4m3 · g)."""
    g = torch.Generator().manual_seed(3)
    w = W4.random_nvfp4_experts(2, 64, 128, 2, torch.bfloat16, "cpu", g)
    h = w.with_layout("hop")
    wp = hop_decode_reference(h.q, h.s, torch.bfloat16).float()  # [E, 2N, H]
    gs = h.g.repeat_interleave(32, dim=1)[:, :, None] * 2.0 ** hop_shift(torch.bfloat16)
    want = torch.stack([Q.dequantize(Q.from_hop_layout(h.q[e]), h.s[e].view(torch.float8_e4m3fn), torch.tensor(1.0)) for e in range(2)])
    want = want * h.g.repeat_interleave(32, dim=1)[:, :, None]
    assert torch.equal(wp * gs, want)


@pytest.mark.parametrize("swap", [False, True])
@pytest.mark.parametrize("dtype,T,shared,seed", [(torch.float32, 8, True, 0), (torch.float32, 5, False, 1),
                                                 (torch.float16, 6, True, 2)])
def test_reference_matches_triton_hop_gate_up(dev, dtype, T, shared, seed, swap):
    """gate_up_ws_reference against the Triton hop-layout gate+up kernel (decode 6 under the interpreter, 5 on the
    GPU; swapped operands and not) on small shapes: fp32 to 1e-6 (only the fp32 summation order differs), fp16 /
    bf16 to the rounding of inter."""
    if dev == "cuda":
        dtype = torch.bfloat16
    k = 4
    x, w13, _, ws, ids_r, wts_r = _hop_case(T, shared, dtype, dev, seed, k=k)
    decode = 5 if dev == "cuda" else 6
    cfg = {**CFG, "gate_up": dict(BLOCK_M=16, BLOCK_N=32, BLOCK_K=64, num_warps=4, num_stages=2, W4_DECODE=decode,
                                  W4_SWAP=swap)}
    M.moe_gate_up(x, w13, ws, k, cfg)
    got = _workspace_inter(ws, T, k, shared)
    ref = gate_up_ws_reference(x, w13, ids_r, wts_r)
    assert ref.dtype == dtype and ref.shape == got.shape
    assert rel_err(got, ref) < (1e-6 if dtype == torch.float32 else 4e-3)


@pytest.mark.parametrize("swap", [False, True])
@pytest.mark.parametrize("dtype,T,shared,seed", [(torch.float32, 8, True, 0), (torch.float16, 5, False, 1)])
def test_down_reference_matches_triton_hop_down(dev, dtype, T, shared, seed, swap):
    """down_ws_reference against the Triton hop-layout down kernel (decode 6 / 5) on small shapes: fp32 to 1e-6,
    fp16 / bf16 to 1e-3 (fp32 outputs; only the summation order differs)."""
    if dev == "cuda":
        dtype = torch.bfloat16
    H, k = 128, 4
    _, _, w2, ws, ids_r, _ = _hop_case(T, shared, dtype, dev, seed, H=H, k=k)
    g = torch.Generator().manual_seed(seed)
    ws.inter.copy_(torch.randn(ws.inter.shape, generator=g).to(dtype))
    decode = 5 if dev == "cuda" else 6
    cfg = {**CFG, "down": dict(BLOCK_M=16, BLOCK_N=64, BLOCK_K=64, num_warps=4, num_stages=2, W4_DECODE=decode,
                               W4_SWAP=swap)}
    M.moe_down(w2, ws, cfg)
    inter = _workspace_inter(ws, T, k, shared)
    got = ws.pair_out[: T * k].view(T, k, H)
    if shared:
        got = torch.cat([got, ws.pair_out[T * k:][:, None]], 1)
    ref = down_ws_reference(inter, w2, ids_r)
    assert rel_err(got, ref) < (1e-6 if dtype == torch.float32 else 1e-3)


def _tested_triton_path():
    """PYTHONPATH entry of the tested Triton (repro/stack.py) when this environment's own is another release, ""
    when it is the tested one; None when the tested Triton is absent."""
    from importlib.metadata import version

    from repro.engine.aot import tested_triton_dir
    from repro.stack import TESTED, release

    if release(version("triton")) == TESTED["triton"]:
        return ""
    return tested_triton_dir()


def run_on_tested_triton(code: str) -> dict:
    """Run ``code`` (which prints one JSON document last) in a subprocess on the tested Triton 3.6, without the
    interpreter; its document. Skips when the tested Triton is not installed."""
    import json

    path = _tested_triton_path()
    if path is None:
        pytest.skip("the tested Triton 3.6 is not installed beside this one (bash scripts/setup.sh installs it)")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([p for p in (path, str(REPO)) if p])
    p = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


_AOT = """
from repro.engine.kernels.moe_w4_ws import HAS_GLUON, aot_build
import json, sys, triton
assert HAS_GLUON, "no Gluon 3.6 API"
out = {}
for kernel, tiles in (("gate_up", False), ("gate_up", True), ("down", False), ("down", True)):
    k = aot_build(kernel, (9, 0), dict(TILES=tiles, SH_IN=tiles))
    ptx, ttgir = k.asm["ptx"], k.asm["ttgir"]
    out[f"{kernel} tiles={tiles}"] = dict(cubin=len(k.asm["cubin"]), shared=int(k.metadata.shared), triton=triton.__version__,
                           target=".target sm_90a" in ptx,
                           wgmma=ptx.count("wgmma.mma_async"), setmaxnreg=ptx.count("setmaxnreg"),
                           cp_async_mbar=ptx.count("cp.async.mbarrier.arrive.noinc"),
                           bf16x2=ptx.count("mul.rn.bf16x2"), ws=ttgir.count("ttg.warp_specialize"),
                           partitions=ttgir.count("partition0("))
print(json.dumps(out))
"""


def test_gluon_kernels_build_for_sm90a():
    """The Gluon kernels (gate+up, down) compile for sm_90a on the tested Triton (3.6) without a GPU, at the real
    shapes, plain grid and the tile table with the shared expert in the launch (SH_IN): a cubin, wgmma with the register operand, the warp-specialised region with its loader
    partition and register reallocation, the cp.async ring's mbarrier arrivals, the decode-5 bf16x2 multiplies."""
    built = run_on_tested_triton(_AOT)
    assert len(built) == 4, built
    for tiles, r in built.items():
        assert r["triton"].startswith("3.6"), r
        assert r["cubin"] > 0 and r["target"], (tiles, r)
        assert r["wgmma"] > 0 and r["ws"] == 1 and r["partitions"] == 1 and r["setmaxnreg"] > 0, (tiles, r)
        assert r["cp_async_mbar"] > 0 and r["bf16x2"] > 0, (tiles, r)
        assert r["shared"] <= 227 * 1024, r


@pytest.mark.gpu
@pytest.mark.parametrize("sh_in", [False, True])
@pytest.mark.parametrize("slots", [1, 32])
def test_gluon_gate_up_matches_triton_decode5(slots, sh_in):
    """On sm_90: the Gluon kernel's inter equals the Triton decode-5 swap-AB kernel's (same tiles BLOCK_N 64 /
    BLOCK_K 64, same K order, wgmma on both) bit for bit, and the default (non-swap) decode-5 kernel's within the
    bf16 rounding of inter (it sums even / odd inputs in separate MMAs: another fp32 order). With SH_IN the shared
    expert's rows (bf16 weights, other MMA shapes than the Triton kernel's) agree within the bf16 rounding of inter."""
    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("needs sm_90 (Hopper)")
    from repro.engine.kernels.moe_w4_ws import HAS_GLUON, moe_gate_up_ws, real_gate_up_case

    if not HAS_GLUON:
        pytest.skip("no Triton 3.6 Gluon")
    x, w13, ws, k = real_gate_up_case(slots)
    ws.inter.fill_(float("nan"))
    moe_gate_up_ws(x, w13, ws, k, dict(SH_IN=sh_in))
    got = ws.inter.clone()
    assert not torch.isnan(got).any()
    tiles = dict(BLOCK_M=16, BLOCK_N=64, BLOCK_K=64, num_warps=4, num_stages=3, W4_DECODE=5)
    ws.inter.fill_(float("nan"))
    M.moe_gate_up(x, w13, ws, k, {"gate_up": dict(tiles, W4_SWAP=True)})
    swap = ws.inter.clone()
    ws.inter.fill_(float("nan"))
    M.moe_gate_up(x, w13, ws, k, {"gate_up": tiles})
    plain = ws.inter.clone()
    assert rel_err(got, plain) < 4e-3
    r = ws.T * k  # routed pairs first, then the shared expert's T
    diff = (got[:r].float() - swap[:r].float()).abs().max().item()
    assert torch.equal(got[:r], swap[:r]), f"max |Gluon - Triton swap-AB| = {diff}"
    if sh_in:
        assert rel_err(got[r:], swap[r:]) < 4e-3
    else:
        assert torch.equal(got[r:], swap[r:])


@pytest.mark.gpu
@pytest.mark.parametrize("sh_in", [False, True])
@pytest.mark.parametrize("slots", [1, 32])
def test_gluon_down_matches_triton_decode5(slots, sh_in):
    """On sm_90: the Gluon down kernel's pair_out equals the Triton decode-5 swap-AB kernel's (BLOCK_N 128, BLOCK_K
    64, same K order) bit for bit, and the default decode-5 kernel's to fp32 summation order."""
    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("needs sm_90 (Hopper)")
    from repro.engine.kernels.moe_w4 import random_nvfp4_experts
    from repro.engine.kernels.moe_w4_ws import HAS_GLUON, moe_down_ws, real_gate_up_case

    if not HAS_GLUON:
        pytest.skip("no Triton 3.6 Gluon")
    x, w13, ws, k = real_gate_up_case(slots, pair_dtype=torch.float32)  # the fp32 sums: the arithmetic compared
    g = torch.Generator(device="cuda").manual_seed(7)
    w2 = random_nvfp4_experts(256, 2048, 512, 1, torch.bfloat16, "cuda", g).with_layout("hop")
    w2 = w2.with_shared((torch.randn(2048, 512, device="cuda", generator=g) * 0.02).to(torch.bfloat16))
    ws.inter.copy_((torch.randn(ws.inter.shape, device="cuda", generator=g)).to(torch.bfloat16))
    ws.pair_out.fill_(float("nan"))
    moe_down_ws(w2, ws, dict(SH_IN=sh_in))
    got = ws.pair_out.clone()
    assert not torch.isnan(got).any()
    tiles = dict(BLOCK_M=16, BLOCK_N=128, BLOCK_K=64, num_warps=4, num_stages=3, W4_DECODE=5)
    M.moe_down(w2, ws, {"down": dict(tiles, W4_SWAP=True)})
    swap = ws.pair_out.clone()
    M.moe_down(w2, ws, {"down": tiles})
    assert rel_err(got, ws.pair_out) < 1e-5
    r = ws.T * k
    assert torch.equal(got[:r], swap[:r]), f"max |Gluon - Triton swap-AB| = {(got[:r] - swap[:r]).abs().max().item()}"
    if sh_in:
        assert rel_err(got[r:], swap[r:]) < 1e-5
    else:
        assert torch.equal(got[r:], swap[r:])
    ws.pair_out = torch.full(got.shape, float("nan"), dtype=torch.bfloat16, device="cuda")  # the engine's pair rows
    moe_down_ws(w2, ws, dict(SH_IN=sh_in))
    assert torch.equal(ws.pair_out, got.to(torch.bfloat16)), "bf16 pair rows are not the fp32 sums rounded once"


def test_moe_experts_dispatches_ws_tiles_and_refuses_what_it_cannot_run():
    """``moe_experts`` with ``IMPL: "ws"`` tiles goes to the Gluon kernels: on this CPU that is their one-line
    refusal (no Hopper GPU), not a silent Triton run; a norm_w or an unknown IMPL is refused by name."""
    from repro.engine.kernels.moe_w4_ws import WS_TILES_DEFAULT

    dev = "cuda" if torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 9 else "cpu"
    if dev == "cuda":
        pytest.skip("a Hopper GPU runs the Gluon kernels: test_gluon_*_matches_triton_decode5 covers it")
    T, H, N, E, k = 4, 64, 32, 8, 2
    g = torch.Generator().manual_seed(0)
    w13 = W4.random_nvfp4_experts(E, 2 * N, H, 2, torch.bfloat16, "cpu", g).with_layout("hop")
    w2 = W4.random_nvfp4_experts(E, H, N, 1, torch.bfloat16, "cpu", g).with_layout("hop")
    x = torch.randn(T, H, generator=g).to(torch.bfloat16)
    ws = M.MoEWorkspace(T, H, N, E, E, k, torch.bfloat16, "cpu", split_k=1)
    ws_tiles = {k_: dict(v, IMPL="ws") for k_, v in WS_TILES_DEFAULT.items()}
    with pytest.raises(RuntimeError, match="moe_gate_up_ws: needs (triton.experimental.gluon|a Hopper GPU)"):
        M.moe_experts(x, w13, w2, ws, k, ws_tiles)
    with pytest.raises(ValueError, match="norm_w must be None"):
        M.moe_experts(x, w13, w2, ws, k, ws_tiles, norm_w=torch.ones(H, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="IMPL = 'cutlass'"):
        M.moe_experts(x, w13, w2, ws, k, {"down": {"IMPL": "cutlass"}})

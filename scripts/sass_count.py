"""Count the SASS instructions per weight of the MoE expert GEMMs, compiled offline for an H100/H200 (sm_90a).

No GPU needed: Triton compiles the grouped expert GEMMs of ``repro/engine/kernels/moe_gemm.py`` for
``GPUTarget("cuda", 90, 128)`` with the real shapes (H=2048, N=512) and the launch's divisibility hints,
``cuobjdump`` (shipped in Triton's ``backends/nvidia/bin``) disassembles the cubin, and the script finds the K
loop (the backward branch with the longest body, i.e. the main loop of the routed-expert path) and reports per
variant:

* loop instructions per warp, and thread instructions per weight = loop × num_warps × 32 / weights per
  iteration (the figure Nsight's "executed instructions" gives per weight; docs/perf_history.md, session 3:
  ≈ 15.6 for the gate+up kernel with decode 1);
* the split by kind: integer ALU (LOP3, PRMT, SHF, IADD3, ...), fp32 (FMUL, FFMA, ...), conversions (F2F,
  F2FP, I2F), MMA (HMMA), shared memory (LDS/STS/LDSM), global loads (LDG with their widths), local memory
  (LDL/STL: spills), barriers;
* registers and spills from the compiler's report.

Predicted time per weight: max(int ops / 16.7 T/s, fp ops / 33 T/s, issue slots / 33 T/s) vs the memory floor
(0.5625 B / 4.8 TB/s ≈ 0.12 ns; H200: 132 SMs × 4 schedulers × 1.98 GHz, int32 at half the fp32 rate).

Usage (any Python with triton 3.6 and torch importable; e.g. a venv with ``pip install triton==3.6.0``, torch
from another environment appended with ``--torch-site``)::

    python scripts/sass_count.py [--torch-site DIR] [--dump DIR] [--only NAME] [--set single|batched]
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

INT_OPS = {"LOP3", "PRMT", "SHF", "IADD3", "IMAD", "LEA", "SEL", "ISETP", "IMNMX", "SGXT", "BMSK", "LOP", "MOV",
           "IADD", "SHL", "SHR", "BFE", "BFI", "FLO", "POPC", "VIADD", "IABS", "I2IP", "PLOP3"}
FP_OPS = {"FMUL", "FFMA", "FADD", "FSEL", "FSETP", "FMNMX", "HFMA2", "HMUL2", "HADD2", "FCHK", "MUFU"}
CVT_OPS = {"F2F", "F2FP", "I2F", "F2I", "I2FP"}

#: variants: (name, kernel, tiles, W4, decode)
TILES = dict(BLOCK_M=16, BLOCK_N=64, BLOCK_K=128, num_warps=4, num_stages=4)  # session 3's 4-bit tiles


def _variants():
    from repro.engine.kernels.moe_w4 import W4_TILES_DEFAULT as D

    return [("bf16 gate+up", "gate_up", TILES, False, 1),
            ("w4 dec1 gate+up", "gate_up", D["gate_up"], True, 1),
            ("w4 dec2 gate+up", "gate_up", D["gate_up"], True, 2),
            ("w4 dec3 gate+up", "gate_up", D["gate_up"], True, 3),
            ("w4 dec4 gate+up", "gate_up", D["gate_up"], True, 4),
            ("bf16 down", "down", TILES, False, 1),
            ("w4 dec1 down", "down", D["down"], True, 1),
            ("w4 dec3 down", "down", D["down"], True, 3),
            ("w4 dec4 down", "down", D["down"], True, 4),
            ("w4 dec3 down n64", "down", dict(D["down"], BLOCK_N=64), True, 3),
            ("w4 dec3 gate+up k128", "gate_up", dict(D["gate_up"], BLOCK_K=128), True, 3),
            ("w4 dec3 down k128", "down", dict(D["down"], BLOCK_K=128), True, 3),
            ("w4 dec4 gate+up k128", "gate_up", dict(D["gate_up"], BLOCK_K=128), True, 4),
            ("w4 dec4 down k128", "down", dict(D["down"], BLOCK_K=128), True, 4),
            ("w4 dec3 gate+up s4", "gate_up", dict(D["gate_up"], num_stages=4), True, 3),
            ("w4 dec3 down s4", "down", dict(D["down"], num_stages=4), True, 3),
            ("w4 dec5 gate+up", "gate_up", D["gate_up"], True, 5),
            ("w4 dec5 down", "down", D["down"], True, 5),
            ("w4 dec5 swap gate+up", "gate_up", dict(D["gate_up"], W4_SWAP=True), True, 5),
            ("w4 dec5 swap down", "down", dict(D["down"], W4_SWAP=True), True, 5)]


def _batched_variants():
    """The batched round's 4-bit candidates (docs/perf_history.md, "Session 5: the 4-bit experts in the batched round"):
    decode 4 at BLOCK_M 32 / 64 (``--set batched``), beside today's BLOCK_M 16 defaults."""
    from repro.engine.kernels.moe_w4 import W4_TILES_DEFAULT as D

    gu, dn = D["gate_up"], D["down"]
    out = [("w4 gate+up m16 (default)", "gate_up", gu, True, 4), ("w4 down m16 (default)", "down", dn, True, 4)]
    for name, kern, base, extra in (
            ("gate+up m32", "gate_up", gu, dict(BLOCK_M=32)), ("gate+up m64", "gate_up", gu, dict(BLOCK_M=64)),
            ("gate+up m64 w8", "gate_up", gu, dict(BLOCK_M=64, num_warps=8)),
            ("gate+up m64 k128", "gate_up", gu, dict(BLOCK_M=64, BLOCK_K=128)),
            ("gate+up m64 s4", "gate_up", gu, dict(BLOCK_M=64, num_stages=4)),
            ("down m32", "down", dn, dict(BLOCK_M=32)), ("down m64", "down", dn, dict(BLOCK_M=64)),
            ("down m64 w8", "down", dn, dict(BLOCK_M=64, num_warps=8)),
            ("down m64 n64", "down", dn, dict(BLOCK_M=64, BLOCK_N=64))):
        out.append(("w4 " + name, kern, dict(base, **extra), True, 4))
    return out


def _compile(kernel, tiles, w4, decode, H=2048, N=512, E=256):
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from repro.engine.kernels import moe_gemm as M

    bm, bn, bk = tiles["BLOCK_M"], tiles["BLOCK_N"], tiles["BLOCK_K"]
    div = [["tt.divisibility", 16]]
    if kernel == "gate_up":
        fn = M._moe_gate_up_kernel
        sig = {"x_ptr": "*bf16", "w13_ptr": "*bf16", "counts_ptr": "*i32", "pairs_ptr": "*i32",
               "pairw_ptr": "*fp32", "inter_ptr": "*bf16", "nw_ptr": "*bf16", "eps": "fp32", "T": "i32",
               "stride_xt": "i32", "active_ptr": "*i32", "q_ptr": "*u8", "s_ptr": "*u8", "g_ptr": "*fp32"}
        const = dict(H=H, N=N, TOPK=8, MAXC=32, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, NORM=False, ACTIVE=True,
                     NACT_IDX=E + 1, SH=1, E_SH=E, USE_PDL=False, W4=w4, W4_DECODE=decode,
                     W4_SWAP=bool(tiles.get("W4_SWAP")))
        weights = 2 * bn * bk
    else:
        fn = M._moe_down_kernel
        sig = {"inter_ptr": "*bf16", "w2_ptr": "*bf16", "counts_ptr": "*i32", "pairs_ptr": "*i32",
               "out_ptr": "*fp32", "active_ptr": "*i32", "q_ptr": "*u8", "s_ptr": "*u8", "g_ptr": "*fp32"}
        const = dict(H=H, N=N, MAXC=32, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, ACTIVE=True, NACT_IDX=E + 1, SH=1,
                     E_SH=E, USE_PDL=False, W4=w4, W4_DECODE=decode,
                     W4_SWAP=bool(tiles.get("W4_SWAP")))
        weights = bn * bk
    names = fn.arg_names
    full = {n: sig.get(n, "constexpr") for n in names}
    attrs = {(names.index(n),): div for n, t in sig.items() if t.startswith("*") or n == "stride_xt"}
    src = ASTSource(fn, full, constexprs={n: v for n, v in const.items()}, attrs=attrs)
    k = triton.compile(src, target=GPUTarget("cuda", 90, 128),
                       options=dict(num_warps=tiles["num_warps"], num_stages=tiles["num_stages"]))
    return k, weights


def _sass(cubin: bytes) -> tuple[list[tuple[int, str]], dict]:
    """(address, instruction) pairs of the cubin's SASS, and its resource usage (REG, STACK, SHARED, LOCAL)."""
    import triton

    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(cubin)
    try:
        txt = subprocess.run([str(tool), "-sass", f.name], capture_output=True, text=True, check=True).stdout
        res = subprocess.run([str(tool), "-res-usage", f.name], capture_output=True, text=True, check=True).stdout
    finally:
        os.unlink(f.name)
    usage = {k: int(v) for k, v in re.findall(r"\b(REG|STACK|SHARED|LOCAL):(\d+)", res)}
    out = []
    for line in txt.splitlines():
        m = re.match(r"\s*/\*([0-9a-f]{4,})\*/\s+(.*?);", line)
        if m:
            out.append((int(m.group(1), 16), m.group(2).strip()))
    return out, usage


def _opcode(ins: str) -> str:
    ins = re.sub(r"^@!?U?P\w+\s+", "", ins)
    return ins.split()[0] if ins else ""


def _loop(sass):
    """Instructions of the longest loop body: [target, branch] of the backward BRA with the largest span."""
    best = None
    for addr, ins in sass:
        m = re.search(r"\bBRA\b.*?`?\(\.L_x_\d+\)|\bBRA\b\s+(0x[0-9a-f]+)", ins)
        t = re.search(r"0x([0-9a-f]+)", ins) if "BRA" in _opcode(ins) else None
        if t is None:
            continue
        tgt = int(t.group(1), 16)
        if tgt < addr and (best is None or addr - tgt > best[1] - best[0]):
            best = (tgt, addr)
    if best is None:
        return []
    return [ins for a, ins in sass if best[0] <= a <= best[1]]


def count(name, kernel, tiles, w4, decode, dump=None):
    k, weights = _compile(kernel, tiles, w4, decode)
    sass, usage = _sass(k.asm["cubin"])
    if dump:
        Path(dump).mkdir(parents=True, exist_ok=True)
        stem = re.sub(r"\W+", "_", name)
        (Path(dump) / f"{stem}.sass").write_text("\n".join(f"{a:05x} {i}" for a, i in sass))
        (Path(dump) / f"{stem}.ptx").write_text(k.asm["ptx"])
    body = _loop(sass)
    ops = Counter(_opcode(i).split(".")[0] for i in body)
    nw = tiles["num_warps"]
    per_w = lambda n: n * nw * 32 / weights  # noqa: E731
    kinds = {"int": sum(v for o, v in ops.items() if o in INT_OPS),
             "fp": sum(v for o, v in ops.items() if o in FP_OPS),
             "cvt": sum(v for o, v in ops.items() if o in CVT_OPS),
             "mma": sum(v for o, v in ops.items() if o.startswith("HMMA") or o.startswith("HGMMA")),
             "smem": sum(v for o, v in ops.items() if o in ("LDS", "STS", "LDSM", "LDGSTS")),
             "ldg": sum(v for o, v in ops.items() if o.startswith("LDG")),
             "local": sum(v for o, v in ops.items() if o in ("LDL", "STL")),
             "bar": sum(v for o, v in ops.items() if o.startswith("BAR"))}
    ldg = Counter(re.search(r"LDG[\w.]*", i).group(0) for i in body if "LDG" in i)
    t_int = per_w(kinds["int"]) / 16.7e12
    t_fp = per_w(kinds["fp"] + kinds["cvt"]) / 33e12
    t_issue = per_w(len(body)) / 33e12
    row = {"variant": name, "loop_instr": len(body), "weights_per_iter": weights,
           "instr_per_weight": per_w(len(body)), **{f"{k_}_per_weight": per_w(v) for k_, v in kinds.items()},
           "ldg_kinds": dict(ldg), "registers": usage.get("REG", -1),
           "local_bytes": usage.get("LOCAL", 0) + usage.get("STACK", 0), "shared_bytes": k.metadata.shared,
           "hgmma": sum(v for o, v in ops.items() if o.startswith("HGMMA")),
           "pred_ps_per_weight": max(t_int, t_fp, t_issue) * 1e12, "top_ops": dict(ops.most_common(12))}
    return row


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--torch-site", help="a site-packages directory to append to sys.path (for torch)")
    ap.add_argument("--dump", help="write each variant's SASS and PTX here")
    ap.add_argument("--only", help="variants whose name contains this")
    ap.add_argument("--set", choices=["single", "batched"], default="single",
                    help="variant list: the single-request tiles (default) or the batched round's BLOCK_M 32/64")
    a = ap.parse_args(argv)
    if a.torch_site:
        sys.path.append(a.torch_site)
    sys.path.insert(0, str(ROOT))
    import json

    import triton

    print(f"triton {triton.__version__}, target sm_90a; floor 0.117 ps/weight at 4.8 TB/s (0.5625 B/weight)")
    rows = []
    for v in (_batched_variants() if a.set == "batched" else _variants()):
        if a.only and a.only not in v[0]:
            continue
        try:
            rows.append(count(*v, dump=a.dump))
        except Exception as e:  # noqa: BLE001 - report the variant and go on
            print(f"{v[0]}: compile failed: {type(e).__name__}: {str(e)[:2000]}")
    hdr = (f"{'variant':<26}{'loop':>6}{'instr/w':>9}{'int/w':>7}{'fp/w':>7}{'cvt/w':>7}{'mma/w':>7}{'smem/w':>8}"
           f"{'ldg/w':>7}{'local':>6}{'regs':>5}{'smemKB':>7}{'ps/w':>7}")
    print(hdr)
    for r in rows:
        if not r["loop_instr"]:
            print(f"{r['variant']:<26}  no K loop in the SASS (fully unrolled): not counted")
            continue
        print(f"{r['variant']:<26}{r['loop_instr']:>6}{r['instr_per_weight']:>9.2f}{r['int_per_weight']:>7.2f}"
              f"{r['fp_per_weight']:>7.2f}{r['cvt_per_weight']:>7.2f}{r['mma_per_weight']:>7.2f}"
              f"{r['smem_per_weight']:>8.2f}{r['ldg_per_weight']:>7.2f}{r['local_per_weight']:>6.2f}"
              f"{r['registers']:>5}{r['shared_bytes'] / 1024:>7.1f}{r['pred_ps_per_weight']:>7.3f}")
    for r in rows:
        print(f"  {r['variant']}: {r['top_ops']} LDG {r['ldg_kinds']}")
    print(json.dumps(rows))


if __name__ == "__main__":
    main()

#!/usr/bin/env bash
# A/B of the batched round's tiles on this card, one call: bench batch at 32 slots (BF16, then 4-bit experts) with
#   as_tuned   the tile files as they are,
#   attn64     plus a batched "attn" entry for this card with the H200's attention keys (BLOCK_M 64, BLOCK_N 64,
#              3 stages: the batched path's attention tiles; the single-request entry stays),
#   h200       this card's batched and attn entries replaced by the H200's,
#   ws16       this card's batched 16-bit expert GEMMs (moe_gate_up, moe_down) on the warp-specialised Gluon kernels
#              (repro/engine/kernels/moe_ws.py: IMPL "ws", BLOCK_M 64, 4 stages; BF16 only),
#   ENTRY@S:K=V,K=V   this card's batched entry ENTRY (e.g. moe_down) at S slots with the keys K set to the integers V
#              (over the entry's by_slots[S]), e.g. moe_down@32:BLOCK_N=256,num_warps=8; ENTRY:K=V,... the same on
#              the entry itself (every S), e.g. attn:BLOCK_M=128,num_warps=8,
# then the spread of the batched path's logits against the single-request path's (SPREAD_SEEDS, default 8; 0: none).
# PRECISIONS: default "bf16 nvfp4-w4a16"; VARIANTS: default "as_tuned attn64 h200". Writes under $OUT.
set -o pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=.
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
CFG=repro/engine/kernels/configs
cp -r $CFG /tmp/configs.orig
edit() {  # edit VARIANT: rewrite this card's entries in the tile files
python3 - "$1" <<'PY'
import json, sys, torch, pathlib
v, card = sys.argv[1], torch.cuda.get_device_name(0)
cfg = pathlib.Path("repro/engine/kernels/configs")
b = cfg / "batched_E=257_N=512_H=2048_T=32.json"; a = cfg / "attn_NQ=16_NKV=4_D=128_T=32.json"
db, da = json.loads(b.read_text()), json.loads(a.read_text())
if v == "attn64":
    db[card]["attn"] = {"BLOCK_M": 64, "BLOCK_N": 64, "num_stages": 3}
if v == "h200":
    db[card] = dict(db["NVIDIA H200"]); da[card] = dict(da["NVIDIA H200"])
if v.startswith("ws16"):  # ws16 or ws16_mM_sS: BLOCK_M M, STAGES S
    m, st = ([int(t[1:]) for t in v.split("_")[1:]] + [64, 4])[:2] if "_" in v else (64, 4)
    from repro.engine.kernels.moe_ws import WS16_TILES_DEFAULT
    for k in ("gate_up", "down"):
        db[card][f"moe_{k}"] = dict(WS16_TILES_DEFAULT[k], IMPL="ws", BLOCK_M=m, STAGES=st, num_warps=4, num_stages=3)
if ":" in v:  # ENTRY@S:K=V,... (the entry's by_slots[S]) or ENTRY:K=V,... (the entry itself)
    head, kv = v.split(":", 1)
    keys = {k: int(x) for k, x in (p.split("=") for p in kv.split(","))}
    if "@" in head:
        entry, slots = head.split("@", 1)
        bs = db[card][entry].setdefault("by_slots", {})
        bs[slots] = {**bs.get(slots, {}), **keys}
    else:
        db[card][head] = {**db[card].get(head, {}), **keys}
b.write_text(json.dumps(db)); a.write_text(json.dumps(da))
PY
}
for v in ${VARIANTS:-as_tuned attn64 h200}; do
  rm -rf $CFG && cp -r /tmp/configs.orig $CFG && edit $v
  for p in ${PRECISIONS:-bf16 nvfp4-w4a16}; do
    timeout 60 python3 -m repro.engine.bench batch --sections batched-graph --batch-sizes 32 --precision $p \
      --json "$OUT/ab_${v}_${p}.json" 2>&1 | grep -E "^\s+32 " | sed "s/^/$v $p: /"
  done
done
rm -rf $CFG && cp -r /tmp/configs.orig $CFG
[ "${SPREAD_SEEDS:-8}" -gt 0 ] && timeout 90 python3 scripts/gpu/batched_vs_single_spread.py --seeds "${SPREAD_SEEDS:-8}" \
  --json "$OUT/spread.json" 2>&1 | grep -v '^{' | tail -10

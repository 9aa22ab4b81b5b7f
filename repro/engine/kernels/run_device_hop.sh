#!/usr/bin/env bash
# One device call for the "hop" 4-bit decode and the swapped-operand (wgmma) expert GEMMs: their GPU tests beside
# the torch references (bf16), the old 4-bit tests, then the round (BF16 and nvfp4-w4a16, the old and new 4-bit
# kernels as tile variants, per-kernel breakdown). Usage on the device machine, from the repo root:
#   bash repro/engine/kernels/run_device_hop.sh        (writes tests.log, round.log, round.json under $OUT)
set -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
{ nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv
  python3 -c "import torch,triton;print('torch',torch.__version__,'triton',triton.__version__)"
  git log --oneline -1
  timeout ${TEST_S:-150} python3 -m pytest -q -p no:cacheprovider tests/kernels/test_moe_w4_hop.py \
    tests/kernels/test_moe_w4.py -rs ${PYTEST_ARGS:-} 2>&1 | grep -v "^$" | tail -40; echo "pytest rc=$?"; } | tee "$OUT/tests.log"
W4_ROUND_TILES=${W4_ROUND_TILES:-default,hop,hop_swap,hop_k128} timeout ${BENCH_S:-320} \
  python3 -m repro.engine.bench round --prefixes 1024 --naive-iters 0 --iters 30 --breakdown ${ROUND_ARGS:---variants base,norm_in_route+fused_attn+pdl} \
  --json "$OUT/round.json" 2>&1 | tee "$OUT/round.log" | grep -v "^{" | tail -80
echo "round rc=$?"

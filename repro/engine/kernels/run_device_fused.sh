#!/usr/bin/env bash
# One device call (≤ 10 min) for the one-launch router + route
# (kernels/route_fused.py) and the one-launch QK-norm/RoPE/KV + attention + combine (kernels/attention_fused.py),
# each against today's path in the same process. Usage on the device machine, from the repo root:
#   bash repro/engine/kernels/run_device_fused.sh
# Writes under $OUT: tests.log; route.log/route.json (bench route --sets fused: A/B pairs of the same tiles, bit
# for bit); attention.log/attention.json (bench attention: three launches vs the fused one per tile set);
# round.log/round.json (bench round: the BF16 round with the old and new paths as variants, and their per-kernel
# breakdowns side by side). STAGES picks stages (default "tests route attention round"); each has its own
# timeout (TESTS_S, ROUTE_S, ATTN_S, ROUND_S seconds) so that a slow stage cannot eat the others' time.
set -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
STAGES=${STAGES:-tests route attention round}
{ nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv
  python3 -c "import torch,triton;print('torch',torch.__version__,'triton',triton.__version__)"
  git log --oneline -1; } 2>&1 | tee "$OUT/env.log"
if [[ " $STAGES " == *" tests "* ]]; then
  timeout ${TESTS_S:-170} python3 -m pytest -q -p no:cacheprovider -rs tests/kernels/test_route_fused.py \
    tests/kernels/test_route_select.py tests/kernels/test_route_norm.py tests/kernels/test_attention.py \
    tests/kernels/test_attention_fused.py tests/kernels/test_fastpath.py tests/kernels/test_batched_forward.py \
    tests/kernels/test_bench_profile.py ${PYTEST_ARGS:-} 2>&1 | grep -v "^$" | tail -40 | tee "$OUT/tests.log"
  echo "pytest rc=$?"
fi
if [[ " $STAGES " == *" route "* ]]; then
  timeout ${ROUTE_S:-150} python3 -m repro.engine.bench route --sets fused --rows 32,1024 --layers 48 --iters 20 \
    --json "$OUT/route.json" 2>&1 | tee "$OUT/route.log" | grep -v "^{" | tail -30
  echo "route rc=$?"
fi
if [[ " $STAGES " == *" attention "* ]]; then
  timeout ${ATTN_S:-80} python3 -m repro.engine.bench attention --prefixes 0,1024,4096 --layers 20 --iters 30 \
    --json "$OUT/attention.json" 2>&1 | tee "$OUT/attention.log" | grep -v "^{" | tail -16
  echo "attention rc=$?"
fi
if [[ " $STAGES " == *" round "* ]]; then
  V=norm_in_route,norm_in_route+fused_route,norm_in_route+fused_attn,norm_in_route+fused_route+fused_attn
  timeout ${ROUND_S:-180} python3 -m repro.engine.bench round --prefixes 1024 --naive-iters 0 --iters 30 --no-w4 \
    --variants "$V" --breakdown --breakdown-variants norm_in_route,norm_in_route+fused_route+fused_attn \
    ${ROUND_ARGS:-} --json "$OUT/round.json" 2>&1 | tee "$OUT/round.log" | grep -v "^{" | tail -60
  echo "round rc=$?"
fi

#!/usr/bin/env bash
# One GPU call for the weights-only 4-bit expert GEMMs (docs/perf_history.md, "Session 5"): the kernel tests in bf16,
# per-kernel timings of one MoE layer (default tiles and the W4_TILES variants named in $W4_KERNEL_TILES), then the
# full round (4-bit with every W4_TILES variant or those in $W4_ROUND_TILES, and BF16, in one process); $W4_TESTS
# narrows the tests (pytest arguments, $W4_TESTS_S their time limit). Logs and JSON under $OUT; a short table last.
# Run from a checkout's root (or a staged copy of repro/ tests/ scripts/).
cd "$(dirname "$0")/../.."
export PYTHONUNBUFFERED=1
nvidia-smi -L | tee $OUT/gpus.txt
step() { local name=$1 lim=$2; shift 2; local t0=$(date +%s)
  timeout $lim "$@" > $OUT/$name.log 2>&1; local rc=$?
  echo "[$name] rc=$rc $(( $(date +%s)-t0 ))s :: $(grep -v '^\s*$' $OUT/$name.log | tail -n 2 | tr '\n' ' ' | cut -c1-300)" | tee -a $OUT/summary.txt; }
step tests ${W4_TESTS_S:-100} python3 -m pytest -q --tb=short ${W4_TESTS:-tests/kernels/test_moe_w4.py tests/kernels/test_graph_w4.py tests/kernels/test_moe.py}
step kernels 60 python3 -c "import json,os; from repro.engine.bench.w4 import moe_layer_kernels as f; t=tuple(x for x in os.environ.get('W4_KERNEL_TILES','k128,k128+dec3,s4,s2,gu_n32_w2').split(',') if x); json.dump(f(tiles=t), open(os.environ['OUT']+'/kernels.json','w'), indent=1)"
step round 150 python3 -m repro.engine.bench round --naive-iters 0 --iters 30 --json $OUT/round.json
echo "== done"; cat $OUT/summary.txt
grep -h "\[moe layer\|\[w4 round\|\[round\|ratio" $OUT/kernels.log $OUT/round.log | cut -c1-200 | tail -40

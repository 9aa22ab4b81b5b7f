#!/usr/bin/env bash
# One GPU call for the 4-bit experts in the batched round (docs/perf_history.md, "Session 5: the 4-bit experts in the batched
# round"): the candidate 4-bit tile sets of docs/bench/graph_round_w4_sweep_sets.json timed at S = 1 / 8 / 32 over one
# model load (graph replays, breakdown, slot-0 invariance per set), then the GPU tests of the 4-bit kernels at the
# batched row tiles ($W4B_TESTS_K: their -k selection). Logs and JSON under $OUT; a short table last. $W4B_SWEEP_S /
# $W4B_TESTS_S: the two steps' time limits (s). Run from a checkout's root (or a staged copy of repro/ tests/
# scripts/ docs/bench).
cd "$(dirname "$0")/../.."
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv > $OUT/gpu.txt 2>&1
step() { local name=$1 lim=$2; shift 2; local t0=$(date +%s)
  timeout $lim "$@" > $OUT/$name.log 2>&1; local rc=$?
  echo "[$name] rc=$rc $(( $(date +%s)-t0 ))s" | tee -a $OUT/summary.txt; }
step sweep ${W4B_SWEEP_S:-85} python3 -m repro.engine.bench graph-round --slots 1,8,32 --prefix 1024 \
  --precision nvfp4-w4a16 --iters 20 --sweep docs/bench/graph_round_w4_sweep_sets.json \
  --json $OUT/graph_round_w4_sweep.json
step tests ${W4B_TESTS_S:-40} python3 -m pytest -q --tb=short -p no:cacheprovider tests/kernels/test_moe_w4.py \
  -k "${W4B_TESTS_K:-batched_row_tiles}"
grep -h "^\[S=\|tile set\|failed" $OUT/sweep.log | cut -c1-170 | tail -24
grep "|" $OUT/sweep.log | tail -7
tail -4 $OUT/tests.log
cat $OUT/gpu.txt $OUT/summary.txt

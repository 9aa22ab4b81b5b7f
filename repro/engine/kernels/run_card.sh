#!/usr/bin/env bash
# One device call for a card: the tuner, the GPU tests, the speed figures of docs/perf.md's table, in that order,
# each step only if named. Usage on the device machine, from the repo root:
#   bash repro/engine/kernels/run_card.sh STEP [STEP ...]
# STEPS: card (name, SMs, memory clock), tune-quick and tune (quick / full; TUNE_ONLY=families), tests, round, round-w4,
#        batch (BF16, 1/8/32), batch-w4, serve (bench serve --concurrency 1,8,32), spread (batched vs single-request
#        logits over 12 seeds: scripts/gpu/batched_vs_single_spread.py), fused-round (the BF16 round with the fused
#        router/route and attention as variants), old-batch (bench batch 1,32 in an older tree at $OLD, default .old)
# Writes under $OUT: card.log, tune.log + tune.json + configs.tar, tests.log, round*.json, batch*.json, serve.json,
# and each step's seconds in steps.log. Every step is bounded (timeout, and BUDGET_S for the whole call, default
# 580 s) so the call returns what it measured.
set -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
END=$(( $(date +%s) + ${BUDGET_S:-580} ))  # the whole call's bound: a step gets at most what is left of it
step() {  # step NAME SECONDS COMMAND...: run, log its time and exit status
  local name=$1 limit=$2; shift 2
  local left=$(( END - $(date +%s) ))
  [ "$left" -lt "$limit" ] && limit=$left
  [ "$limit" -le 5 ] && { echo "$name skipped: no time left" | tee -a "$OUT/steps.log"; return; }
  local t0=$(date +%s)
  timeout "$limit" "$@"
  local rc=$?
  echo "$name rc=$rc $(( $(date +%s) - t0 )) s" | tee -a "$OUT/steps.log"
}
for s in "$@"; do
  case $s in
    card) step card 60 bash -c 'nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,memory.total --format=csv
          python3 -c "import torch,triton,json; p=torch.cuda.get_device_properties(0); print(json.dumps({\"torch\":torch.__version__,\"triton\":triton.__version__,\"name\":p.name,\"cc\":[p.major,p.minor],\"sms\":p.multi_processor_count,\"mem\":p.total_memory,\"memory_clock_rate\":getattr(p,\"memory_clock_rate\",None),\"memory_bus_width\":getattr(p,\"memory_bus_width\",None)}))
from repro.engine.kernels.configs import current_card, tiles_report; print(current_card()); print(tiles_report()[\"summary\"])"' 2>&1 | tee "$OUT/card.log" ;;
    tune-quick) step tune-quick "${TUNE_S:-560}" python3 -m repro.engine.kernels.tune --quick --only "${TUNE_ONLY:-moe,w4,dense,linear,attn,batched,batched-w4}" --json "$OUT/tune.json" 2>&1 | tee "$OUT/tune.log" | grep -v '^{'
          tar cf "$OUT/configs.tar" repro/engine/kernels/configs/*.json ;;
    tune) step tune "${TUNE_S:-580}" python3 -m repro.engine.kernels.tune --only "${TUNE_ONLY:-moe,w4,dense,linear,attn,batched,batched-w4}" --json "$OUT/tune.json" 2>&1 | tee "$OUT/tune.log" | grep -v '^{'
          tar cf "$OUT/configs.tar" repro/engine/kernels/configs/*.json ;;
    tests) step tests "${TEST_S:-300}" python3 -m pytest -q -p no:cacheprovider ${TESTS:-tests/kernels tests/engine/test_gpu.py tests/engine/test_batch_graph.py tests/engine/test_loop.py} ${PYTEST_ARGS:-} -rs 2>&1 | grep -v "^$" | tee "$OUT/tests.log" | tail -30 ;;
    round) step round 200 python3 -m repro.engine.bench round --breakdown ${ROUND_ARGS:-} --json "$OUT/round.json" 2>&1 | grep -v '^{' | tail -40 ;;
    round-w4) step round-w4 200 python3 -m repro.engine.bench round --precision nvfp4-w4a16 --json "$OUT/round_w4.json" 2>&1 | grep -v '^{' | tail -25 ;;
    batch) step batch 240 python3 -m repro.engine.bench batch --sections batched-graph --batch-sizes ${BATCH_SIZES:-1,8,32} --json "$OUT/batch.json" 2>&1 | grep -v '^{' | tail -25 ;;
    batch-w4) step batch-w4 240 python3 -m repro.engine.bench batch --sections batched-graph --batch-sizes 32 --precision nvfp4-w4a16 --json "$OUT/batch_w4.json" 2>&1 | grep -v '^{' | tail -25 ;;
    serve) step serve 300 python3 -m repro.engine.bench serve --concurrency 1,8,32 --tokens 256 --prompt-tokens 512 --repeats 2 --json "$OUT/serve.json" 2>&1 | grep -v '^{' | tail -25 ;;
    spread) step spread 200 python3 scripts/gpu/batched_vs_single_spread.py --seeds 12 --json "$OUT/spread.json" 2>&1 | grep -v '^{' | tail -16 ;;
    fused-round) step fused-round 240 python3 -m repro.engine.bench round --prefixes 1024 --naive-iters 0 --iters 30 --no-w4 \
          --variants norm_in_route,norm_in_route+fused_route,norm_in_route+fused_attn,norm_in_route+fused_route+fused_attn \
          --breakdown --breakdown-variants norm_in_route,norm_in_route+fused_route+fused_attn --json "$OUT/fused_round.json" 2>&1 | grep -v '^{' | tail -45 ;;
    old-batch) [ -d "${OLD:-.old}" ] && (cd "${OLD:-.old}" && step old-batch 240 python3 -m repro.engine.bench batch --sections batched-graph \
          --batch-sizes 1,32 --json "$OUT/old_batch.json" 2>&1 | grep -v '^{' | tail -20) ;;
    *) echo "run_card.sh: unknown step $s (card, tune-quick, tune, tests, round, round-w4, batch, batch-w4, serve)"; exit 2 ;;
  esac
done
cat "$OUT/steps.log"

#!/usr/bin/env bash
# One device call for the GPU work in docs/perf.md ("Tiles per card", the fused round) on whatever card the device tool lends:
#   bash scripts/gpu/card_call.sh PLAN      (device tool: carry [".whl"]: the wheels bench serve needs and the device
#   image lacks, fastapi starlette pydantic pydantic_core annotated-types typing-inspection typing_extensions uvicorn,
#   from: pip download --python-version 3.12 --only-binary=:all: --no-deps -d .whl <those>)
# PLAN: auto (H100: quick-measure; other cards: measure) | quick-measure | measure | lean (about 450 s) |
#       min (about 230 s: the loop's GPU tests and the batched-vs-single spread) | tune | serve-fused | ws-serve | ws |
#       pairs (GPU tests, batch 32 with fp32 against bf16 MoE pair rows, the table's figures) |
#       down32 (the MoE kernels' tests, kernel families at 32 slots, moe_down tile variants at 32 slots).
# Tiles tuned by an earlier call of the same machine are kept in .tuned/ and copied back in.
# Every step is bounded (run_card.sh's BUDGET_S); results under $OUT (t/ tune, ab/ A/B of tiles, m/ measurements).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/dev/null 2>&1 || echo WHEELS-FAILED
R=repro/engine/kernels/run_card.sh; O=$OUT
CARD=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "card: $CARD"; git log --oneline -1 2>/dev/null
[ -d .tuned ] && cp .tuned/*.json repro/engine/kernels/configs/ && echo "tiles from .tuned"
ENGINE_TESTS="tests/engine/test_gpu.py tests/engine/test_batch_graph.py tests/engine/test_loop.py"
PLAN=$1; [ "$PLAN" = auto ] && case $CARD in *H100*) PLAN=quick-measure;; *) PLAN=measure;; esac
echo "plan: $PLAN"
case $PLAN in
  tune)  # H100 only: full batched tune, then A/B tuned vs H200 tiles
    case $CARD in *H100*) ;; *) echo "not an H100: no tune"; exit 3;; esac
    OUT=$O/bf16 BUDGET_S=330 TUNE_S=330 TUNE_ONLY=batched bash $R card tune 2>&1 | cut -c1-400 | tail -22
    OUT=$O/w4 BUDGET_S=185 TUNE_S=185 TUNE_ONLY=batched-w4 bash $R tune 2>&1 | cut -c1-400 | tail -18
    mkdir -p .tuned && cp repro/engine/kernels/configs/*.json .tuned/
    OUT=$O/ab VARIANTS="as_tuned h200" SPREAD_SEEDS=0 timeout 75 bash scripts/gpu/batched_tiles_ab.sh 2>&1 | tail -8 ;;
  measure)  # GPU tests, spread, benches (any card)
    OUT=$O/m BUDGET_S=${BUDGET_S:-555} TEST_S=${TEST_S:-250} TESTS="tests/kernels $ENGINE_TESTS" PYTEST_ARGS="-n 4 --dist loadfile --durations=15" \
      PYTHONPATH=/tmp/site bash $R ${STEPS:-card batch batch-w4 round spread tests serve} 2>&1 | cut -c1-300 ;;
  quick-measure)  # H100: attention + batched tiles quick-tuned (the tuner's round check: its choice vs the H200's entry), then measure
    case $CARD in *H100*) ;; *) echo "not an H100: no tune"; exit 3;; esac
    OUT=$O/t BUDGET_S=250 TUNE_S=250 TUNE_ONLY=attn,batched,batched-w4 bash $R tune-quick 2>&1 | cut -c1-300 \
      | grep -E "round check|verify|failed|Error|rc=|done in" | tail -24
    mkdir -p .tuned && cp repro/engine/kernels/configs/*.json .tuned/
    OUT=$O/m BUDGET_S=${BUDGET_S:-$(( 585 - SECONDS ))} TEST_S=${TEST_S:-190} TESTS="tests/kernels $ENGINE_TESTS" PYTEST_ARGS="-n 4 --dist loadfile --durations=15" \
      PYTHONPATH=/tmp/site bash $R ${STEPS:-card batch batch-w4 tests round} 2>&1 | cut -c1-300 ;;
  lean)  # short budget: H100 -> batched tiles quick-tuned, A/B BF16 vs H200 tiles + spread, loop/graph/batched tests
    case $CARD in
      *H100*)
        OUT=$O/t BUDGET_S=130 TUNE_S=130 TUNE_ONLY=batched bash $R tune-quick 2>&1 | cut -c1-300 | tail -14
        mkdir -p .tuned && cp repro/engine/kernels/configs/*.json .tuned/
        OUT=$O/ab VARIANTS="as_tuned h200" PRECISIONS=bf16 SPREAD_SEEDS=6 timeout 150 bash scripts/gpu/batched_tiles_ab.sh 2>&1 | tail -12
        OUT=$O/m BUDGET_S=${BUDGET_S:-170} TEST_S=${TEST_S:-165} TESTS="tests/kernels/test_batched_forward.py $ENGINE_TESTS" PYTEST_ARGS="-n 4 --dist loadfile --durations=15" \
          PYTHONPATH=/tmp/site bash $R tests 2>&1 | cut -c1-300 ;;
      *)
        OUT=$O/m BUDGET_S=${BUDGET_S:-440} TEST_S=${TEST_S:-200} TESTS="tests/kernels $ENGINE_TESTS" PYTEST_ARGS="-n 4 --dist loadfile --durations=15" \
          PYTHONPATH=/tmp/site bash $R card batch spread tests 2>&1 | cut -c1-300 ;;
    esac ;;
  min)  # the engine loop's GPU tests and the batched-vs-single spread (the bound of tests/kernels/test_batched_forward.py)
    OUT=$O/m BUDGET_S=${BUDGET_S:-230} TEST_S=${TEST_S:-150} TESTS="$ENGINE_TESTS tests/kernels/test_batched_forward.py" PYTEST_ARGS="-n 4 --dist loadfile --durations=15" \
      PYTHONPATH=/tmp/site bash $R card tests spread 2>&1 | cut -c1-300 ;;
  serve-fused)  # serve bench, then the fused router/route and attention kernels (docs/perf.md)
    OUT=$O/s BUDGET_S=150 PYTHONPATH=/tmp/site bash $R serve 2>&1 | cut -c1-300 | tail -20
    OUT=$O/f TESTS_S=90 ROUTE_S=110 ATTN_S=70 ROUND_S=170 bash repro/engine/kernels/run_device_fused.sh 2>&1 | cut -c1-300 ;;
  ws-serve)  # the warp-specialised 4-bit expert GEMM (tests, bench), bench serve, the round with its breakdown
    timeout ${WS_TEST_S:-100} python3 -m pytest -q -p no:cacheprovider -rs --durations=5 tests/kernels/test_moe_w4_ws.py \
      tests/kernels/test_moe_w4_hop.py tests/kernels/test_route_fused.py -k "not interpreter" 2>&1 | grep -v "^$" | cut -c1-400 | tail -40
    timeout ${WS_BENCH_S:-70} python3 scripts/bench_w4_ws.py --iters 100 2>&1 | cut -c1-300 | tail -30
    W4_ROUND_TILES=${W4_ROUND_TILES:-default,hop_swap,ws} OUT=$O/s BUDGET_S=$(( ${END_S:-560} - SECONDS )) PYTHONPATH=/tmp/site \
      bash $R ${STEPS:-serve round} 2>&1 | cut -c1-300 ;;
  ws)  # both warp-specialised Gluon expert GEMMs: GPU tests, per-launch benches, batch 32 BF16 on the 16-bit one, the 4-bit round on the 4-bit one
    timeout ${WS_TEST_S:-130} python3 -m pytest -q -p no:cacheprovider -rs --durations=6 tests/kernels/test_moe_ws.py \
      tests/kernels/test_moe_w4_ws.py tests/kernels/test_moe_w4_hop.py -k "not interpreter" 2>&1 | grep -v "^$" | cut -c1-400 | tail -40
    mkdir -p $O/b
    timeout 60 python3 scripts/bench_w4_ws.py --iters 100 2>&1 | tee $O/b/w4_ws.log | cut -c1-300 | grep -v '^{' | tail -30
    timeout 75 python3 scripts/bench_ws16.py --iters 30 2>&1 | tee $O/b/ws16.log | cut -c1-300 | grep -v '^{' | tail -40
    OUT=$O/ab VARIANTS="${WS_VARIANTS:-as_tuned ws16 ws16_m64_s3}" PRECISIONS=bf16 SPREAD_SEEDS=0 timeout 200 \
      bash scripts/gpu/batched_tiles_ab.sh 2>&1 | tail -8
    W4_ROUND_TILES=${W4_ROUND_TILES:-default,hop_swap,ws} OUT=$O/s BUDGET_S=$(( ${END_S:-585} - SECONDS )) \
      ROUND_ARGS="--prefixes 1024 --naive-iters 0 --iters 30" bash $R round 2>&1 | cut -c1-300 ;;
  pairs)  # the MoE pair rows in bf16: GPU tests (kernels + engine loop), batch 32 A/B against fp32 pair rows (two runs
          # each, in turn), then the table's figures and the batched-vs-single spread
    OUT=$O/m BUDGET_S=${TEST_BUDGET_S:-215} TEST_S=${TEST_S:-200} TESTS="tests/kernels $ENGINE_TESTS" \
      PYTEST_ARGS="-n 4 --dist loadfile --durations=10" PYTHONPATH=/tmp/site bash $R card tests 2>&1 | cut -c1-300
    mkdir -p $O/ab
    for i in 1 2; do
      timeout 70 python3 scripts/gpu/pair_rows_fp32.py batch --sections batched-graph --batch-sizes 32 \
        --json $O/ab/fp32_$i.json 2>&1 | grep -v '^{' | tail -3
      timeout 70 python3 -m repro.engine.bench batch --sections batched-graph --batch-sizes 32 \
        --json $O/ab/bf16_$i.json 2>&1 | grep -v '^{' | tail -3
    done
    OUT=$O/m BUDGET_S=$(( ${END_S:-585} - SECONDS )) ROUND_ARGS="--prefixes 1024 --naive-iters 0 --iters 30" \
      bash $R ${STEPS:-batch batch-w4 spread round} 2>&1 | cut -c1-300 ;;
  down32)  # the MoE kernels' GPU tests, the batched round's kernel families at 32 slots (BF16, 4-bit), then the
           # batch-32 BF16 round with this card's moe_down tiles at 32 slots varied (DOWN_VARIANTS)
    timeout 150 python3 -m pytest -q -p no:cacheprovider -n 4 tests/kernels/test_moe_w4.py tests/kernels/test_moe.py \
      tests/kernels/test_moe_ws.py tests/kernels/test_moe_w4_ws.py tests/kernels/test_moe_w4_hop.py 2>&1 | grep -v "^$" | tail -6
    mkdir -p $O/b
    for p in bf16 nvfp4-w4a16; do
      timeout 90 python3 -m repro.engine.bench graph-round --slots 32 --breakdown --precision $p --json $O/b/gr32_$p.json \
        2>&1 | grep -v '^{' | tail -30
    done
    OUT=$O/ab VARIANTS="${DOWN_VARIANTS:-as_tuned moe_down@32:BLOCK_N=256,num_warps=8 moe_down@32:num_stages=4 \
moe_down@32:BLOCK_K=128,num_stages=2 moe_down@32:TMA=0 moe_down@32:num_warps=8 as_tuned}" PRECISIONS=bf16 SPREAD_SEEDS=0 \
      timeout $(( ${END_S:-585} - SECONDS )) bash scripts/gpu/batched_tiles_ab.sh 2>&1 | tail -12 ;;
  *) echo "plan: auto | quick-measure | measure | lean | min | tune | serve-fused | ws-serve | ws | pairs | down32"; exit 2 ;;
esac
# the device tool returns a few files only: everything under $OUT as one archive
(cd "$O" && tar czf /tmp/out.tgz . && rm -rf ./* && mv /tmp/out.tgz all.tgz)

#!/usr/bin/env bash
# One GPU call for the per-layer small kernels of the single-request round (docs/perf.md "Session 6: the per-layer
# small kernels at batch 1"): the new kernels' tests in bf16, then `bench round` with the split-K variants, the 4-bit
# round with them (--w4-variants) and the per-kernel breakdown of both rounds (--breakdown) — "after"; the same
# benchmark from a copy of the base branch in ./main when present — "before"; then the GPU tests of the touched
# kernels. Environment: S6_VARIANTS / S6_W4_VARIANTS (variant lists), S6_TESTS (pytest arguments), S6_NO_BEFORE=1,
# S6_*_S (time limits). Logs and JSON under $OUT; the summary and the tables last.
# Run from a checkout's root (or a staged copy of repro/ tests/ scripts/).
cd "$(dirname "$0")/../.."
export PYTHONUNBUFFERED=1 W4_ROUND_TILES=${W4_ROUND_TILES:-default}
nvidia-smi -L > $OUT/summary.txt
step() { local name=$1 lim=$2; shift 2; local t0=$(date +%s)
  timeout $lim "$@" > $OUT/$name.log 2>&1; local rc=$?
  echo "[$name] rc=$rc $(( $(date +%s)-t0 ))s :: $(grep -v '^\s*$' $OUT/$name.log | tail -n 2 | tr '\n' ' ' | cut -c1-300)" | tee -a $OUT/summary.txt; }
V=${S6_VARIANTS:-norm_in_route,norm_in_route+pdl,norm_in_route+splitk,norm_in_route+splitk_qkv,norm_in_route+splitk_o,norm_in_route+splitk+s16,norm_in_route+splitk+router,norm_in_route+splitk+router+pdl,norm_in_route+splitk+router+o128,norm_in_route+splitk+router+nopf,norm_in_route+splitk+router+pre,norm_in_route+splitk+router+pre+pdl}
V4=${S6_W4_VARIANTS:-norm_in_route,norm_in_route+splitk,norm_in_route+splitk+router}
step new_tests ${S6_NEW_S:-90} python3 -m pytest -q --tb=short -p no:cacheprovider tests/kernels/test_splitk.py tests/kernels/test_bench_profile.py tests/kernels/test_fastpath.py
step after ${S6_AFTER_S:-180} python3 -m repro.engine.bench round --naive-iters 0 --iters 30 --variants $V --w4-variants $V4 --breakdown --json $OUT/after.json
if [ -d main ] && [ -z "$S6_NO_BEFORE" ]; then
  (cd main && step before ${S6_BEFORE_S:-90} python3 -m repro.engine.bench round --naive-iters 0 --iters 30 --json $OUT/before.json)
fi
step tests ${S6_TESTS_S:-70} python3 -m pytest -q --tb=short -p no:cacheprovider ${S6_TESTS:-tests/kernels/test_attention.py tests/kernels/test_norm.py tests/kernels/test_graph_w4.py tests/kernels/test_route_norm.py tests/kernels/test_route_select.py}
echo "== summary"; cat $OUT/summary.txt
grep -h "variant\|\[w4 round\|engine (\|^|" $OUT/after.log | cut -c1-220
grep -h "engine (\|\[w4 round issue\|\[w4 round half" $OUT/before.log 2>/dev/null | cut -c1-200
for f in after before; do [ -f $OUT/$f.json ] && python3 -c "import json,sys; print('$f', json.dumps(json.load(open(sys.argv[1]))['summary']))" $OUT/$f.json; done

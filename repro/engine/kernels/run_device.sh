#!/usr/bin/env bash
# One device call (nvidia-h200): GPU tests (kernels + engine), optional tuner, round (BF16, then the weights-only
# 4-bit round) + generation benchmark, then the engine's own decode loop (CUDA-graph backend, on-device decoder
# step) at full size in BF16 and in nvfp4-w4a16, and the per-kernel MoE times (BF16 vs 4-bit).
# Usage on the device machine, from the repo root:  bash repro/engine/kernels/run_device.sh [tune|notune]
# Writes under $OUT: tests.log, tune.log, configs.tar, profile.txt, bench.log, bench.json, decode.log, decode.json,
# decode_w4.json, moe_w4.log
set -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
MODE=${1:-tune}
{ nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv
  python3 -c "import torch,triton;print('torch',torch.__version__,'triton',triton.__version__,'cuda',torch.version.cuda)"
  timeout ${TEST_S:-200} python3 -m pytest -q -p no:cacheprovider -s tests/kernels tests/engine/test_gpu.py -rs ${PYTEST_ARGS:-} 2>&1 | grep -v "^$" | tail -40; echo "pytest rc=$?"; } | tee "$OUT/tests.log"
if [ "$MODE" = tune ]; then
  timeout ${TUNE_S:-240} python3 -m repro.engine.kernels.tune ${TUNE_ARGS:-} 2>&1 | tee "$OUT/tune.log"
fi
tar cf "$OUT/configs.tar" repro/engine/kernels/configs/*.json 2>/dev/null
timeout ${BENCH_S:-220} python3 -m repro.engine.bench all --profile "$OUT/profile.txt" --json "$OUT/bench.json" 2>&1 | tee "$OUT/bench.log" | grep -v "^{"
echo "bench rc=$?"
timeout ${DECODE_S:-150} python3 -m repro.engine.bench decode --json "$OUT/decode.json" 2>&1 | tee "$OUT/decode.log" | grep -v "^{"
echo "decode rc=$?"
timeout ${DECODE_S:-150} python3 -m repro.engine.bench decode --precision nvfp4-w4a16 --json "$OUT/decode_w4.json" 2>&1 | grep -v "^{"
timeout 60 python3 -m repro.engine.bench w4 2>&1 | tee "$OUT/moe_w4.log" | grep -v "^{"
python3 - <<'PY'
import json, os
out = os.environ.get("OUT", "/tmp/out")
for f in ("bench.json", "decode.json"):
    try:
        d = json.load(open(os.path.join(out, f)))
        print(f, json.dumps(d.get("summary") or {k: {kk: (vv if not isinstance(vv, dict) else {x: y for x, y in vv.items() if x in ("tokens_per_s", "gpu_idle_frac", "ms_per_replay", "tpf")}) for kk, vv in v.items()} if isinstance(v, dict) else v for k, v in d["decode"].items()}))
    except Exception as e:  # noqa: BLE001
        print(f, "missing:", e)
PY

#!/usr/bin/env bash
# One device call (nvidia-h200): GPU kernel tests, tuner, round + generation benchmark.
# Usage on the device machine, from the repo root:  bash repro/engine/kernels/run_device.sh [tune|notune]
# Writes logs under $OUT (at most 8 files): tests.log, tune.log, configs.tar, profile.txt, bench.log, bench.json
set -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
MODE=${1:-tune}
{ nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv
  python3 -c "import torch,triton;print('torch',torch.__version__,'triton',triton.__version__,'cuda',torch.version.cuda)"
  timeout ${TEST_S:-150} python3 -m pytest -q -p no:cacheprovider tests/kernels -rs ${PYTEST_ARGS:-} 2>&1; echo "pytest rc=$?"; } | tee "$OUT/tests.log"
if [ "$MODE" = tune ]; then
  timeout ${TUNE_S:-240} python3 -m repro.engine.kernels.tune ${TUNE_ARGS:-} 2>&1 | tee "$OUT/tune.log"
fi
tar cf "$OUT/configs.tar" repro/engine/kernels/configs/*.json 2>/dev/null
timeout ${BENCH_S:-200} python3 -m repro.engine.bench all --profile "$OUT/profile.txt" --json "$OUT/bench.json" 2>&1 | tee "$OUT/bench.log"
echo "bench rc=$?"

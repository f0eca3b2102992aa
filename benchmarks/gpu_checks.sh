#!/usr/bin/env bash
# The GPU checks of issue 25 in one call, for a lent GPU machine with a short time budget (run from the repository
# root; what it writes goes to $OUT, default ./gpu-checks). It needs:
#   .whl/  the wheels the machine lacks (pydantic and its dependencies for its Python), installed to /tmp/site;
#   .gpu/  SmolLM2-135M-Instruct's config.json and tokenizer files (the benchmarks' --random-weights --template).
# Make both here first: bash benchmarks/gpu_prepare.sh (then the device call with carry=[".whl", ".gpu"]).
# Each step has its own time limit, so that a hang costs one step, not the call (they add up to 620 s; at most 7 files
# come back, within the device tool's 8):
#   1. tests/unit/test_cuda_graphs.py: compiled generate gives the eager tokens on CUDA, the graphs replay;
#   2. bench_gpu.py at 25 rows, plain and `toxicity`, eager and compiled, and `toxicity` compiled with the engine
#      committing tokens instead of indices (compiled-search-commit: the commit by index side by side), in each
#      set-up ($SETUPS: float32/torch, the defaults, and bfloat16/torch-bf16-compute): the throughput figure;
#      then, in the same process (its shapes compiled), --kernel-profile (the GPU's kernels and busy time per step,
#      last set-up) and --profile (cProfile of one compiled generate); SYNC_DEBUG=1 adds --sync-debug (each line of
#      a compiled step that makes the host wait);
#   3. bench_compile_payback.py on CUDA from a cold cache: compile time and payback (steerkit.compiling's CUDA entry).
# Usage on the device: bash benchmarks/gpu_checks.sh [QUICK=1 skips step 3; MODES="eager compiled ...": bench_gpu's
# --modes; REWARDS="plain toxicity-token toxicity": its --rewards; SETUPS="float32/torch ...": its --setups]
set -u
OUT=${OUT:-gpu-checks}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    > "$OUT/gpu.txt" 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
export STEERKIT_CACHE=${STEERKIT_CACHE:-/tmp/steerkit-cache}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv >> "$OUT/gpu.txt" 2>&1
python3 -c "import torch, transformers; print(torch.__version__, transformers.__version__)" >> "$OUT/gpu.txt" 2>&1

step() {  # step NAME SECONDS COMMAND...: run with a limit, keep its output and exit status
    local name=$1 limit=$2
    shift 2
    local start=$SECONDS
    timeout "$limit" "$@" > "$OUT/$name.txt" 2>&1
    echo "$name: exit $? after $((SECONDS - start)) s" | tee -a "$OUT/steps.txt"
}

step pytest_cuda_graphs 170 python3 -m pytest tests/unit/test_cuda_graphs.py -p no:cacheprovider -p no:logging \
    --tb=short -q -rs
SYNC=""
[ "${SYNC_DEBUG:-0}" = 1 ] && SYNC=--sync-debug
step bench_gpu 300 python3 benchmarks/bench_gpu.py --device cuda --random-weights --template .gpu --rows 25 \
    --rewards ${REWARDS:-plain toxicity} --modes ${MODES:-eager compiled compiled-search-commit} \
    --setups ${SETUPS:-float32/torch bfloat16/torch-bf16-compute} --kernel-profile --profile $SYNC \
    --out "$OUT/bench_gpu.json"
if [ "${QUICK:-0}" != 1 ]; then
    step compile_payback 150 python3 benchmarks/bench_compile_payback.py --device cuda --cold --random-weights \
        --template .gpu --reward plugins/steerkit-toxicity/steerkit_toxicity/model --prompts 4 \
        --out "$OUT/bench_compile_payback_gpu.json"
fi
tail -n 3 "$OUT"/*.txt

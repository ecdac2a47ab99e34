#!/bin/bash
# The CUDA path in one run, for a machine with one GPU and no network (written for the
# lent H200, whose tree travels under 64 MiB: no model weights come with it).
#
#   benchmarks/gpu_check.sh OUT_DIR [DATA_DIR [TOKENIZER_DIR [SECONDS]]]
#
# 1. gpu_tests: the tests marked gpu (tests/integration/test_cuda.py: the trainer's
#    log-probs and gradients against the CPU's, the sampler's semantics, PPO with a critic
#    resumed on the CPU from the GPU's checkpoint, bf16 autocast with a bf16 sampler; the
#    sampler's log-probs against a full recomputation); device_tests: model.device's;
# 2. roofline: benchmarks/roofline.py on the GPU for randomly initialised models of
#    SmolLM2-135M's and Qwen2.5-3B's shapes (benchmarks/shaped_model.py): decode against
#    the HBM floor, prefill, reference and update against the bf16 matmul peak measured
#    in the same process; one JSON line each in OUT_DIR/roofline.jsonl;
# 3. paper_step (with DATA_DIR, ../shared/data/raw, and TOKENIZER_DIR, Qwen3's tokenizer
#    files from .cache/tokenizers/qwen3): one GRPO step of recipes/qwen2.5-3b-paper.yaml
#    as the recipe has it (fp32 weights and AdamW, bf16 autocast, a bf16 sampler, group
#    5, turns of 1,024 tokens) on a random model of Qwen2.5-3B's shape, 4 questions, BM25
#    retrieval (the dense retriever's weights do not travel); its metrics and summary in
#    OUT_DIR. A random model's turns are noise that runs to the turn's cap: the step's
#    time and memory are the recipe's worst case, its rewards mean nothing;
# 4. world_grpo: the embedded demo recipe on the GPU (SFT warm start, 6 RL steps, eval);
# 5. where vLLM is installed: its tests and the world with vLLM rollouts.
#
# Parts run in that order while SECONDS (default 540) last; each prints its wall time; a
# failing part does not stop the others; the exit status is the number that failed.
# Everything is logged to OUT_DIR/gpu_check.log (checkpoints and weights are deleted).
# GPU_CHECK_ONLY="paper_step world_grpo" runs the named parts alone (a rerun of what
# failed, inside a lease's minutes); GPU_CHECK_DRY=1 rehearses every part on the CPU at toy sizes (a Qwen2.5-shaped model of
# 2 layers): run it before spending a GPU's minutes on the script.
set -u
OUT=${1:?usage: benchmarks/gpu_check.sh OUT_DIR [DATA_DIR [TOKENIZER_DIR [SECONDS]]]}
DATA=${2:-}
TOK=${3:-}
BUDGET=${4:-540}
PY=${PYTHON:-python3}
mkdir -p "$OUT"
LOG=$OUT/gpu_check.log
SCRATCH=${TMPDIR:-/tmp}/agentr1_gpu_check
rm -rf "$SCRATCH" && mkdir -p "$SCRATCH"
# The native kernels are CPU code: no compile on a machine that runs the GPU path.
export PYTHONUNBUFFERED=1 AGENTR1_NATIVE=${AGENTR1_NATIVE:-0} AGENTR1_CACHE=$SCRATCH/cache
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
failed=0
DEV=cuda QWEN=qwen2.5-3b TOY=() STEP=() WORLD=()
if [ -n "${GPU_CHECK_DRY:-}" ]; then
    DEV=cpu QWEN=qwen2.5-tiny
    TOY=(--rows 2 --context 16 --new 3 --train-len 24 --micro-batch 1 --repeats 1
         --matmul-n 256 --copy-mib 16)
    STEP=(model.device=cpu rollout.max_tokens_per_turn=16 train.tasks_per_step=1)
    WORLD=(sft.steps=10 train.steps=1 train.tasks_per_step=2 eval.max_tasks=2)
fi

want() {  # want NAME: whether GPU_CHECK_ONLY (if set) names NAME (paper_model: either step)
    [ -z "${GPU_CHECK_ONLY:-}" ] && return 0
    [ "$1" = paper_model ] && { want paper_step || want paper_step_lora; return; }
    [[ " $GPU_CHECK_ONLY " == *" $1 "* ]]
}

part() {  # part NAME SECONDS CMD...: run under a timeout into the log, show its tail
    local name=$1 limit=$2; shift 2
    want "$name" || return 1
    local left=$((BUDGET - SECONDS))
    if [ "$left" -lt 20 ]; then
        echo "== $name skipped: the budget is spent" | tee -a "$LOG"
        return 1
    fi
    [ "$limit" -le "$left" ] || limit=$left
    local t0=$SECONDS
    echo "== $name (at most $limit s)" | tee -a "$LOG"
    timeout "$limit" "$@" > "$SCRATCH/part.log" 2>&1
    local rc=$?
    cat "$SCRATCH/part.log" >> "$LOG"
    grep -v -E "it/s\]|s/it\]|^\s*$" "$SCRATCH/part.log" | tail -n 12
    echo "== $name rc=$rc $((SECONDS - t0)) s" | tee -a "$LOG"
    [ $rc -eq 0 ] || failed=$((failed + 1))
    return $rc
}

{
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
    $PY -c "import torch, transformers; print('torch', torch.__version__, 'transformers', \
transformers.__version__, 'cuda', torch.cuda.is_available())"
} 2>&1 | tee -a "$LOG"

[ -z "${GPU_CHECK_DRY:-}" ] || export AGENTR1_GPU_TEST_DEVICE=cpu
part gpu_tests 150 $PY -m pytest -p no:cacheprovider -q -m gpu --timeout 120 \
    tests/integration/test_cuda.py tests/integration/test_hf_backend.py
# model.device's tests are not marked gpu: with a GPU present "auto" must mean CUDA.
part device_tests 60 $PY -m pytest -p no:cacheprovider -q --timeout 60 tests/unit/test_device.py

roofline() {  # roofline NAME ARGS...: one JSON line in roofline.jsonl, the table in the log
    local name=$1; shift
    part "roofline_$name" 90 $PY benchmarks/roofline.py --device $DEV --matmul-n 8192 \
        --copy-mib 2048 --repeats 3 --record "$OUT/roofline.jsonl" --name "$name" "$@" \
        "${TOY[@]}"
}
# The CPU benchmark's work (8 rows, 370-token prompts), then the paper model's.
roofline smollm2_8 --shape smollm2-135m --rows 8 --context 370 --new 64 --train-len 400
roofline qwen3b_8 --shape $QWEN --rows 8 --context 1024 --new 64 --train-len 1024 \
    --micro-batch 4
roofline qwen3b_64 --shape $QWEN --rows 64 --context 1024 --new 32 --train-len 1024 \
    --micro-batch 4 --repeats 2

if [ -n "$DATA" ] && [ -n "$TOK" ] && [ ! -f "$TOK/tokenizer.json" ]; then
    echo "== paper_step skipped: no tokenizer.json in $TOK" | tee -a "$LOG"
elif [ -n "$DATA" ] && [ -n "$TOK" ]; then
    M=$SCRATCH/qwen2.5-3b-random
    PAPER=(recipes/qwen2.5-3b-paper.yaml "model.path=$M" "task.config.data_dir=$DATA"
           task.config.retriever=bm25 train.steps=1 train.tasks_per_step=4 eval.before=false
           eval.max_tasks=1 eval.sampled_n=0 "${STEP[@]}")
    part paper_model 60 $PY benchmarks/shaped_model.py $QWEN "$M" --tokenizer "$TOK" \
        --device $DEV  # the model both steps load
    # The recipe as it is, then with LoRA r16 (its note for a smaller GPU: the reference is
    # the base with the adapters off, no AdamW state for the base).
    for variant in paper_step paper_step_lora; do
        extra=()
        [ $variant = paper_step ] || extra=(model.lora.rank=16)
        [ -d "$M" ] && part $variant 240 $PY -m agentr1.cli train "${PAPER[@]}" "${extra[@]}" \
            "train.run_dir=$SCRATCH/$variant"
        cp "$SCRATCH/$variant/metrics.jsonl" "$OUT/${variant}_metrics.jsonl" 2>/dev/null
        cp "$SCRATCH/$variant/summary.json" "$OUT/${variant}_summary.json" 2>/dev/null
        # A full-weights run's checkpoint is ~37 GB: the lent machine's disk holds 64 GiB.
        rm -rf "$SCRATCH/$variant"
    done
    rm -rf "$M"
fi

part world_grpo 120 $PY -m agentr1.cli train recipes/demo.yaml model.device=$DEV \
    sft.steps=200 train.steps=6 train.checkpoint_every=3 "train.run_dir=$SCRATCH/world_grpo" \
    "${WORLD[@]}"
cp "$SCRATCH/world_grpo/summary.json" "$OUT/world_grpo_summary.json" 2>/dev/null

# The vllm backend where vLLM is installed (the lent machine reaches no registry).
if $PY -c "import vllm" > /dev/null 2>&1; then
    part vllm_tests 300 env VLLM_ENABLE_V1_MULTIPROCESSING=0 $PY -m pytest -p no:cacheprovider \
        -q -m vllm --timeout 300 tests
    part world_grpo_vllm 180 $PY -m agentr1.cli train recipes/demo.yaml model.device=$DEV \
        model.backend=vllm sft.steps=200 train.steps=3 "train.run_dir=$SCRATCH/world_vllm"
else
    want vllm_tests && echo "== vllm: not installed here (pip install vllm); its parts skipped" | tee -a "$LOG"
fi
rm -rf "$SCRATCH"
echo "failed parts: $failed ($SECONDS s)" | tee -a "$LOG"
exit $failed

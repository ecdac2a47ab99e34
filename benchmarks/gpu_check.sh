#!/bin/bash
# The CUDA path in one run, for a machine with one GPU (written for the lent H200; not yet
# run on a GPU: no machine was lent when it was written).
#
#   benchmarks/gpu_check.sh OUT_DIR [DATA_DIR SECONDS]
#
# 1. the GPU-marked tests and the device / HF-backend / mixed-precision tests; where vLLM
#    is installed, the vllm tests, the world with vLLM rollouts and one RL step of
#    recipes/qwen2.5-3b-paper.yaml (with DATA_DIR) at a small batch;
# 2. GRPO and PPO on the embedded world with the tiny model, on the GPU (SFT warm start,
#    rollouts, update, critic, eval), 6 RL steps each;
# 3. with DATA_DIR (../shared/data/raw) and SmolLM2 available (`agentr1 models prepare
#    smollm2-135m-instruct` works): recipes/multihop_smollm2.yaml at GPU batch sizes --
#    the warm start, then GRPO evaluated after every 10 steps on the recipe's 300
#    questions, until SECONDS (default 420) have passed since the script started.
#
# Each part prints its wall time; a failing part does not stop the others; the exit status
# is the number of parts that failed. Logs, summaries and the multihop results land in
# OUT_DIR (checkpoints and weights are deleted, so the folder stays small).
set -u
OUT=${1:?usage: benchmarks/gpu_check.sh OUT_DIR [DATA_DIR SECONDS]}
DATA=${2:-}
BUDGET=${3:-420}
PY=${PYTHON:-python3}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
failed=0

part() {  # part NAME CMD...: run to OUT/NAME.log, show its tail and wall time
    local name=$1; shift
    local t0=$SECONDS
    echo "== $name"
    "$@" > "$OUT/$name.log" 2>&1
    local rc=$?
    tail -n 8 "$OUT/$name.log"
    echo "== $name rc=$rc $((SECONDS - t0)) s"
    [ $rc -eq 0 ] || failed=$((failed + 1))
    return $rc
}

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
$PY -c "import torch, transformers; print('torch', torch.__version__, 'transformers', \
transformers.__version__, 'cuda', torch.cuda.is_available())"

part gpu_tests $PY -m pytest -p no:cacheprovider -q -m gpu --timeout 300 tests
part device_tests $PY -m pytest -p no:cacheprovider -q --timeout 300 \
    tests/unit/test_device.py tests/integration/test_hf_backend.py tests/integration/test_mixed_precision.py
# The vllm backend where vLLM is installed (the lent machine reaches no registry): its
# tests, the world with vLLM rollouts, and one RL step of the paper recipe at a small batch.
if $PY -c "import vllm" > /dev/null 2>&1; then
    part vllm_tests env VLLM_ENABLE_V1_MULTIPROCESSING=0 $PY -m pytest -p no:cacheprovider \
        -q -m vllm --timeout 600 tests
    part world_grpo_vllm $PY -m agentr1.cli train recipes/demo.yaml model.device=cuda \
        model.backend=vllm sft.steps=200 train.steps=3 "train.run_dir=$OUT/world_vllm"
    if [ -n "$DATA" ]; then
        part qwen3b_vllm_step timeout 420 $PY -m agentr1.cli train recipes/qwen2.5-3b-paper.yaml \
            model.backend=vllm train.steps=1 train.tasks_per_step=2 rollout.n_samples=4 \
            eval.before=false eval.max_tasks=4 "task.config.data_dir=$DATA" \
            "train.run_dir=$OUT/qwen3b_vllm"
    fi
else
    echo "== vllm: not installed here (pip install vllm); its parts skipped"
fi
for est in grpo gae; do
    part "world_$est" $PY -m agentr1.cli train recipes/demo.yaml model.device=cuda \
        algo.estimator=$est sft.steps=200 train.steps=6 train.checkpoint_every=3 \
        "train.run_dir=$OUT/world_$est"
done

if [ -n "$DATA" ] && part prepare $PY -m agentr1.cli models prepare smollm2-135m-instruct; then
    R=$OUT/multihop
    # GPU sizes: 8 questions x 6 samples a step, every eval question in one batch.
    O=(--root "$R" --docs "$R" "task.config.data_dir=$DATA" model.device=cuda
       eval.batch_tasks=300 optim.micro_batch_size=24 train.tasks_per_step=8
       train.checkpoint_every=10)
    part mh_warm $PY experiments/smollm2_multihop/multihop_real.py warm "${O[@]}"
    for steps in 10 20 30 40 60 80; do
        [ $SECONDS -lt "$BUDGET" ] || break
        part "mh_grpo_$steps" timeout $((BUDGET + 60 - SECONDS)) \
            $PY experiments/smollm2_multihop/multihop_real.py rl --variant grpo "${O[@]}" "train.steps=$steps" \
            || break
    done
    part mh_report $PY experiments/smollm2_multihop/multihop_real.py report "${O[@]}"
    find "$R" \( -name checkpoints -o -name final_model \) -prune -exec rm -rf {} +
fi
rm -rf "$OUT"/world_*/checkpoints "$OUT"/world_*/final_model "$OUT"/qwen3b_vllm/checkpoints \
    "$OUT"/qwen3b_vllm/final_model
echo "failed parts: $failed"
exit $failed

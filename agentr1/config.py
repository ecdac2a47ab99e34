"""The run configuration: one typed dataclass per stage, composed into `Config`.

Load a recipe with `load_config("recipes/demo.yaml", ["algo.estimator=ppo", ...])`; every
key and type is checked, then `Config.validate` checks the values once, at the entry
point, saying why a bad value would hurt. Nothing mutates a config after that.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from agentr1 import configutil
from agentr1.algorithms.objectives import get_kl_variant, get_policy_loss
from agentr1.algorithms.registry import get_advantage
from agentr1.rewards.process import ProcessRewardConfig
from agentr1.rollout.loop import RolloutConfig


@dataclass(frozen=True)
class TinyModelConfig:
    """Shape of the tiny Llama the demo builds from scratch (model.path = "tiny")."""

    hidden_size: int = 128
    """Width of the residual stream."""
    layers: int = 2
    """Transformer blocks."""
    heads: int = 4
    """Attention heads (hidden_size must divide by it)."""
    intermediate_size: int = 384
    """MLP width."""
    vocab_size: int = 2048
    """Target size of the byte-level BPE trained on the task's text."""
    pretokenizer: Literal["words", "bytelevel"] = "bytelevel"
    """"words": whitespace is its own token, so a name is the same tokens after a space,
    a quote or a tag; "bytelevel": GPT-2 style, a word carries its leading space."""
    split_digits: bool = False
    """Every digit its own token (SmolLM2's and Llama's tokenizers do the same): a tiny
    model copies a number digit by digit from ten well-trained tokens, where one token per
    number leaves it hundreds of rare ones to copy."""
    max_positions: int = 1024
    """Longest episode (prompt + turns + tool responses) the model can see."""


DEFAULT_LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
"""The attention and MLP projections of Llama / Qwen / Mistral style models."""


@dataclass(frozen=True)
class LoRAConfig:
    """Low-rank adapters (`agentr1.lora`): train ``B A`` on chosen linear layers, freeze
    every other weight. The KL reference is then the base model with the adapters off (no
    second copy), SFT adapters are merged into the base before RL, and the final model is
    saved merged (a plain model of the same architecture). PPO's critic starts as a copy
    of the adapted backbone: it trains its own adapters and its value head."""

    rank: int = 0
    """Adapter rank r; 0 = no adapters, every weight trains (full fine-tuning)."""
    alpha: float = 16.0
    """Scale numerator: the update is (alpha / rank) B A."""
    targets: list[str] = field(default_factory=lambda: list(DEFAULT_LORA_TARGETS))
    """Last name parts of the linear layers to adapt (Llama / Qwen projections)."""
    share_input: bool = True
    """Adapters of q/k/v (and of gate/up) compute ``x A^T`` as one product, reading their
    common input once: the same function and gradients, less memory traffic (an ablation
    switch; benchmarks/lora_update.py measures both)."""


@dataclass(frozen=True)
class ModelConfig:
    """Which policy to train."""

    path: str = "tiny"
    """"tiny" (build a small Llama + BPE tokenizer on the task's text), a local HF
    directory, a hub id, or "smollm2-135m-instruct"."""
    tiny: TinyModelConfig = field(default_factory=TinyModelConfig)
    """Shape of the tiny model when path = "tiny"."""
    dtype: Literal["float32", "bfloat16"] = "float32"
    """Weights (and optimizer state) dtype of the policy."""
    device: str = "auto"
    """Where the policy, reference, critic and batches live: "auto" (CUDA when available,
    else CPU), "cpu", "cuda" or "cuda:N"."""
    compute_dtype: Literal["float32", "bfloat16", "auto"] = "auto"
    """Matmul dtype of the training passes' backbone (SFT, reference and old log-probs,
    critic, update), by autocast; weights and optimizer state stay in ``dtype``, and the LM
    head and its log-softmax run in the weights' dtype (with the head in bf16 too, a GRPO
    test run's reward plateaued at 0.52 twice where float32 reached 0.64-0.68; with the
    head in float32, 0.63).
    "bfloat16" runs a forward + backward about 2x faster on a CPU with avx512_bf16
    (benchmarks/RESULTS.md); "auto" = bfloat16 where the device computes it natively (a
    CUDA GPU with bf16, a CPU with avx512_bf16 or AMX), else float32 (emulated bf16 is
    slower than float32). The default since 2026-12-07: on an avx512_bf16 CPU the demo's
    six seeds x kernels all pass its EM bar with it, two of the three float32 ones did,
    and its SFT is 1.2-1.35x faster ("The demo on the AVX-512 EPYC" in RESULTS)."""
    sampler_dtype: Literal["same", "bfloat16", "auto"] = "auto"
    """Weights the rollout samples from: "same" = the policy itself; "bfloat16" = a bf16
    copy, refreshed after every weight update (generation about 1.9x faster on CPU). The
    PPO ratio never uses the sampler's log-probs (the trainer computes its own old
    log-probs), so the copy only changes which tokens are sampled; ``logprob_mismatch``
    (off-policy runs) reports how far the sampler is from the trainer. The evaluations
    sample from the same copy. "auto" = "bfloat16" where the device computes it natively
    (as ``compute_dtype``'s "auto"), else "same": emulated bf16 samples slower than
    float32."""
    keep_kv_gib: float = 2.0
    """KV cache the sampler keeps from one turn of an episode to the next, in GiB: a turn
    then prefills only the tool response before it, not the whole history (the oldest
    episodes' caches are dropped beyond it; 0 re-prefills every turn). With the vllm
    backend: the engine's KV cache on a CPU (its prefix cache does this work)."""
    pack_weights_gib: float = 2.0
    """The ``hf`` sampler's decode pass multiplies by packed copies of the model's linear
    weights (q|k|v and gate|up fused, in oneDNN's layout on a CPU; re-made after every
    weight change) when those weights fit in this many GiB: ~1.4x faster matmuls at few
    rows, for their memory once more (`agentr1.backends.decode.WeightPacks`); 0 = never."""
    native_attention: bool = True
    """The ``hf`` sampler's decode pass runs each layer's rotary, KV-cache write and
    attention as one C++ kernel, built on first use with the machine's compiler
    (`agentr1.backends.native`; float32 inside; CPU fp32 / bf16 models): 1.3-2.8x faster
    than the torch ops on one layer. false, no compiler, or ``AGENTR1_NATIVE=0``: torch."""
    native_linear: bool = True
    """In bf16 on a CPU with AMX or AVX512-BF16, the ``hf`` sampler's decode pass
    multiplies by weights packed for a C++ kernel built like ``native_attention``'s, each
    layer's RMSNorms, residual adds and SiLU gate fused into its four products, and
    that pass prefills the prompts too (SmolLM2: decode passes 1.15-1.3x faster than
    with oneDNN's products, prefills 1.1-1.5x faster than transformers' forward; within
    ``pack_weights_gib``). false, another dtype or CPU, no compiler, or
    ``AGENTR1_NATIVE=0``: oneDNN's packs and torch ops."""
    backend: Literal["hf", "vllm", "auto"] = "hf"
    """The rollout engine: "hf" (transformers, in this process), "vllm" (a vLLM engine in
    this process, weights synced after every update, `agentr1.backends.vllm`; needs
    ``pip install vllm`` on a GPU, ``make vllm`` on a CPU), "auto" (vllm where it is
    installed and a GPU is present, else hf). The trainer's own log-probs are unchanged."""
    lora: LoRAConfig = field(default_factory=LoRAConfig)
    """Low-rank adapters instead of full fine-tuning (rank 0 = off)."""
    chat_template: Literal["model", "qwen2.5", "chatml-minimal"] = "chatml-minimal"
    """"model" = the tokenizer's own template; "qwen2.5" = ChatML with the tool listing
    (real instruct models); "chatml-minimal" = ChatML without it (the shortest prompt,
    for tiny models that learn the format from SFT)."""


@dataclass(frozen=True)
class TaskConfig:
    """What the agent is trained on: a task plug-in and the recipe's choices on top of it.

    Every reference below is a registered name or an import path (``my_pkg.mod:name``,
    or a ``.py`` file, looked for next to the recipe first); `agentr1.registry` resolves
    them and an unknown one is refused with the valid names.
    """

    name: str = "world"
    """The task: "world" (the embedded multi-hop world), "multihop_qa" (real multi-hop QA),
    a registered name, an import path to a factory (``my_pkg.tasks:make_task``) or a Python
    file (``units_task.py``, its ``make_task``) (`agentr1.tasks`)."""
    config: dict[str, Any] = field(default_factory=dict)
    """The task's own settings, checked against its factory's config dataclass (an unknown
    field or a bad value names ``task.config.<field>``): `agentr1.tasks.world.WorldTaskConfig`,
    `agentr1.tasks.multihop_qa.QATaskConfig`, or a user task's."""
    tools: list[str | dict[str, Any]] = field(default_factory=list)
    """Replaces the task's tools when not empty: names (``search``, ``calculator``,
    ``python``, ``mcp``), import paths, or ``{name: ..., <option>: ...}`` for a tool factory
    (`agentr1.tools.registry`). A name the task provides (its ``search``) means its own."""
    system_prompt: str | None = None
    """The system message; None = the task's own; "auto" = built from the tools; "" = none."""
    outcome_reward: str = ""
    """Replaces the task's outcome reward when set: em, f1, cover_em, em_format or an import
    path to ``(answer, task) -> float`` (`agentr1.rewards.OUTCOME_REWARDS`)."""
    process: ProcessRewardConfig = field(default_factory=ProcessRewardConfig)
    """The built-in process rewards on tool calls and evidence; `enabled: false` = none."""
    process_rewards: dict[str, float] = field(default_factory=dict)
    """More process rewards, name or import path -> weight, summed per turn:
    valid_call, invalid_call (a count: give it a negative weight), repeated_query (a count),
    new_evidence, evidence_shaping, or ``StepContext -> float`` functions of your own."""


@dataclass(frozen=True)
class SFTConfig:
    """Supervised warm start on the task's scripted demonstrations (same tensors and masks
    as RL; `agentr1.tasks.Demonstrations`)."""

    enabled: bool = True
    """Run the warm start before RL (skipped when resuming)."""
    steps: int = 1500
    """Optimizer steps (warmup and decay scale with them). The demo needs 1,500: with
    1,000 its 2 / 3-hop EM swung with float rounding (an exp rounded an ulp differently
    sent seed 0 from 0.90 / 0.84 to 0.64 / 0.32, and stalled seed 2's SFT at loss 0.10:
    EM 0.14); with 1,500, five of six runs (seeds 0-2, native kernels and torch's ops)
    passed 0.8 on both (`benchmarks/RESULTS.md`, "The demo's SFT at 1,500 steps")."""
    batch_size: int = 16
    """Demonstration episodes per step."""
    lr: float = 3e-3
    """Peak AdamW learning rate (5% linear warmup, then cosine decay to 10%)."""
    demos: int = 3000
    """Demonstration episodes, drawn from the task's demonstration sources (shared out
    evenly between them). The demo needs 3,000: with 1,500 its seed-2 run never learned
    "paternal grandmother" (0 of 15, the 3-hop EM 0.66) and RL could not fix it (every
    sample of a group made the same mistake); with 3,000 seeds 0 / 1 / 2 reach 0.90 /
    0.90 / 0.94 on 3 hops, for ~1.5 s more of demonstrations."""
    checkpoint_every: int = 250
    """SFT steps between checkpoints of the warm start (``checkpoints/sft/``: weights,
    AdamW state, batch order), so a run killed during SFT resumes inside it; 0 = only the
    one when SFT ends. Removed once RL has a checkpoint of its own."""
    context_loss_weight: float = 0.0
    """Weight of a language-modelling loss on the demonstrations' context tokens (the
    question and the search results), added to the loss on the agent's own tokens; 0 =
    train on the agent's tokens only. RL never trains context tokens. It can help a tiny
    model trained from scratch copy what it reads (the two examples set 1.0 for their
    answers' numbers), and it can drown a decision that rests on one token: with 1.0 the
    demo's SFT never learned which relation a grandparent question's second search needs,
    and one run in six failed the EM bar on it ("Kin relations" in `benchmarks/RESULTS.md`)."""


@dataclass(frozen=True)
class AlgoConfig:
    """The RL algorithm: advantage estimator, losses, KL and entropy."""

    estimator: str = "grpo"
    """Advantage estimator: gae (PPO with a critic), grpo, dr_grpo, reinforce_plus_plus,
    reinforce_plus_plus_baseline, rloo."""
    gamma: float = 1.0
    """Discount over agent tokens."""
    lam: float = 1.0
    """GAE lambda."""
    norm_by_std: bool = True
    """GRPO: divide by the group's reward std."""
    clip_low: float = 0.2
    """PPO ratio clip below 1."""
    clip_high: float = 0.28
    """PPO ratio clip above 1 (> clip_low = DAPO clip-higher)."""
    dual_clip: float | None = 3.0
    """Dual-clip constant for negative advantages (None = off)."""
    agg_mode: Literal["token-mean", "seq-mean-token-sum", "seq-mean-token-mean"] = "token-mean"
    """How per-token losses become one scalar."""
    policy_loss: str = "ppo_clip"
    """The policy loss (`agentr1.algorithms.objectives`): ppo_clip (PPO's clipped
    surrogate with clip-higher and the dual clip), or an import path to your own."""
    kl_coef: float = 0.05
    """Weight of the KL to the reference (the warm-started policy; 0 = no reference model).
    With sparse rewards it keeps the policy from drifting off the answer format it was
    warm-started on."""
    kl_mode: str = "k3_loss"
    """Where the KL enters (`agentr1.algorithms.objectives`): k3_loss (k3 as a loss term),
    k2_loss, k1_reward (k1 folded into the token rewards), or an import path to a
    `KLVariant` of your own."""
    k3_linear_above: float | None = 3.0
    """k3_loss: past this log-ratio d = log(pi_ref / pi) of a token, k3 = e^d - d - 1
    continues as its tangent line, so one token the policy has moved far below the
    reference pulls with a gradient of at most e^c - 1 for this value c (19 at 3), not up
    to e^20 (`agentr1.algorithms.kl_penalty`; ``kl_tail_frac`` logs how often). None =
    exact k3."""
    entropy_coef: float = 0.0
    """Entropy bonus weight."""
    value_clip: float | None = 0.2
    """Clip range of the critic's value loss (gae only)."""
    critic_lr: float = 1e-3
    """Critic learning rate (gae only)."""
    critic_warmup_steps: int = 0
    """Steps that train only the critic before the policy moves (gae only)."""
    loss_mask: bool = True
    """Train only on agent-sampled tokens. False is an ablation: tool responses and the
    prompt get trained as if the agent wrote them."""
    advantage_mask: bool = True
    """GAE / returns over agent tokens only. False is an ablation: tool-response tokens
    take part in discounting and bootstrapping."""


@dataclass(frozen=True)
class OptimConfig:
    """Policy optimization."""

    lr: float = 3e-4
    """AdamW learning rate of the policy."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    warmup_steps: int = 0
    """Linear warmup steps."""
    schedule: Literal["constant", "cosine"] = "constant"
    """Learning-rate schedule after warmup."""
    grad_clip: float = 1.0
    """Global gradient-norm clip."""
    ppo_epochs: int = 1
    """Passes over each rollout batch (K)."""
    minibatches: int = 1
    """Optimizer steps per epoch."""
    micro_batch_size: int = 32
    """Most rows per forward/backward (gradient accumulation inside a minibatch); rows are
    ordered by length, or rows that share a prefix together, and cut where that computes
    fewest tokens (`micro_batches` in agentr1/trainer/logprobs.py), so a micro-batch may
    hold fewer."""
    micro_batch_tokens: int = 0
    """Most tokens one forward/backward computes (its rows padded, a prefix its rows
    share counted once), 0 = no cap: what bounds the update's activation memory when
    rows' lengths vary (a multi-turn episode may be 10x another); a row longer than this
    runs alone. Cut with ``micro_batch_size`` by `micro_batches`; FSDP's equal-count
    micro-batches take at most this over the longest row's length rows each."""
    activation_checkpointing: bool = False
    """Recompute each decoder layer's activations during the backward pass instead of
    keeping them from the forward (transformers' gradient checkpointing, non-reentrant):
    the update's peak memory falls to about the layers' inputs, for one more forward pass
    of the policy (SFT and RL updates; sampling is unaffected). TRL's GRPOTrainer turns
    it on by default; `benchmarks/trl_side_by_side.py` measures both."""


@dataclass(frozen=True)
class TrainConfig:
    """The RL loop."""

    steps: int = 120
    """RL steps."""
    tasks_per_step: int = 16
    """Tasks sampled per step (each gets rollout.n_samples episodes)."""
    seed: int = 0
    """Seeds everything: world, model init, sampling, data order."""
    run_dir: str = "runs/demo"
    """Where config, metrics, trajectories, checkpoints, plots and the report go."""
    checkpoint_every: int = 20
    """RL steps between atomic checkpoints, the first after the evaluation before RL
    (step 0); 0 = one checkpoint only, at the end (a run killed before it resumes from
    the end of the warm start, `sft.checkpoint_every`)."""
    keep_checkpoints: int = 2
    """Newest checkpoints kept on disk (>= 1); older ones are deleted once a newer one is
    complete. Each holds the policy and its AdamW state (about 3x the policy's weights in
    fp32), and the critic with GAE. The KL reference is not copied into each: it is the
    base model (rebuilt from ``model.path``) or the warm start, written once as
    ``checkpoints/reference.safetensors``. The summary's ``checkpoint_bytes`` says what
    the last checkpoint took."""
    eval_every: int = 0
    """Steps between evaluations (0 = only before and after)."""
    keep_best: bool = False
    """Also write ``best_model/``: the weights with the highest greedy score of the task's
    headline metric (EM for the built-in tasks; mean over ``eval.splits``) among the evaluations before RL, every ``eval_every`` steps and
    after RL; ties keep the earlier. The step and EM go to the summary as ``best_model``. A model
    chosen on the eval questions needs other questions to be tested on."""
    log_trajectories: int = 1
    """Tasks per step whose groups (all ``rollout.n_samples`` episodes) go to
    trajectories.jsonl with their tokens and, per token, the loss mask, sampled
    log-prob, advantage, PPO ratio and KL (`agentr1.trainer.tokenlog`; the report's
    trajectory viewer, docs/report.md): about 70 bytes a token, and two forward passes
    of those rows a step. 0 = none."""
    log_rollouts: bool = True
    """One line per training episode in rollouts.jsonl (question, gold, answer, EM / F1,
    rewards, the episode's mean advantage; no tokens): which questions moved the policy,
    and how. About 400 bytes an episode."""
    threads: int = 0
    """torch threads (0 = torch's default)."""
    keep_freed_mib: int = 256
    """Freed memory glibc's malloc keeps for reuse, in MiB (process-wide, set when the run
    starts; `agentr1.trainer.setup.keep_freed_memory`): allocations up to 32 MiB come
    from its heaps and up to this much free memory stays mapped, instead of each tensor
    of a few MB being mapped, faulted in page by page and unmapped again (the demo: 7x
    fewer page faults, its update ~8% faster). 0 = glibc's defaults; no effect with
    another C library."""


@dataclass(frozen=True)
class EvalConfig:
    """Evaluation before and after RL."""

    splits: tuple[str, ...] = ()
    """Task splits to evaluate; empty = the task's evaluation splits (the embedded world:
    test and test_ood)."""
    max_tasks: int = 0
    """Tasks per split (0 = all)."""
    sampled_n: int = 1
    """Sampled episodes per task for sampled EM (greedy is always 1; 0 = greedy only)."""
    before: bool = True
    """Evaluate before RL too. Off for RL runs that start from an already evaluated
    checkpoint (e.g. one warm start shared by several algorithms)."""
    temperature: float = 1.0
    """Temperature of sampled evaluation."""
    log_trajectories: int = 4
    """Greedy episodes per split of each evaluation written to trajectories.jsonl, with
    their tokens (the report's viewer); 0 = none."""
    batch_tasks: int = 64
    """Questions generated together. Larger is faster until memory runs out: the KV cache
    and attention buffers grow with ``batch_tasks x rollout.max_context``."""


TRACKERS: dict[str, tuple[str, str]] = {
    "tensorboard": ("tensorboard", "tensorboard"),
    "wandb": ("wandb", "wandb"),
    "mlflow": ("mlflow", "mlflow"),
}
"""Experiment trackers `LogConfig.trackers` may name: name -> (module, the extra that
installs it: ``pip install 'agentr1[<extra>]'``, or ``make trackers`` for all three)."""


@dataclass(frozen=True)
class LogConfig:
    """Experiment trackers fed by the run besides the files of its run directory
    (`agentr1.trackers`); each is an optional extra, imported only when chosen."""

    trackers: tuple[str, ...] = ()
    """Any of ``tensorboard``, ``wandb``, ``mlflow``; empty = the run directory's files
    only. Every tracker gets the same scalars (keys ``<phase>/<metric>``), evaluation
    tables, sample trajectories as text and the config."""
    project: str = "agentr1"
    """The W&B project / MLflow experiment the run goes to."""
    run_name: str = ""
    """The run's name in the trackers; empty = the run directory's name."""
    tracker_dir: str = ""
    """Where the trackers write; empty = inside the run directory: ``tb/`` (TensorBoard
    event files), ``wandb/`` (W&B's run folder; ``WANDB_MODE=offline`` keeps it
    there), ``mlflow.db`` and ``mlruns/`` (MLflow's SQLite store and its artifacts)."""


@dataclass(frozen=True)
class DistributedConfig:
    """Where a run's work goes when it outgrows one process (docs/distributed.md): rollout
    workers and trainer ranks as Ray actors. The defaults keep everything in this process
    (Ray is then never imported)."""

    rollout_workers: int = 0
    """Ray actors that sample episodes, each with its own generator (``model.backend``)
    and envs; 0 = the rollout runs in this process."""
    trainer_ranks: int = 1
    """Data-parallel trainer ranks (this process is rank 0; the others are Ray actors
    joined by ``torch.distributed``): each computes the gradient of its share of every
    minibatch, summed over ranks, so the update is the one-process update."""
    address: str = ""
    """The Ray cluster: empty = start a local one in this process; ``auto`` = the one
    ``ray start`` runs on this machine; ``HOST:PORT`` = the head of a running cluster."""
    num_cpus: int = 0
    """CPUs a local cluster offers (0 = Ray's own count); ignored when joining one."""
    cpus_per_worker: float = 1.0
    """CPUs Ray reserves for each rollout worker and trainer rank."""
    gpus_per_worker: float = 0.0
    """GPUs Ray reserves for each rollout worker and trainer rank (0 on a CPU cluster)."""
    worker_threads: int = 0
    """torch threads inside each actor (0 = ``cpus_per_worker`` rounded up)."""
    tool_actors: int = 0
    """Tool calls of the rollout run in a pool of this many Ray actors (0 = in the
    rollout's own process, with the tool's ``isolation``)."""
    rollout_chunks: int = 2
    """A step's task groups are cut into this many generate calls per rollout worker:
    more balance the load better (the next call goes to the least loaded worker), fewer
    batch more episodes into each call."""
    restarts: int = 3
    """How many times one step replaces a rollout worker whose process died before the
    step fails."""
    sharding: str = "ddp"
    """How trainer ranks hold the training state: ``ddp`` = each a whole replica
    (weights, gradients, AdamW moments), the gradients summed after the backward;
    ``fsdp`` = each a shard of them (FSDP2, every decoder layer gathered for its pass),
    for a model whose training state does not fit one device. The same update either way
    (docs/distributed.md)."""
    timeout_s: float = 600.0
    """How long a trainer rank's collective (a gradient sum, the process group's start)
    waits for the other ranks: a rank that hangs fails the update after this, named.
    Longer than the slowest rank's share of one minibatch."""


@dataclass(frozen=True)
class AsyncConfig:
    """Asynchronous rollouts (docs/distributed.md): rollout workers sample the next
    batches while the trainer updates on this one."""

    max_staleness: int = 0
    """k: a batch is trained only if every token was sampled by weights at most k
    versions old. 0 = the synchronous loop, exactly."""
    is_cap: float = 2.0
    """The cap C of the truncated importance weight min(pi_old / pi_behaviour, C) that
    corrects a stale batch's policy loss (used when ``max_staleness > 0``)."""


@dataclass(frozen=True)
class Config:
    """A whole run: one typed section per stage (model, task, rollout, sft, algo, optim,
    train, eval, log, distributed, async), every field documented where it is declared.

    Build it with `load_config` (a YAML recipe plus ``section.field=value`` overrides,
    checked once) or in Python, ``dataclasses.replace(load_config(None), ...)``; call
    `validate` on one built by hand. A run never changes its config.
    """

    model: ModelConfig = field(default_factory=ModelConfig)
    task: TaskConfig = field(default_factory=TaskConfig)
    rollout: RolloutConfig = field(
        default_factory=lambda: RolloutConfig(
            n_samples=8,
            max_turns=5,
            max_tokens_per_turn=48,
            max_context=768,
        )
    )
    sft: SFTConfig = field(default_factory=SFTConfig)
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    log: LogConfig = field(default_factory=LogConfig)
    distributed: DistributedConfig = field(default_factory=DistributedConfig)
    async_: AsyncConfig = field(default_factory=AsyncConfig)
    """The recipe's ``async`` section (a Python keyword, hence the underscore here)."""

    def validate(self) -> None:
        """Check values once; each message says what is wrong and why it matters."""
        errors: list[str] = []
        a, o, r, t = self.algo, self.optim, self.rollout, self.train
        for key, getter in (
            ("estimator", get_advantage),
            ("policy_loss", get_policy_loss),
            ("kl_mode", get_kl_variant),
        ):
            try:
                getter(getattr(a, key))
            except (ValueError, TypeError) as e:
                errors.append(f"algo.{key}: {e}")
        group_based = {"grpo", "dr_grpo", "rloo", "reinforce_plus_plus_baseline"}
        if a.estimator in group_based and r.n_samples < 2:
            errors.append(
                f"rollout.n_samples={r.n_samples} with {a.estimator}: group baselines need "
                ">= 2 samples per task, else every advantage is 0 and nothing is learned"
            )
        if not 0 <= a.gamma <= 1 or not 0 <= a.lam <= 1:
            errors.append("algo.gamma and algo.lam must be in [0, 1]: they are discounts")
        if a.kl_coef < 0 or a.entropy_coef < 0:
            errors.append("algo.kl_coef and algo.entropy_coef must be >= 0")
        if a.k3_linear_above is not None and not a.k3_linear_above > 0:
            errors.append(f"algo.k3_linear_above={a.k3_linear_above} must be > 0 or null")
        if not self.model.path.strip():
            errors.append(
                'model.path is empty: give "tiny", a local model directory, a hub id or '
                '"smollm2-135m-instruct"'
            )
        if self.sft.checkpoint_every < 0 or t.checkpoint_every < 0:
            errors.append("sft.checkpoint_every and train.checkpoint_every must be >= 0")
        if t.keep_checkpoints < 1:
            errors.append(
                f"train.keep_checkpoints={t.keep_checkpoints}: must be >= 1 (resume needs one)"
            )
        if not 0 < o.lr <= 1:  # also refuses NaN, which every comparison fails
            errors.append(f"optim.lr={o.lr}: must be in (0, 1]; larger steps destroy the model")
        if not o.grad_clip > 0:
            errors.append(
                f"optim.grad_clip={o.grad_clip}: must be > 0 (a gradient-norm bound; a "
                "negative one would reverse the gradient)"
            )
        if o.ppo_epochs < 1 or o.minibatches < 1 or o.micro_batch_size < 1:
            errors.append("optim.ppo_epochs, minibatches and micro_batch_size must be >= 1")
        if o.micro_batch_tokens < 0:
            errors.append(
                f"optim.micro_batch_tokens={o.micro_batch_tokens}: expected >= 0 (0 = no cap)"
            )
        rows = t.tasks_per_step * r.n_samples
        if o.minibatches > rows:
            errors.append(
                f"optim.minibatches={o.minibatches} > rows per step ({rows}): empty minibatches"
            )
        if t.steps < 0 or t.tasks_per_step < 1:
            errors.append("train.steps must be >= 0 and train.tasks_per_step >= 1")
        if t.keep_freed_mib < 0:
            errors.append("train.keep_freed_mib must be >= 0 (0 = glibc's malloc defaults)")
        if self.model.path == "tiny" and r.max_context > self.model.tiny.max_positions:
            errors.append(
                f"rollout.max_context={r.max_context} > model.tiny.max_positions="
                f"{self.model.tiny.max_positions}: episodes would overflow the position table"
            )
        tm = self.model.tiny
        if tm.hidden_size % tm.heads:
            errors.append(
                f"model.tiny.hidden_size={tm.hidden_size} must divide by heads={tm.heads}"
            )
        if self.train.keep_best and self.train.eval_every < 1:
            errors.append(
                "train.keep_best needs train.eval_every >= 1: the best model is chosen among "
                "the evaluations every eval_every steps"
            )
        if self.eval.sampled_n < 0:
            errors.append("eval.sampled_n must be >= 0 (0 = greedy evaluation only)")
        if t.log_trajectories < 0 or self.eval.log_trajectories < 0:
            errors.append(
                "train.log_trajectories and eval.log_trajectories must be >= 0 (0 = none)"
            )
        if self.eval.batch_tasks < 1:
            errors.append("eval.batch_tasks must be >= 1 (questions generated together)")
        if self.sft.context_loss_weight < 0:
            errors.append(
                "sft.context_loss_weight must be >= 0: a negative weight would train the model "
                "to *unlearn* the text it reads"
            )
        if self.model.backend == "vllm" and importlib.util.find_spec("vllm") is None:
            from agentr1.backends.vllm import INSTALL

            errors.append(f"model.backend=vllm: vLLM is not installed here; {INSTALL}")
        if self.model.pack_weights_gib < 0:
            errors.append(
                f"model.pack_weights_gib={self.model.pack_weights_gib}: expected >= 0 "
                "(0 packs no weights)"
            )
        if self.model.keep_kv_gib < 0:
            errors.append(
                f"model.keep_kv_gib={self.model.keep_kv_gib}: expected >= 0 (0 keeps no cache)"
            )
        lora = self.model.lora
        if lora.rank < 0 or lora.alpha <= 0:
            errors.append(
                f"model.lora.rank={lora.rank}, alpha={lora.alpha}: expected rank >= 0 "
                "(0 = full fine-tuning) and alpha > 0"
            )
        if lora.rank and not lora.targets:
            errors.append("model.lora.targets is empty: name the linear layers to adapt")
        if self.task.process.no_answer < 0:
            errors.append(
                f"task.process.no_answer={self.task.process.no_answer}: expected >= 0 (a "
                "penalty, subtracted); a negative one would pay the policy not to answer"
            )
        errors.extend(self.log_errors())
        errors.extend(self.distributed_errors())
        errors.extend(self._task_errors())
        if errors:
            raise configutil.ConfigError("invalid config:\n  - " + "\n  - ".join(errors))

    def log_errors(self) -> list[str]:
        """Each tracker in ``log.trackers`` is known and its package installed (looked up,
        not imported): a run should not train for an hour and then fail to log."""
        errors = []
        for name in self.log.trackers:
            if name not in TRACKERS:
                errors.append(
                    f"log.trackers: unknown tracker {name!r}; expected any of "
                    + ", ".join(TRACKERS)
                )
            elif importlib.util.find_spec(TRACKERS[name][0]) is None:
                extra = TRACKERS[name][1]
                errors.append(
                    f"log.trackers: {name} is not installed here; pip install "
                    f"'agentr1[{extra}]' (or `make trackers` for all three)"
                )
        if len(set(self.log.trackers)) != len(self.log.trackers):
            errors.append(f"log.trackers={list(self.log.trackers)}: a tracker named twice")
        return errors

    def distributed_errors(self) -> list[str]:
        """The ``distributed`` and ``async`` sections make sense, and Ray is installed
        when they ask for it (looked up, not imported)."""
        d, a = self.distributed, self.async_
        errors = []
        if d.rollout_workers < 0 or d.trainer_ranks < 1 or d.restarts < 0:
            errors.append(
                f"distributed.rollout_workers={d.rollout_workers}, trainer_ranks="
                f"{d.trainer_ranks}, restarts={d.restarts}: expected >= 0, >= 1 and >= 0"
            )
        if d.tool_actors < 0 or d.num_cpus < 0 or d.worker_threads < 0 or d.rollout_chunks < 1:
            errors.append(
                "distributed.tool_actors, num_cpus and worker_threads must be >= 0, "
                "rollout_chunks >= 1"
            )
        if not d.cpus_per_worker > 0 or d.gpus_per_worker < 0:
            errors.append("distributed.cpus_per_worker must be > 0 and gpus_per_worker >= 0")
        if d.sharding not in ("ddp", "fsdp"):
            errors.append(f"distributed.sharding={d.sharding!r}: expected ddp or fsdp")
        rows = self.train.tasks_per_step * self.rollout.n_samples // max(1, self.optim.minibatches)
        if d.sharding == "fsdp" and not 1 < d.trainer_ranks <= rows:
            errors.append(
                f"distributed.sharding=fsdp needs 2 <= trainer_ranks <= the rows of a minibatch "
                f"({rows}), got trainer_ranks={d.trainer_ranks}: every rank runs every pass"
            )
        if not d.timeout_s > 0:
            errors.append(
                f"distributed.timeout_s={d.timeout_s}: must be > 0 (0 would fail every collective)"
            )
        if a.max_staleness < 0 or not a.is_cap >= 1:
            errors.append(
                f"async.max_staleness={a.max_staleness}, is_cap={a.is_cap}: expected k >= 0 "
                "and a cap >= 1 (a cap below 1 would down-weight even fresh tokens)"
            )
        if a.max_staleness and not d.rollout_workers:
            errors.append(
                f"async.max_staleness={a.max_staleness} needs distributed.rollout_workers >= 1:"
                " asynchronous rollouts are sampled by workers while this process trains"
            )
        uses_ray = d.rollout_workers or d.trainer_ranks > 1 or d.tool_actors or d.address
        if uses_ray and importlib.util.find_spec("ray") is None:
            errors.append(
                "distributed: Ray is not installed here; pip install 'agentr1[ray]' (or `make ray`)"
            )
        return errors

    def _task_errors(self) -> list[str]:
        """The task reference, its config section and the rewards it names resolve."""
        from agentr1.rewards import outcome_reward, weighted_process_reward
        from agentr1.tasks.registry import resolve_task

        errors = []
        try:
            resolve_task(self.task.name).config(self.task.config)
        except ValueError as e:
            errors.append(str(e) if str(e).startswith("task.") else f"task.name: {e}")
        if self.task.outcome_reward:
            try:
                outcome_reward(self.task.outcome_reward)
            except ValueError as e:
                errors.append(f"task.outcome_reward: {e}")
        bad = {k: v for k, v in self.task.process_rewards.items() if not _is_number(v)}
        if bad:
            errors.append(f"task.process_rewards: weights must be numbers, got {bad}")
        else:
            try:
                weighted_process_reward(self.task.process_rewards)
            except ValueError as e:
                errors.append(f"task.process_rewards: {e}")
        return errors


def _is_number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> Config:
    """Load and validate a recipe (YAML) with ``section.field=value`` overrides.

    Relative ``.py`` file references (``task.name: units.py``, a tool, a reward, an
    estimator) are made absolute when the file is next to the recipe, so the run's
    ``config.yaml`` still finds them. ``task.config`` comes back complete: the task's
    config dataclass with every default filled in.
    """
    base = Path(path).resolve().parent if path is not None else None
    cfg = configutil.load(Config, path, overrides)
    if base is not None:
        cfg = anchor_file_refs(cfg, base)
    cfg.validate()
    return with_task_defaults(cfg)


def with_task_defaults(cfg: Config) -> Config:
    """``cfg`` with ``task.config`` as the task's full config (every field, defaults in)."""
    from agentr1.tasks.registry import resolve_task

    typed = resolve_task(cfg.task.name).config(cfg.task.config)
    full = configutil.to_dict(typed) if typed is not None else {}
    return dataclasses.replace(cfg, task=dataclasses.replace(cfg.task, config=full))


def _anchor(ref: str, base: Path) -> str:
    """``ref`` with a relative ``.py`` file next to ``base`` made absolute (else as is)."""
    from agentr1.registry import split_file_ref

    file_ref = split_file_ref(ref)
    if file_ref is None or Path(file_ref[0]).is_absolute() or not (base / file_ref[0]).is_file():
        return ref
    file, attr = file_ref
    return str((base / file).resolve()) + (f":{attr}" if attr else "")


def anchor_file_refs(cfg: Config, base: Path) -> Config:
    """`load_config`'s anchoring of relative file references at the recipe's folder."""
    t = cfg.task
    tools = [
        {**e, "name": _anchor(str(e.get("name", "")), base)}
        if isinstance(e, dict)
        else _anchor(e, base)
        for e in t.tools
    ]
    task = dataclasses.replace(
        t,
        name=_anchor(t.name, base),
        tools=tools,
        outcome_reward=_anchor(t.outcome_reward, base) if t.outcome_reward else "",
        process_rewards={_anchor(k, base): v for k, v in t.process_rewards.items()},
    )
    a = cfg.algo
    algo = dataclasses.replace(
        a,
        estimator=_anchor(a.estimator, base),
        policy_loss=_anchor(a.policy_loss, base),
        kl_mode=_anchor(a.kl_mode, base),
    )
    return dataclasses.replace(cfg, task=task, algo=algo)

"""The run configuration: one typed dataclass per stage, composed into `Config`.

Load a recipe with `load_config("recipes/demo.yaml", ["algo.estimator=ppo", ...])`; every
key and type is checked, then `Config.validate` checks the values once, at the entry
point, saying why a bad value would hurt. Nothing mutates a config after that.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from agentr1 import configutil
from agentr1.algorithms.registry import advantage_names
from agentr1.envs.world import WorldConfig
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
    compute_dtype: Literal["float32", "bfloat16"] = "float32"
    """Matmul dtype of the training passes (SFT, reference and old log-probs, critic,
    update), by autocast; weights and optimizer state stay in ``dtype``. "bfloat16" runs a
    forward + backward about 2x faster on a CPU with avx512_bf16 (benchmarks/RESULTS.md)."""
    sampler_dtype: Literal["same", "bfloat16"] = "same"
    """Weights the rollout samples from: "same" = the policy itself; "bfloat16" = a bf16
    copy, refreshed after every weight update (generation about 1.9x faster on CPU). The
    PPO ratio never uses the sampler's log-probs (the trainer computes its own old
    log-probs), so the copy only changes which tokens are sampled; ``logprob_mismatch``
    (off-policy runs) reports how far the sampler is from the trainer."""
    keep_kv_gib: float = 2.0
    """KV cache the sampler keeps from one turn of an episode to the next, in GiB: a turn
    then prefills only the tool response before it, not the whole history (the oldest
    episodes' caches are dropped beyond it; 0 re-prefills every turn)."""
    lora: LoRAConfig = field(default_factory=LoRAConfig)
    """Low-rank adapters instead of full fine-tuning (rank 0 = off)."""
    chat_template: Literal["model", "qwen2.5", "chatml-minimal"] = "chatml-minimal"
    """"model" = the tokenizer's own template; "qwen2.5" = ChatML with the tool listing
    (real instruct models); "chatml-minimal" = ChatML without it (the shortest prompt,
    for tiny models that learn the format from SFT)."""


QA_TRAIN_FILES = (
    "hotpotqa/hipporag_hotpotqa_train_100.json",
    "hotpotqa/rpt_hotpotqa_devsplit_train_300.jsonl",
    "hotpotqa/rpt_hotpotqa_devsplit_dev_300.jsonl",
    "2wikimultihopqa/migres_2wiki_train_500_decomposed.json",
)
"""Default training questions: every HotpotQA and 2Wiki file with context paragraphs except
the HotpotQA eval file (RPT's files come from HotpotQA dev: the questions they share with
the eval set are dropped from training; the 2Wiki file is shared with its eval split)."""

QA_EVAL_FILES = {
    "hotpotqa": ["hotpotqa/ircot_hotpotqa_dev_subsampled_500.jsonl"],
    "2wiki": ["2wikimultihopqa/migres_2wiki_train_500_decomposed.json"],
    "musique": ["musique/migres_musique_dev_200.jsonl"],
}
"""Default eval splits: HotpotQA dev (IRCoT), a held-out part of 2Wiki (MIGRES; no 2Wiki dev
file with context ships here) and MuSiQue dev (MIGRES, out of domain)."""


@dataclass(frozen=True)
class QAConfig:
    """Real multi-hop QA data (task.kind = "qa"): questions, splits, corpus, retriever.

    File entries are resolved in order as: an existing path; a path under ``data_dir``; a
    dataset folder name under ``data_dir`` (every file of it with context paragraphs).
    """

    train: list[str] = field(default_factory=lambda: list(QA_TRAIN_FILES))
    """Training question files or dataset names. Every question that is in an eval split
    (same id or same normalized question) is removed from training."""
    eval: dict[str, list[str]] = field(default_factory=dict)
    """Eval split name -> question files or dataset names; empty = `QA_EVAL_FILES`. (Empty,
    not a filled default: a recipe's mapping replaces the default splits instead of being
    merged into them.) A file may also be a training file: its eval questions are held out
    and the rest train."""
    n_train: int = 0
    """Training questions kept (a seeded sample; 0 = all)."""
    n_eval: int = 100
    """Questions per eval split (a seeded sample; 0 = all). Selected before training is
    filtered, so a file shared with training gives n_eval questions to eval."""
    corpus: Literal["contexts", "contexts+wiki"] = "contexts"
    """"contexts" = every context paragraph of every loaded question file (train and eval,
    all records, so the corpus does not change with n_train / n_eval); "contexts+wiki" adds
    the Wikipedia files under ``data_dir/wikipedia`` as distractors."""
    retriever: str = "bm25"
    """"bm25", "dense" (all-MiniLM-L6-v2), "hybrid" (RRF of both) or the http:// URL of an
    ``agentr1 serve retriever`` (which then holds the corpus)."""
    split_seed: int = 0
    """Seed of the eval and training samples (an id-hash order, independent of file order)."""
    data_dir: str = ""
    """Root of the raw data; "" = ``$AGENTR1_DATA`` or ``../shared/data/raw``."""

    @property
    def eval_files(self) -> dict[str, list[str]]:
        """The eval splits in effect: ``eval``, or `QA_EVAL_FILES` when it is empty."""
        return self.eval or {k: list(v) for k, v in QA_EVAL_FILES.items()}

    def validate(self) -> None:
        """Raise ValueError listing every bad value."""
        errors = []
        if not self.train:
            errors.append("train: at least one training file is needed")
        for name, files in self.eval_files.items():
            if (
                not isinstance(files, list)
                or not files
                or not all(isinstance(f, str) for f in files)
            ):
                errors.append(f"eval.{name}: expected a non-empty list of files, got {files!r}")
        if self.n_train < 0 or self.n_eval < 0:
            errors.append("n_train and n_eval must be >= 0 (0 = all)")
        kinds = ("bm25", "dense", "hybrid")
        if self.retriever not in kinds and not self.retriever.startswith(("http://", "https://")):
            errors.append(
                f"retriever={self.retriever!r}: use one of {', '.join(kinds)} or an http:// URL"
            )
        if errors:
            raise ValueError("; ".join(errors))


@dataclass(frozen=True)
class TaskConfig:
    """What the agent is trained on."""

    kind: Literal["world", "qa"] = "world"
    """"world" = the embedded fictional multi-hop world; "qa" = real multi-hop QA (`qa`)."""
    world: WorldConfig = field(default_factory=lambda: WorldConfig(ood_types=("comparison",)))
    """World generator settings (kind = "world"). The demo holds comparison questions out
    of training ("Who was born first, A or B?" needs comparing numbers, a skill the other
    types never use) and tests them, with the 4-hop questions, as test_ood."""
    qa: QAConfig = field(default_factory=QAConfig)
    """Data, splits, corpus and retriever (kind = "qa")."""
    top_k: int = 1
    """Passages the search tool returns per call."""
    passage_words: int = 0
    """Words kept of each passage's text in a search result; 0 = the whole passage. The
    real corpus's passages average ~130 tokens (p99 ~380), so two long ones can fill a
    small context; 80 words keep the answer string of 95% of supporting passages."""
    system_prompt: str | None = None
    """System message; None = none for "world" (a tiny model learns the format from SFT),
    `agentr1.envs.qa_env.QA_SYSTEM_PROMPT` for "qa"."""
    outcome_reward: Literal["em", "f1", "cover_em", "em_format"] = "em"
    """Outcome reward; "em" equals the evaluation metric."""
    process: ProcessRewardConfig = field(default_factory=ProcessRewardConfig)
    """Process rewards; `enabled: false` = outcome-only."""


@dataclass(frozen=True)
class SFTConfig:
    """Supervised warm start on scripted demonstrations (same tensors and masks as RL)."""

    enabled: bool = True
    """Run the warm start before RL (skipped when resuming)."""
    steps: int = 1000
    """Optimizer steps."""
    batch_size: int = 16
    """Demonstration episodes per step."""
    lr: float = 3e-3
    """Peak AdamW learning rate (5% linear warmup, then cosine decay to 10%)."""
    demos: int = 1500
    """Demonstration episodes generated from training tasks."""
    demo_worlds: int = 4
    """Demonstrations come from this many other worlds (same word pools, other seeds, so
    other facts); 0 = from the task's own training questions. Facts a tiny model cannot
    memorize force it to learn to read its search results, which is what transfers."""
    own_world_demos: bool = True
    """Also demonstrate on the task world's own training questions (one more source,
    sharing `demos` evenly). Its names then occur in SFT text: a name the model has never
    seen is a rare token that it copies poorly ("country of Silanor" for any city)."""
    early_answer_prob: float = 0.6
    """Fraction of multi-hop demonstrations that answer after the first search (so the
    warm-started policy is imperfect and RL has something to fix)."""
    context_loss_weight: float = 1.0
    """Weight of a language-modelling loss on the demonstrations' context tokens (the
    question and the search results), added to the loss on the agent's own tokens. A tiny
    model trained from scratch learns to copy names from text this way (names recur in
    every passage); 0 = train on the agent's tokens only. RL never trains context tokens."""
    notes: bool = False
    """Demonstrations restate each fact they read ("X has father Y.") before their next
    call or answer: a scratchpad the agent can copy from. With one-fact passages (the
    world's default) they are not needed and cost tokens (benchmarks/RESULTS.md)."""


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
    kl_coef: float = 0.05
    """Weight of the KL to the reference (the warm-started policy; 0 = no reference model).
    With sparse rewards it keeps the policy from drifting off the answer format (without
    it the demo's policy collapsed to `no_tool_call` after ~60 steps, benchmarks/RESULTS.md)."""
    kl_mode: Literal["k1_reward", "k3_loss"] = "k3_loss"
    """k1 folded into token rewards, or k3 as a loss term."""
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
    """Rows per forward/backward (gradient accumulation inside a minibatch)."""


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
    """Steps between atomic checkpoints (0 = only at the end)."""
    eval_every: int = 0
    """Steps between evaluations (0 = only before and after)."""
    keep_best: bool = False
    """Also write ``best_model/``: the weights with the highest greedy EM (mean over
    ``eval.splits``) among the evaluations before RL, every ``eval_every`` steps and
    after RL; ties keep the earlier. The step and EM go to the summary as ``best_model``. A model
    chosen on the eval questions needs other questions to be tested on."""
    log_trajectories: int = 2
    """Sampled trajectories written to trajectories.jsonl per step."""
    log_rollouts: bool = True
    """One line per training episode in rollouts.jsonl (question, gold, answer, EM / F1,
    rewards, the episode's mean advantage; no tokens): which questions moved the policy,
    and how. About 400 bytes an episode."""
    threads: int = 0
    """torch threads (0 = torch's default)."""


@dataclass(frozen=True)
class EvalConfig:
    """Evaluation before and after RL."""

    splits: tuple[str, ...] = ("test", "test_ood")
    """Task splits to evaluate."""
    max_tasks: int = 0
    """Tasks per split (0 = all)."""
    sampled_n: int = 1
    """Sampled episodes per task for sampled EM (greedy is always 1; 0 = greedy only)."""
    before: bool = True
    """Evaluate before RL too. Off for RL runs that start from an already evaluated
    checkpoint (e.g. one warm start shared by several algorithms)."""
    temperature: float = 1.0
    """Temperature of sampled evaluation."""
    batch_tasks: int = 64
    """Questions generated together. Larger is faster until memory runs out: the KV cache
    and attention buffers grow with ``batch_tasks x rollout.max_context``."""


@dataclass(frozen=True)
class Config:
    """A whole run."""

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

    def validate(self) -> None:
        """Check values once; each message says what is wrong and why it matters."""
        errors: list[str] = []
        a, o, r, t = self.algo, self.optim, self.rollout, self.train
        names = advantage_names()
        if a.estimator not in names:
            errors.append(f"algo.estimator={a.estimator!r} is unknown; valid: {', '.join(names)}")
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
        if o.lr <= 0 or o.lr > 1:
            errors.append(f"optim.lr={o.lr}: must be in (0, 1]; larger steps destroy the model")
        if o.ppo_epochs < 1 or o.minibatches < 1 or o.micro_batch_size < 1:
            errors.append("optim.ppo_epochs, minibatches and micro_batch_size must be >= 1")
        rows = t.tasks_per_step * r.n_samples
        if o.minibatches > rows:
            errors.append(
                f"optim.minibatches={o.minibatches} > rows per step ({rows}): empty minibatches"
            )
        if t.steps < 0 or t.tasks_per_step < 1:
            errors.append("train.steps must be >= 0 and train.tasks_per_step >= 1")
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
        if self.sft.demo_worlds < 0:
            errors.append("sft.demo_worlds must be >= 0 (0 = the task's own questions)")
        if not 0 <= self.sft.early_answer_prob <= 1:
            errors.append("sft.early_answer_prob is a probability: it must be in [0, 1]")
        if self.train.keep_best and self.train.eval_every < 1:
            errors.append(
                "train.keep_best needs train.eval_every >= 1: the best model is chosen among "
                "the evaluations every eval_every steps"
            )
        if self.eval.sampled_n < 0:
            errors.append("eval.sampled_n must be >= 0 (0 = greedy evaluation only)")
        if self.eval.batch_tasks < 1:
            errors.append("eval.batch_tasks must be >= 1 (questions generated together)")
        if self.sft.context_loss_weight < 0:
            errors.append(
                "sft.context_loss_weight must be >= 0: a negative weight would train the model "
                "to *unlearn* the text it reads"
            )
        if self.task.top_k < 1:
            errors.append("task.top_k must be >= 1: a search that returns nothing teaches nothing")
        if self.task.passage_words < 0:
            errors.append(
                f"task.passage_words={self.task.passage_words}: expected >= 0 (0 = whole passages)"
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
        try:
            self.task.world.validate()
        except ValueError as e:
            errors.append(f"task.world: {e}")
        if self.task.kind == "qa":
            errors.extend(self._qa_errors())
        if errors:
            raise configutil.ConfigError("invalid config:\n  - " + "\n  - ".join(errors))

    def _qa_errors(self) -> list[str]:
        """Checks that only apply to task.kind = "qa"."""
        errors = []
        try:
            self.task.qa.validate()
        except ValueError as e:
            errors.append(f"task.qa: {e}")
        if self.model.path == "tiny":
            errors.append(
                'model.path="tiny" with task.kind="qa": the tiny model\'s tokenizer is built '
                "for the world's text; give a model directory, hub id or smollm2-135m-instruct"
            )
        splits = self.task.qa.eval_files
        unknown = [s for s in self.eval.splits if s not in splits]
        if unknown:
            errors.append(
                f"eval.splits {unknown} are not task.qa.eval splits "
                f"({', '.join(splits)}): nothing would be evaluated on them"
            )
        return errors


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> Config:
    """Load and validate a recipe (YAML) with ``section.field=value`` overrides."""
    cfg = configutil.load(Config, path, overrides)
    cfg.validate()
    return cfg

"""Wire a `Config` and a task into the parts a run needs: the task, its env factory, the
tokenizer, the policy, the chat format and the generator. The only place (with the CLI)
that knows every layer; it knows tasks only through `agentr1.tasks.TaskSpec`."""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from agentr1 import configutil, lora
from agentr1.backends.attention import use_decode_sdpa
from agentr1.backends.base import Generator
from agentr1.backends.hf import HFGenerator
from agentr1.config import Config
from agentr1.envs.base import ToolEnv
from agentr1.rollout.chat import ChatFormat
from agentr1.tasks import TaskContext, TaskSpec, build_task, policy_generator
from agentr1.templates import CHATML_TOOLS_MINIMAL, QWEN25_TOOLS
from agentr1.types import Task

log = logging.getLogger(__name__)

TEMPLATES = {"qwen2.5": QWEN25_TOOLS, "chatml-minimal": CHATML_TOOLS_MINIMAL, "model": None}

DemoSource = tuple[list[Task], Callable[[], ToolEnv], Any]
"""(tasks, env factory, scripted generator) of one demonstration source."""


@dataclass
class Setup:
    """Everything a run is made of (built once per process).

    Attributes:
        cfg: the run's config.
        task: the task (`TaskSpec`), with the recipe's overrides applied.
        make_env: one env per episode: the task's tools, rewards, metrics and system
            prompt (an "auto" prompt lists the tools unless the chat template renders them).
        tokenizer, chat, policy, generator, pad_id: the model side.
        model_dir: where the policy was loaded from.
    """

    cfg: Config
    task: TaskSpec
    make_env: Callable[[], ToolEnv]
    tokenizer: Any
    chat: ChatFormat
    policy: Any
    generator: Generator
    pad_id: int
    model_dir: Path
    given_task: TaskSpec | None = None
    """The task when it was given in Python (rollout workers get it as it is; else they
    build the one ``cfg.task`` names)."""

    @property
    def tasks(self) -> Any:
        """The task's splits (`TaskSpec.splits` itself: changing it changes the run's)."""
        return self.task.splits

    @property
    def sampler_is_policy(self) -> bool:
        """Whether the generator samples from the policy's own weights (not a copy)."""
        return getattr(self.generator, "model", None) is self.policy

    def sync_sampler(self) -> None:
        """Copy the policy's weights into the sampler's copy or engine (no-op when they
        are shared). Call after every change to the policy's weights."""
        if self.sampler_is_policy:
            return
        load_sampler_weights(self.generator, lora.merged_state_dict(self.policy))

    def demo_sources(self, seed: int) -> list[DemoSource]:
        """(tasks, env factory, scripted generator) per demonstration source of the task.

        Raises:
            ValueError: the task gives no demonstrations.
        """
        if self.task.demonstrations is None:
            raise ValueError(
                f"sft.enabled: task {self.task.name!r} gives no demonstrations "
                "(TaskSpec.demonstrations); set sft.enabled=false or give it a scripted policy"
            )
        out: list[DemoSource] = []
        for d in self.task.demonstrations(seed):
            env = self.make_env if d.tools is None else self.task.env_factory(d.tools, self.listed)
            out.append((list(d.tasks), env, policy_generator(d.policy, d.tasks, self.chat)))
        if not out:
            raise ValueError(f"sft.enabled: task {self.task.name!r} gave no demonstration source")
        return out

    @property
    def listed(self) -> bool:
        """Whether an "auto" system prompt lists the tools (the template does not)."""
        return not self.chat.renders_tools

    def eval_splits(self) -> list[str]:
        """``eval.splits``, or the task's evaluation splits when it is empty."""
        return list(self.cfg.eval.splits) or self.task.default_eval_splits


def load_sampler_weights(generator: Generator, weights: dict[str, torch.Tensor]) -> None:
    """Make ``generator`` sample from ``weights`` (HF names, adapters merged): its model's
    own copy (``hf``) or its engine (``vllm``)."""
    if isinstance(generator, HFGenerator):
        generator.model.load_state_dict(weights)
    else:
        generator.load_weights(weights)  # type: ignore[attr-defined]


def _tiny_model_dir(cfg: Config, cache_root: Path, texts: Sequence[str]) -> Path:
    """A content key for the tiny model: the same tokenizer text + shape + seed reuse one
    build. The text (the task's `TaskSpec.tokenizer_texts`) is hashed itself, so a change
    in how a task writes its text can never reuse a stale build.
    """
    digest = hashlib.sha256("\x00".join(texts).encode()).hexdigest()
    key = json.dumps(
        {"texts": digest, "tiny": configutil.to_dict(cfg.model.tiny), "seed": cfg.train.seed},
        sort_keys=True,
    )
    return cache_root / f"tiny-{hashlib.sha256(key.encode()).hexdigest()[:12]}"


def task_context(cfg: Config) -> TaskContext:
    """What a task factory may know about the run."""
    return TaskContext(
        seed=cfg.train.seed, max_turns=cfg.rollout.max_turns, warm_start=cfg.sft.enabled
    )


def load_task(cfg: Config, task: TaskSpec | None = None) -> TaskSpec:
    """``task`` (a value given in Python) or the one ``cfg.task`` names, with the recipe's
    overrides (tools, rewards, system prompt) applied, checked against ``cfg.eval``.

    Raises:
        configutil.ConfigError: ``eval.splits`` names a split the task does not have.
        ValueError: a reference in ``cfg.task`` that does not resolve.
    """
    from agentr1.tasks import apply_overrides

    spec = (
        build_task(cfg.task, task_context(cfg)) if task is None else apply_overrides(task, cfg.task)
    )
    if cfg.distributed.tool_actors:
        from agentr1.distributed.tools import tools_on_actors

        spec = tools_on_actors(spec, cfg.distributed)
    unknown = [s for s in cfg.eval.splits if s not in spec.splits]
    if unknown:
        raise configutil.ConfigError(
            f"eval.splits {unknown} are not splits of task {spec.name!r} "
            f"({', '.join(spec.splits)}): nothing would be evaluated on them"
        )
    return spec


def build_setup(
    cfg: Config, task: TaskSpec | None = None, cache_root: str | Path | None = None
) -> Setup:
    """Build the task (unless given), the tokenizer and policy, and the generator.

    A tiny model (``model.path: tiny``) is built once per (tokenizer text, shape, seed)
    under ``cache_root`` (default ``$AGENTR1_CACHE/tiny``) and reused by later runs.
    """
    torch.manual_seed(cfg.train.seed)
    if cfg.train.threads > 0:
        torch.set_num_threads(cfg.train.threads)
    if cfg.train.keep_freed_mib > 0:
        keep_freed_memory(cfg.train.keep_freed_mib << 20)
    spec = load_task(cfg, task)
    path, model_dir = model_path(cfg, spec, cache_root)
    tokenizer, chat, policy, generator, pad_id = load_policy(cfg, path)
    make_env = spec.env_factory(listed=not chat.renders_tools)
    return Setup(cfg, spec, make_env, tokenizer, chat, policy, generator, pad_id, model_dir, task)


def sampler_setup(
    cfg: Config, path: str, task: TaskSpec | None = None
) -> tuple[Callable[[], ToolEnv], ChatFormat, Generator]:
    """What a rollout worker needs and nothing more: the task's env factory, the chat
    format and a generator in the sampler's dtype over the model at ``path`` (the
    driver's `Setup.model_dir`; no trainable policy, no LoRA: the driver sends merged
    weights)."""
    from agentr1.models import load_model, load_tokenizer

    torch.manual_seed(cfg.train.seed)
    spec = load_task(cfg, task)
    tokenizer = load_tokenizer(path)
    chat = ChatFormat.from_hf(tokenizer, chat_template=TEMPLATES[cfg.model.chat_template])
    make_env = spec.env_factory(listed=not chat.renders_tools)
    if rollout_backend(cfg) == "vllm":
        return make_env, chat, vllm_generator(cfg, path)
    device = resolve_device(cfg.model.device)
    dtype = torch.bfloat16 if sampler_bf16(cfg, device) else torch.float32
    model = load_model(path, dtype=dtype, device=device).eval()
    model.requires_grad_(False)
    return make_env, chat, hf_generator(cfg, model, tokenizer)


def hf_generator(cfg: Config, model: Any, tokenizer: Any) -> HFGenerator:
    """The ``hf`` sampler of ``model`` with the settings ``cfg.model`` gives it."""
    return HFGenerator(
        model,
        tokenizer,
        keep_cache_bytes=int(cfg.model.keep_kv_gib * 2**30),
        pack_weights_bytes=int(cfg.model.pack_weights_gib * 2**30),
        native_attention=cfg.model.native_attention,
        native_linear=cfg.model.native_linear,
    )


def model_path(cfg: Config, spec: TaskSpec, cache_root: str | Path | None) -> tuple[str, Path]:
    """(what to load the policy from, its directory): ``model.path``, or for the tiny model
    its build for this task, made now unless cached."""
    if cfg.model.path == "tiny":
        from agentr1.models import cache_dir
        from agentr1.tiny import build_and_save

        root = Path(cache_root) if cache_root is not None else cache_dir() / "tiny"
        texts = spec.default_tokenizer_texts()
        model_dir = _tiny_model_dir(cfg, root, texts)
        if not (model_dir / "config.json").exists():
            log.info("building tiny model and tokenizer in %s", model_dir)
            tmp = model_dir.with_name(f"{model_dir.name}.tmp-{os.getpid()}")
            build_and_save(tmp, texts, cfg.model.tiny, cfg.train.seed)
            try:  # publish atomically; a concurrent builder may have won the race
                os.replace(tmp, model_dir)
            except OSError:
                shutil.rmtree(tmp, ignore_errors=True)
        return str(model_dir), model_dir
    return cfg.model.path, Path(cfg.model.path)  # a local directory, a hub id, an alias


def load_policy(cfg: Config, path: str) -> tuple[Any, ChatFormat, Any, Generator, int]:
    """(tokenizer, chat format, policy model, generator, pad id) for the model at ``path``
    (a local directory, a hub id or a known alias), with the config's dtype and template."""
    from agentr1.models import cast_copy, load_model, load_tokenizer

    tokenizer = load_tokenizer(path)
    dtype = torch.bfloat16 if cfg.model.dtype == "bfloat16" else torch.float32
    policy = load_model(path, dtype=dtype, device=resolve_device(cfg.model.device))
    warn_emulated_bf16(cfg, policy.device)
    chat = ChatFormat.from_hf(tokenizer, chat_template=TEMPLATES[cfg.model.chat_template])
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else chat.end_of_turn_id
    # The trainer's masked passes (rows sharing a prefix) without copied key/value heads
    # (`agentr1.backends.attention`); a sampler copy made below is switched by its generator.
    use_decode_sdpa(policy)
    sampler = policy
    if dtype != torch.bfloat16 and sampler_bf16(cfg, policy.device):  # a bf16 copy
        sampler = cast_copy(policy, torch.bfloat16).eval()
        sampler.requires_grad_(False)
    if cfg.model.lora.rank:
        # After the sampler copy, which stays a plain model (synced merged).
        lc = cfg.model.lora
        names = lora.apply_lora(policy, lc.rank, lc.alpha, lc.targets, lc.share_input)
        n_train = sum(p.numel() for p in lora.trainable_parameters(policy))
        n_all = sum(p.numel() for p in policy.parameters())
        log.info(
            "LoRA rank %d on %d linear layers: %d of %d parameters train (%.2f%%)",
            cfg.model.lora.rank,
            len(names),
            n_train,
            n_all,
            100 * n_train / n_all,
        )
    if cfg.optim.activation_checkpointing:
        enable_activation_checkpointing(policy)
    if rollout_backend(cfg) == "vllm":
        return tokenizer, chat, policy, vllm_generator(cfg, path), pad_id
    return tokenizer, chat, policy, hf_generator(cfg, sampler, tokenizer), pad_id


def enable_activation_checkpointing(policy: Any) -> None:
    """Turn on `OptimConfig.activation_checkpointing` (non-reentrant, so it also works
    when no input requires a gradient: LoRA's frozen embeddings). It acts only in
    training mode; the sampler, in eval mode, decodes with its cache as before."""
    if not getattr(policy, "supports_gradient_checkpointing", False):
        raise configutil.ConfigError(
            f"optim.activation_checkpointing: {type(policy).__name__} does not support "
            "gradient checkpointing; set it to false"
        )
    kwargs = {"use_reentrant": False}
    if hasattr(policy, "activation_checkpointing_enable"):  # the name since transformers 5.2x
        policy.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        policy.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


def rollout_backend(cfg: Config) -> str:
    """The engine ``model.backend`` names ("auto": vllm where it imports and a GPU is
    present, else hf)."""
    if cfg.model.backend != "auto":
        return cfg.model.backend
    from agentr1.backends import vllm

    return "vllm" if torch.cuda.is_available() and vllm.available() else "hf"


def vllm_generator(cfg: Config, path: str) -> Generator:
    """A vLLM engine over the model at ``path`` (the directory the policy came from:
    the weights agree until the first update, then `Setup.sync_sampler` keeps them so),
    long enough for the rollout's episodes, in the sampler's dtype."""
    from agentr1.backends.vllm import VLLMGenerator
    from agentr1.models import resolve

    source, extra = resolve(path)  # the alias: the plain copy `load_model` prepared
    if extra:
        raise ValueError(f"model {path!r}: vLLM needs a plain HF directory, not a GGUF file")
    bf16 = sampler_bf16(cfg, resolve_device(cfg.model.device))
    return VLLMGenerator(
        source,
        max_model_len=cfg.rollout.max_context,
        dtype="bfloat16" if bf16 else "float32",
        seed=cfg.train.seed,
        kv_cache_gib=max(cfg.model.keep_kv_gib, 0.25),
    )


def resolve_device(spec: str) -> torch.device:
    """``model.device`` as a torch device ("auto" = CUDA when available, else CPU).

    Raises:
        ValueError: a CUDA device asked for on a machine without one, or a bad name.
    """
    if spec == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(spec)
    except RuntimeError as e:
        raise ValueError(f"model.device={spec!r}: expected auto, cpu, cuda or cuda:N") from e
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(
            f"model.device={spec!r}: this machine has no CUDA device (use auto or cpu)"
        )
    return device


def native_bf16(device: torch.device) -> bool:
    """Whether ``device`` computes bfloat16 matmuls natively (``compute_dtype: auto``)."""
    if device.type == "cuda":
        return bool(torch.cuda.is_bf16_supported())
    if device.type != "cpu":
        return False
    cpu: Any = torch.cpu
    checks = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
    return any(bool(getattr(cpu, name, lambda: False)()) for name in checks)


MALLOC_TRIM_THRESHOLD, MALLOC_MMAP_THRESHOLD = -1, -3
"""glibc's ``mallopt`` parameters (``M_TRIM_THRESHOLD``, ``M_MMAP_THRESHOLD``, malloc.h)."""

MMAP_THRESHOLD_BYTES = 32 << 20
"""The largest ``M_MMAP_THRESHOLD`` glibc takes on 64-bit systems: smaller blocks come
from its heaps."""


def keep_freed_memory(keep_bytes: int) -> bool:
    """Have glibc's malloc serve blocks up to 32 MiB from its heaps and keep up to
    ``keep_bytes`` of freed memory mapped for reuse; whether it took the settings (False
    with another C library, e.g. musl or macOS: nothing changes there).

    By default glibc maps a block above a threshold that starts at 128 KiB (raised to
    the largest block freed so far) with ``mmap`` and gives it back on ``free``; what it
    frees at the top of a heap beyond 128 KiB goes back too. A training step allocates
    and frees activations of a few MB each, every one of them faulted in page by page
    and returned: 1.5 million page faults in 16 RL steps of the demo, 0.2 million with
    these settings (its update ~8% faster, peak RSS unchanged). Process-wide, like
    ``torch.set_num_threads``; it only changes when memory goes back to the system."""
    import ctypes

    try:  # glibc's own parameters: another C library's mallopt (if any) means others
        if not os.confstr("CS_GNU_LIBC_VERSION"):
            return False
        mallopt = ctypes.CDLL(None).mallopt  # the process's libc, no library search
        ok = mallopt(MALLOC_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES) == 1
        return bool(ok and mallopt(MALLOC_TRIM_THRESHOLD, min(keep_bytes, 2**31 - 1)) == 1)
    except (ValueError, OSError, AttributeError):  # not glibc, or no mallopt
        return False


def wants_bf16(setting: str, device: torch.device) -> bool:
    """Whether a dtype setting ("float32" / "same", "bfloat16", "auto") means bf16 on
    ``device`` ("auto": where it computes bf16 natively, `native_bf16`)."""
    return setting == "bfloat16" or (setting == "auto" and native_bf16(device))


def warn_emulated_bf16(cfg: Config, device: torch.device) -> list[str]:
    """Warn when the config asks for bfloat16 by name on a device that only emulates it
    (a CPU without avx512_bf16 or AMX: the products run ~50x slower than in float32 on
    an AVX2 CPU), where ``auto`` would pick float32; return the settings named."""
    m = cfg.model
    named = [
        f"model.{k}=bfloat16"
        for k in ("dtype", "compute_dtype", "sampler_dtype")
        if getattr(m, k) == "bfloat16"
    ]
    if named and not native_bf16(device):
        log.warning(
            "%s on %s, which has no bf16 arithmetic: emulated, far slower than float32 "
            "(use auto: bf16 where the device has it, float32 elsewhere)",
            ", ".join(named),
            "this CPU" if device.type == "cpu" else device,
        )
        return named
    return []


def sampler_bf16(cfg: Config, device: torch.device) -> bool:
    """Whether the rollout samples from bf16 weights: the policy's own
    (``model.dtype``), or a bf16 copy of them (``model.sampler_dtype``)."""
    return cfg.model.dtype == "bfloat16" or wants_bf16(cfg.model.sampler_dtype, device)


def train_autocast(cfg: Config, model: Any) -> contextlib.AbstractContextManager[Any]:
    """The autocast context of the training passes (``model.compute_dtype``); a no-op
    unless it asks for bfloat16 compute on non-bfloat16 weights ("auto": where the device
    has it natively, `native_bf16`)."""
    device = next(model.parameters()).device
    enabled = wants_bf16(cfg.model.compute_dtype, device) and cfg.model.dtype != "bfloat16"
    return torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=enabled)

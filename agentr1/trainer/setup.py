"""Wire a `Config` into the parts a run needs: tasks, env factory, tokenizer, policy,
chat format and generator. The only place (with the CLI) that knows every layer."""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import hashlib
import json
import logging
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from agentr1 import configutil, lora
from agentr1.backends.hf import HFGenerator
from agentr1.config import Config
from agentr1.envs.world import World
from agentr1.envs.world_env import WorldEnvFactory, oracle_generator, tokenizer_corpus
from agentr1.rewards import OUTCOME_REWARDS
from agentr1.rollout.chat import ChatFormat
from agentr1.templates import CHATML_TOOLS_MINIMAL, QWEN25_TOOLS
from agentr1.types import Task

log = logging.getLogger(__name__)

TEMPLATES = {"qwen2.5": QWEN25_TOOLS, "chatml-minimal": CHATML_TOOLS_MINIMAL, "model": None}


@dataclass
class Setup:
    """Everything a run is made of (built once per process)."""

    cfg: Config
    world: World | None  # None for task.kind = "qa"
    tasks: dict[str, list[Task]]
    make_env: Any  # WorldEnvFactory, or SearchEnvFactory for task.kind = "qa"
    demo_worlds: list[World]
    tokenizer: Any
    chat: ChatFormat
    policy: Any
    generator: HFGenerator
    pad_id: int
    model_dir: Path
    demo_fn: Callable[[float, int, bool], list[tuple[list[Task], Any, Any]]] | None = None
    """Replaces the world's demonstration sources (task.kind = "qa": supporting facts)."""

    @property
    def sampler_is_policy(self) -> bool:
        """Whether the generator samples from the policy's own weights (not a copy)."""
        return self.generator.model is self.policy

    def sync_sampler(self) -> None:
        """Copy the policy's weights into the sampler's copy (no-op when they are shared).
        Call after every change to the policy's weights."""
        if not self.sampler_is_policy:
            self.generator.model.load_state_dict(lora.merged_state_dict(self.policy))

    def demo_sources(
        self, early_answer_prob: float, seed: int, notes: bool = True
    ) -> list[tuple[list[Task], WorldEnvFactory, Any]]:
        """(training tasks, env factory, scripted oracle generator) per demonstration world."""
        if self.demo_fn is not None:
            return self.demo_fn(early_answer_prob, seed, notes)
        out = []
        wants_own = self.cfg.sft.own_world_demos or not self.demo_worlds
        own = [self.world] if wants_own and self.world is not None else []
        if not own and not self.demo_worlds:
            raise ValueError(
                "sft.enabled: this setup has no demonstrations to imitate (no world, no "
                "demo worlds and no demo_fn); set sft.enabled=false or give it a source"
            )
        for w in [*own, *self.demo_worlds]:
            env = self.make_env if w is self.world else dataclasses.replace(self.make_env, world=w)
            out.append(
                (
                    w.tasks("train"),
                    env,
                    oracle_generator(w, self.chat, early_answer_prob, seed, notes),
                )
            )
        return out


def _tiny_model_dir(cfg: Config, cache_root: Path, texts: list[str]) -> Path:
    """A content key for the tiny model: the same tokenizer text + shape + seed reuse one
    build. The text (the world's and the demonstration worlds' passages, questions, calls)
    is hashed itself, so a change in how worlds are written can never reuse a stale build.
    """
    digest = hashlib.sha256("\x00".join(texts).encode()).hexdigest()
    key = json.dumps(
        {"texts": digest, "tiny": configutil.to_dict(cfg.model.tiny), "seed": cfg.train.seed},
        sort_keys=True,
    )
    return cache_root / f"tiny-{hashlib.sha256(key.encode()).hexdigest()[:12]}"


def build_setup(cfg: Config, cache_root: str | Path | None = None) -> Setup:
    """Build the world, the env factory, the tokenizer and policy, and the generator.

    The tiny model is built once per (world, shape, seed) under ``cache_root`` (default
    ``$AGENTR1_CACHE/tiny``) and reused by later runs.
    """
    torch.manual_seed(cfg.train.seed)
    if cfg.train.threads > 0:
        torch.set_num_threads(cfg.train.threads)
    if cfg.task.kind == "qa":
        from agentr1.trainer.qa_setup import build_qa_setup

        return build_qa_setup(cfg)
    from agentr1.models import cache_dir
    from agentr1.tiny import build_and_save

    cache_root = Path(cache_root) if cache_root is not None else cache_dir() / "tiny"
    world = World.build(cfg.task.world)
    demo_worlds = [
        World.build(dataclasses.replace(cfg.task.world, seed=cfg.task.world.seed + 7919 * (k + 1)))
        for k in range(cfg.sft.demo_worlds if cfg.sft.enabled else 0)
    ]
    tasks = {s: world.tasks(s) for s in ("train", "test", "test_ood")}
    make_env = WorldEnvFactory(
        world,
        top_k=cfg.task.top_k,
        system_prompt=cfg.task.system_prompt,
        outcome_reward=OUTCOME_REWARDS[cfg.task.outcome_reward],
        process_reward=cfg.task.process.build(),
    )
    if cfg.model.path == "tiny":
        texts = [t for w in [world, *demo_worlds] for t in tokenizer_corpus(w)]
        model_dir = _tiny_model_dir(cfg, cache_root, texts)
        if not (model_dir / "config.json").exists():
            log.info("building tiny model and tokenizer in %s", model_dir)
            tmp = model_dir.with_name(f"{model_dir.name}.tmp-{os.getpid()}")
            build_and_save(tmp, texts, cfg.model.tiny, cfg.train.seed)
            try:  # publish atomically; a concurrent builder may have won the race
                os.replace(tmp, model_dir)
            except OSError:
                shutil.rmtree(tmp, ignore_errors=True)
        path = str(model_dir)
    else:
        path = cfg.model.path  # a local directory, a hub id, or a known alias
        model_dir = Path(path)
    tokenizer, chat, policy, generator, pad_id = load_policy(cfg, path)
    return Setup(
        cfg,
        world,
        tasks,
        make_env,
        demo_worlds,
        tokenizer,
        chat,
        policy,
        generator,
        pad_id,
        model_dir,
    )


def load_policy(cfg: Config, path: str) -> tuple[Any, ChatFormat, Any, HFGenerator, int]:
    """(tokenizer, chat format, policy model, generator, pad id) for the model at ``path``
    (a local directory, a hub id or a known alias), with the config's dtype and template."""
    from agentr1.models import load_model, load_tokenizer

    tokenizer = load_tokenizer(path)
    dtype = torch.bfloat16 if cfg.model.dtype == "bfloat16" else torch.float32
    policy = load_model(path, dtype=dtype, device=resolve_device(cfg.model.device))
    chat = ChatFormat.from_hf(tokenizer, chat_template=TEMPLATES[cfg.model.chat_template])
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else chat.end_of_turn_id
    sampler = policy
    if cfg.model.sampler_dtype == "bfloat16" and dtype != torch.bfloat16:
        sampler = copy.deepcopy(policy).to(torch.bfloat16).eval()
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
    keep = int(cfg.model.keep_kv_gib * 2**30)
    generator = HFGenerator(sampler, tokenizer, keep_cache_bytes=keep)
    return tokenizer, chat, policy, generator, pad_id


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


def train_autocast(cfg: Config, model: Any) -> contextlib.AbstractContextManager[Any]:
    """The autocast context of the training passes (``model.compute_dtype``); a no-op
    unless it asks for bfloat16 compute on non-bfloat16 weights."""
    enabled = cfg.model.compute_dtype == "bfloat16" and cfg.model.dtype != "bfloat16"
    device = next(model.parameters()).device.type
    return torch.autocast(device_type=device, dtype=torch.bfloat16, enabled=enabled)

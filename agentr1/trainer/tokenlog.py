"""What the report's trajectory viewer shows per token (docs/report.md), for the episodes
an RL step logs: the whole GRPO groups of its first ``train.log_trajectories`` tasks.

    logged_rows       the batch rows of those groups (`collate_groups` keeps group order)
    logprobs_before   the trainer's log-probs of those rows before the update (scoring),
                      or, on-policy in one process, from the update's own first forward
                      (`update_gives_before`, `tap_for`, `before_from_tap`): no extra pass
    token_layers      after the update: advantage, PPO ratio and KL per token of each row
    token_pieces      each token's text, so that the pieces concatenate to the decoded text

Layers, per token of an episode, None where the step trained nothing (off the train mask):

    advantage   the advantage the update used
    ratio       pi_after / pi_before: the PPO ratio each token has at the end of the step's
                update (1 before its first optimizer step; a further epoch would start
                from it, and PPO clips it to [1 - clip_low, 1 + clip_high])
    kl          the KL estimate of ``algo.kl_mode`` (k1, k2 or k3) between the policy
                before the update and the reference, where the run has a reference

The sampled (behaviour) log-probs and the loss mask are the trajectory's own
(`Trajectory.logprobs`, `Trajectory.loss_mask`). Values are rounded to 4 significant
digits (`SIG_DIGITS`): a logged token takes about 70 bytes of trajectories.jsonl, its
trajectory's own fields included (docs/report.md).

Notation: B = rows of the step's batch, N = the logged rows, T = tokens.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import torch

from agentr1.algorithms.losses import KL_KINDS, kl_penalty
from agentr1.trainer.logprobs import token_logprobs
from agentr1.trainer.setup import train_autocast
from agentr1.trainer.update import LogprobTap

if TYPE_CHECKING:
    from agentr1.config import Config
    from agentr1.trainer.scoring import Scores
    from agentr1.trainer.state import TrainState
    from agentr1.trainer.update import UpdateBatch
    from agentr1.types import RolloutBatch

SIG_DIGITS = 4
"""Significant digits a logged per-token value keeps."""


def logged_rows(group_index_B: torch.Tensor, cfg: Config) -> torch.Tensor:
    """Indices of the rows whose tokens the step logs: every sample of the first
    ``train.log_trajectories`` groups (none when it is 0). [N] long"""
    return torch.nonzero(group_index_B < cfg.train.log_trajectories).flatten()


def _logprobs(
    s: TrainState, batch: RolloutBatch, rows_N: torch.Tensor, mask_BT: torch.Tensor
) -> torch.Tensor:
    """The policy's log-probs of the rows ``rows_N`` on their train-mask tokens. [N, T]"""
    cfg, policy = s.setup.cfg, s.setup.policy
    was_training = policy.training
    policy.eval()
    try:
        with torch.no_grad(), train_autocast(cfg, policy):
            lp_NT, _ = token_logprobs(
                policy,
                batch.input_ids_BT[rows_N],
                batch.attention_mask_BT[rows_N],
                mask_BT[rows_N],
                cfg.rollout.temperature,
            )
    finally:
        policy.train(was_training)
    return lp_NT.float()


def logprobs_before(
    s: TrainState, batch: RolloutBatch, train_mask_BT: torch.Tensor, old_BT: torch.Tensor | None
) -> torch.Tensor | None:
    """The trainer's log-probs of the logged rows before the update: the update's old
    log-probs where it has them (off-policy), else one forward of those rows alone (on
    policy the update takes them from its first forward). None when nothing is logged.
    [N, T]"""
    rows_N = logged_rows(batch.group_index_B, s.setup.cfg)
    if rows_N.numel() == 0:
        return None
    if old_BT is not None:
        return old_BT[rows_N].float()
    return _logprobs(s, batch, rows_N, train_mask_BT)


def update_gives_before(s: TrainState, old_BT: torch.Tensor | None) -> bool:
    """Whether the update's own forwards give the logged rows' log-probs before it: an
    on-policy update (no old log-probs: one epoch, one minibatch, so every row's forward
    comes before the optimizer step) in this process (data-parallel ranks run theirs
    elsewhere)."""
    return old_BT is None and s.group is None


def tap_for(s: TrainState, batch: RolloutBatch, old_BT: torch.Tensor | None) -> LogprobTap | None:
    """The `LogprobTap` for the logged rows when the update is to give their log-probs
    before it (`update_gives_before`, given the update's old log-probs), else None."""
    cfg = s.setup.cfg
    if not cfg.train.log_trajectories or not update_gives_before(s, old_BT):
        return None
    rows_N = logged_rows(batch.group_index_B, cfg)
    return LogprobTap(set(rows_N.tolist())) if rows_N.numel() else None


def before_from_tap(
    s: TrainState,
    batch: RolloutBatch,
    tap: LogprobTap,
    train_mask_BT: torch.Tensor,
    weights_changed: bool,
) -> torch.Tensor:
    """The logged rows' log-probs before the update, from ``tap``. [N, T]

    A row the update did not run (its micro-batch had no trained token, or the update
    stopped at a non-finite loss) takes a forward of its own when the weights are as
    they were (no optimizer step), and NaN otherwise (shown as no value)."""
    rows = logged_rows(batch.group_index_B, s.setup.cfg).tolist()
    device = batch.input_ids_BT.device
    missing = [r for r in rows if r not in tap.got]
    fill: dict[int, torch.Tensor] = {}
    if missing and not weights_changed:
        idx = torch.tensor(missing, device=device)
        fill = dict(zip(missing, _logprobs(s, batch, idx, train_mask_BT), strict=True))
    nan_T = torch.full((batch.input_ids_BT.shape[1],), float("nan"), device=device)
    return torch.stack([tap.got.get(r, fill.get(r, nan_T)) for r in rows])


def _kl_kind(kl_mode: str) -> str:
    """The estimator a KL variant is named after (``k3_loss`` -> ``k3``); k1 otherwise."""
    kind = kl_mode.split("_", 1)[0]
    return kind if kind in KL_KINDS else "k1"


def _rounded(values_T: torch.Tensor, keep_T: torch.Tensor, length: int) -> list[float | None]:
    """One row of a layer as JSON-able values: rounded, None off ``keep``, non-finite
    values as None too (JSON has no NaN); cut to the episode's ``length``."""
    out: list[float | None] = []
    for v, k in zip(values_T[:length].tolist(), keep_T[:length].tolist(), strict=True):
        if not k or v != v or v in (float("inf"), float("-inf")):
            out.append(None)
        else:
            out.append(float(f"{v:.{SIG_DIGITS}g}"))
    return out


def token_layers(
    s: TrainState, batch: RolloutBatch, ub: UpdateBatch, scores: Scores
) -> list[dict[str, list[float | None]]]:
    """After the step's update: the per-token layers (module docstring) of each logged
    row, in the order of `logged_rows`; one forward of those rows for the ratio."""
    cfg = s.setup.cfg
    rows_N = logged_rows(batch.group_index_B, cfg)
    before_NT = scores.logged_BT
    if rows_N.numel() == 0 or before_NT is None:
        return []
    mask_NT = ub.loss_mask_BT[rows_N]
    after_NT = _logprobs(s, batch, rows_N, ub.loss_mask_BT)
    layers: dict[str, torch.Tensor] = {
        "advantage": ub.advantages_BT[rows_N].float(),
        "ratio": torch.exp((after_NT - before_NT).clamp(-30.0, 30.0)),
    }
    if scores.ref_BT is not None:
        ref_NT = scores.ref_BT[rows_N].float()
        layers["kl"] = kl_penalty(before_NT, ref_NT, _kl_kind(cfg.algo.kl_mode), mask_NT)  # type: ignore[arg-type]
    lengths = batch.attention_mask_BT[rows_N].sum(-1).tolist()
    keep_NT = mask_NT > 0
    return [
        {name: _rounded(v_NT[i], keep_NT[i], int(n)) for name, v_NT in layers.items()}
        for i, n in enumerate(lengths)
    ]


def token_pieces(ids: Sequence[int], decode: Callable[[Sequence[int]], str]) -> list[str]:
    """The text of each token, such that ``"".join(pieces) == decode(ids)`` for a
    byte-level tokenizer. A token that ends inside a multi-byte character gets "" and the
    character goes to the token that completes it (up to 4 tokens: UTF-8's longest).

    >>> table = {1: "a", 2: "b"}
    >>> token_pieces([1, 2, 1], lambda ids: "".join(table[i] for i in ids))
    ['a', 'b', 'a']
    """
    pieces: list[str] = []
    start = 0  # the first token whose text is not out yet
    for i in range(len(ids)):
        text = decode(ids[start : i + 1])
        if text.endswith("\ufffd") and i + 1 - start < 4 and i + 1 < len(ids):
            pieces.append("")
            continue
        pieces.append(text)
        start = i + 1
    return pieces

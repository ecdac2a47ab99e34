"""Experiment trackers (agentr1.trackers) on one tiny real run with every installed
tracker plus one that fails: what each writes, its own reader reads back — TensorBoard's
EventAccumulator, the records of W&B's offline run file, MLflow's client on the run's
local store. Each test skips where its tracker's package is not installed (`make
trackers` installs all three)."""

from __future__ import annotations

import importlib.util
import json
import logging
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from agentr1.config import load_config
from agentr1.trackers import Trackers, make_trackers
from agentr1.trainer import run as run_module
from agentr1.trainer.loop import train
from tests.e2e.test_train_loop import SMALL

TRACKERS = ("tensorboard", "wandb", "mlflow")


class Boom:
    """A tracker that fails at its first scalars."""

    name = "boom"

    def __init__(self) -> None:
        self.calls = 0

    def log_scalars(self, step: int, scalars: dict[str, float]) -> None:
        self.calls += 1
        raise RuntimeError("tracker server went away")

    def log_table(self, key: str, step: int, columns: list[str], rows: list[list[Any]]) -> None:
        pass

    def log_text(self, key: str, step: int, text: str) -> None:
        pass

    def log_config(self, config: dict[str, Any]) -> None:
        pass

    def close(self) -> None:
        pass


@dataclass
class TinyRun:
    dir: Path
    rewards: list[float]
    """Of the RL steps, as metrics.jsonl logged them."""
    boom: Boom
    warnings: list[str]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> TinyRun:
    """Two RL steps after a 3-step warm start, greedy evaluation of 2 tasks a split,
    logged to every installed tracker and to `Boom`; W&B offline."""
    installed = [n for n in TRACKERS if importlib.util.find_spec(n) is not None]
    tmp = tmp_path_factory.mktemp("trackers")
    run_dir = tmp / "run"
    boom, warnings = Boom(), []

    def with_boom(cfg: Any, path: Path) -> Trackers:
        return Trackers([*make_trackers(cfg, path).live, boom])

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            warnings.append(record.getMessage())

    handler = Collect(logging.WARNING)
    logging.getLogger("agentr1.trackers").addHandler(handler)
    small = ["sft.steps=3", "train.steps=2", "eval.max_tasks=2", "eval.sampled_n=0"]
    mine = [f"log.trackers=[{','.join(installed)}]", "log.run_name=tiny", "log.project=tiny-exp"]
    try:
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("AGENTR1_CACHE", str(tmp_path_factory.getbasetemp() / "agentr1-cache"))
            mp.setenv("WANDB_MODE", "offline")
            mp.setenv("WANDB_SILENT", "true")
            mp.setenv("WANDB_CONFIG_DIR", str(tmp / "wandb-config"))
            mp.setenv("WANDB_CACHE_DIR", str(tmp / "wandb-cache"))
            mp.delenv("MLFLOW_TRACKING_URI", raising=False)
            mp.setattr(run_module, "make_trackers", with_boom)
            cfg = load_config(None, [*SMALL, *small, f"train.run_dir={run_dir}", *mine])
            assert train(cfg)["steps"] == 2
    finally:
        logging.getLogger("agentr1.trackers").removeHandler(handler)
    with open(run_dir / "metrics.jsonl") as f:
        rows = [json.loads(line) for line in f]
    rewards = [r["reward"] for r in rows if r["phase"] == "rl"]
    return TinyRun(run_dir, rewards, boom, warnings)


def test_a_failing_tracker_is_disabled_and_the_run_completes(tiny: TinyRun) -> None:
    assert len(tiny.rewards) == 2 and (tiny.dir / "report.md").exists()
    assert tiny.boom.calls == 1  # disabled after its first failure
    warned = [w for w in tiny.warnings if "boom" in w]
    assert len(warned) == 1 and "tracker server went away" in warned[0]
    assert not [w for w in tiny.warnings if "boom" not in w]  # the others kept going


def test_tensorboard_event_files_hold_the_run(tiny: TinyRun) -> None:
    pytest.importorskip("tensorboard", reason="tensorboard not installed: make trackers")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    rewards = tiny.rewards
    acc = EventAccumulator(str(tiny.dir / "tb"))
    acc.Reload()
    events = acc.Scalars("rl/reward")
    assert [e.step for e in events] == [0, 1]
    assert [e.value for e in events] == pytest.approx(rewards, rel=1e-6)  # float32
    tags = acc.Tags()
    assert "sft/final_loss" in tags["scalars"]
    assert "eval_after/greedy/test/all/em" in tags["scalars"]
    texts = {"config", "rl/samples", "eval_before/table", "eval_after/table"}
    assert {f"{t}/text_summary" for t in texts} <= set(tags["tensors"])


def wandb_records(path: Path) -> Iterator[Any]:
    """The protobuf records of a W&B run file (``run-<id>.wandb``): LevelDB's log format
    behind a 7-byte ``:W&B`` header, 32 KiB blocks, each record a chunk of type full (1)
    or first / middle / last (2-4). wandb 0.31 ships no Python reader of its own (the
    old ``wandb.sdk.internal.datastore`` is gone), only the protobuf classes."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = path.read_bytes()
    assert data[:4] == b":W&B"
    pos, block, buf = 7, 32768, b""
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:  # a block's tail too short for a header is padding
            pos += left
            continue
        _crc, n, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if kind == 0 and n == 0:
            break
        buf += data[pos + 7 : pos + 7 + n]
        pos += 7 + n
        if kind in (1, 4):
            record = pb.Record()
            record.ParseFromString(buf)
            yield record
            buf = b""


def test_wandb_offline_run_holds_the_run(tiny: TinyRun) -> None:
    pytest.importorskip("wandb", reason="wandb not installed: make trackers")
    rewards = tiny.rewards
    (run_file,) = tiny.dir.glob("wandb/offline-run-*/run-*.wandb")
    history: dict[int, dict[str, str]] = {}
    config_keys: set[str] = set()
    names = []
    for r in wandb_records(run_file):
        kind = r.WhichOneof("record_type")
        if kind == "history":
            row = {i.key or "/".join(i.nested_key): i.value_json for i in r.history.item}
            history[int(row["_step"])] = row
        elif kind == "config":
            config_keys |= {i.key for i in r.config.update}
        elif kind == "run":
            names.append(r.run.display_name)
    assert names == ["tiny"]
    assert [float(history[s]["rl/reward"]) for s in (0, 1)] == pytest.approx(rewards)
    assert "sft/final_loss" in history[0] and "eval_after/greedy/test/all/em" in history[1]
    assert {"model", "train", "log"} <= config_keys
    assert list(run_file.parent.glob("files/media/table/rl/samples_*.table.json"))


def test_mlflow_store_holds_the_run(tiny: TinyRun) -> None:
    pytest.importorskip("mlflow", reason="mlflow not installed: make trackers")
    from mlflow.tracking import MlflowClient

    from agentr1.trackers import mlflow_uri

    rewards = tiny.rewards
    client = MlflowClient(tracking_uri=mlflow_uri(tiny.dir))
    exp = client.get_experiment_by_name("tiny-exp")
    (run,) = client.search_runs([exp.experiment_id])
    assert run.info.run_name == "tiny" and run.info.status == "FINISHED"
    history = client.get_metric_history(run.info.run_id, "rl/reward")
    assert [m.step for m in history] == [0, 1]
    assert [m.value for m in history] == pytest.approx(rewards)
    assert "eval_after/greedy/test/all/em" in run.data.metrics
    assert run.data.params["train.steps"] == "2"
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"config.json", "tables", "text"} <= artifacts

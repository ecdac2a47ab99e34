"""One real update, captured from the training loop and replayed: the update's time by
micro-batch cap, where its CPU time goes, and how each product's calls spread (issue 28).

The training loop of ``recipes/multihop_smollm2.yaml`` runs with the side-by-side script's
settings (`trl_side_by_side.COMMON` and ``--setting``: ``agentr1-fast`` by default) up to
``--capture-step``; that step's call of `agentr1.trainer.update.rl_update` is kept
(its learner, batch, configs and autocast), and the run stops. Then the same call is made
again on the same batch, ``--rounds`` times for each cap of ``--caps``
(``optim.micro_batch_tokens``; the setting's own cap when none is given), the caps taking
turns within each round after one untimed replay. A replay is a real update: it takes an
optimizer step, so the weights move from replay to replay (the work does not).

Each timed replay also reports the process's minor page faults and each thread's CPU
seconds (`thread_cpu`): whether fresh memory or another thread costs the update time.
``--profile`` adds one replay under torch's profiler: the ops by self CPU time, and each
product's shape with its calls' count, total, min, median and max (`spread`) -- the same
shape runs at different speeds at different points of the update.

    .venv/bin/python benchmarks/update_replay.py --caps 1024,2560 --rounds 3 --profile \\
        task.config.data_dir=../shared/data/raw

The warm start: as for ``benchmarks/trl_side_by_side.py``.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import resource
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import trl_side_by_side as sbs
from grpo_step import check_warm_start


@dataclasses.dataclass
class Captured:
    """The loop's ``rl_update`` call at the capture step: positional and keyword args."""

    args: tuple[Any, ...]
    kwargs: dict[str, Any]

    def replay(self, cap: int | None = None) -> float:
        """The real ``rl_update`` on the captured call (optimizer cap changed where given);
        its wall seconds."""
        from agentr1.trainer.update import rl_update

        args = list(self.args)
        if cap is not None:
            args[3] = dataclasses.replace(args[3], micro_batch_tokens=cap)
        t = time.perf_counter()
        rl_update(*args, **self.kwargs)
        return time.perf_counter() - t


def capture(cfg: Any, step: int) -> Captured:
    """Train ``cfg`` to step ``step`` (1-based) and keep that step's update call (the run
    stops after it; the call itself runs, so every earlier update happened too)."""
    from agentr1.trainer import loop

    real, seen = loop.rl_update, []

    def spy(*a: Any, **k: Any) -> Any:
        seen.append(Captured(a, k))
        return real(*a, **k)

    loop.rl_update = spy
    try:
        loop.train(cfg, stop_after=step)
    finally:
        loop.rl_update = real
    if len(seen) < step:
        raise SystemExit(f"the run made {len(seen)} update(s), fewer than --capture-step {step}")
    return seen[step - 1]


def thread_cpu() -> dict[str, float]:
    """CPU seconds (user + system) of each of this process's threads, by ``name/tid``."""
    tick, out = os.sysconf("SC_CLK_TCK"), {}
    for tid in os.listdir("/proc/self/task"):
        try:
            stat = Path(f"/proc/self/task/{tid}/stat").read_text()
        except OSError:  # the thread ended
            continue
        name, fields = (
            stat[stat.index("(") + 1 : stat.rindex(")")],
            stat[stat.rindex(")") + 2 :].split(),
        )
        out[f"{name}/{tid}"] = (int(fields[11]) + int(fields[12])) / tick
    return out


def timed(c: Captured, cap: int | None) -> dict[str, Any]:
    """One replay: seconds, minor page faults, and the threads that took CPU (> 0.05 s)."""
    before, faults = thread_cpu(), resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    seconds = c.replay(cap)
    after = thread_cpu()
    busy = {k: round(v - before.get(k, 0.0), 2) for k, v in after.items()}
    return {
        "seconds": seconds,
        "minor_faults": resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults,
        "threads": {k: v for k, v in busy.items() if v > 0.05},
    }


def spread(
    events: list[Any], names: tuple[str, ...] = ("aten::mm", "aten::addmm", "aten::bmm")
) -> list[dict[str, Any]]:
    """Per (op, input shapes) of ``events`` named in ``names``: calls, total / min /
    median / max ms a call, most total time first."""
    calls: dict[tuple[str, str], list[float]] = defaultdict(list)
    for e in events:
        if e.name in names:
            calls[(e.name, str(e.input_shapes))].append(e.cpu_time_total / 1000)
    rows = [
        {
            "op": op,
            "shapes": shapes,
            "calls": len(ms),
            "total_ms": sum(ms),
            "min_ms": min(ms),
            "median_ms": statistics.median(ms),
            "max_ms": max(ms),
        }
        for (op, shapes), ms in calls.items()
    ]
    return sorted(rows, key=lambda r: -r["total_ms"])


def profile(c: Captured, cap: int | None, top: int) -> list[dict[str, Any]]:
    """One replay under torch's profiler: prints the op table and the products' spread."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    with torch_profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        c.replay(cap)
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=top))
    rows = spread(prof.events())
    print("| product | shapes | calls | total ms | min | median | max |")
    print("|---|---|---|---|---|---|---|")
    for r in rows[:top]:
        print(
            f"| {r['op']} | {r['shapes']} | {r['calls']} | {r['total_ms']:.0f} | "
            f"{r['min_ms']:.2f} | {r['median_ms']:.2f} | {r['max_ms']:.2f} |"
        )
    return rows


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run and print; returns ``{"caps": {cap: [replay rows]}, "profile": rows or None}``."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--model", default=sbs.WARM_START, help="a model that calls the search tool")
    ap.add_argument("--recipe", default=str(sbs.RECIPE))
    ap.add_argument("--setting", default="agentr1-fast", choices=sorted(sbs.SETTINGS))
    ap.add_argument("--capture-step", type=int, default=2, help="the step whose update replays")
    ap.add_argument("--caps", default="", help="micro_batch_tokens to compare, e.g. 1024,2560")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--profile", action="store_true", help="one more replay, profiled")
    ap.add_argument("--top", type=int, default=20, help="rows of the profile's tables")
    ap.add_argument("overrides", nargs="*", help="section.field=value")
    args = ap.parse_args(argv)
    if args.capture_step < 1 or args.rounds < 1:
        ap.error("--capture-step and --rounds must be >= 1")
    try:
        caps: list[int | None] = [int(x) for x in args.caps.split(",") if x.strip()] or [None]
    except ValueError:
        ap.error(f"--caps takes integers separated by commas, got {args.caps!r}")
    check_warm_start(ap, args.model)
    with tempfile.TemporaryDirectory(prefix="update_replay_") as tmp:
        cfg = sbs.setting_config(
            args.setting, args.model, args.capture_step, tmp, args.overrides, args.recipe
        )
        c = capture(cfg, args.capture_step)
        batch = c.args[1].input_ids_BT
        real = int(c.args[1].attention_mask_BT.sum())
        print(
            f"captured step {args.capture_step}'s update: {batch.shape[0]} rows, {real} real tokens"
        )
        for cap in caps:
            c.replay(cap)  # untimed: the cap's first passes
        results: dict[Any, list[dict[str, Any]]] = {cap: [] for cap in caps}
        for r in range(args.rounds):
            for cap in caps:
                row = timed(c, cap)
                results[cap].append(row)
                print(
                    f"round {r} cap {cap or cfg.optim.micro_batch_tokens}: {row['seconds']:.2f} s, "
                    f"{row['minor_faults']} minor faults, thread CPU s {row['threads']}",
                    flush=True,
                )
        for cap, rows in results.items():
            med = statistics.median(x["seconds"] for x in rows)
            print(f"cap {cap or cfg.optim.micro_batch_tokens}: median {med:.2f} s of {len(rows)}")
        prof = profile(c, caps[0], args.top) if args.profile else None
    sys.stdout.flush()
    return {"caps": results, "profile": prof}


if __name__ == "__main__":
    main()

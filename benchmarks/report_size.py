"""How large a run's per-token log and its report.html get, from a demo-like run, and the
README's screenshot of the report.

    .venv/bin/python benchmarks/report_size.py runs/report_demo            # the demo, shorter
    .venv/bin/python benchmarks/report_size.py runs/report_demo --screenshot docs/report.png
    .venv/bin/python benchmarks/report_size.py runs/report_demo --no-train  # measure a run

Trains the embedded demo (`agentr1 demo`) with a shorter warm start and fewer RL steps
(`SHORT`; extra ``section.field=value`` overrides follow), so its episodes are the demo's
own (searches, tool responses, answers), then reports: bytes of trajectories.jsonl per RL
step, per logged episode and per token, the same for the evaluations, report.html's size,
the share of the step's time the token log took (``time/log_tokens``), and what a
1,000-step run of the same setting would write. With ``--screenshot`` (needs `make
browser`) it opens the report in headless Chromium, picks the rewarded episode with the
most tool calls, colours it by advantage and saves the viewer, scaled down, as a PNG.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

from agentr1.config import load_config
from agentr1.report import write_report
from agentr1.report.data import MAX_STEPS, load_run
from agentr1.report.html import embed_json
from agentr1.trainer.loop import train
from agentr1.trainer.run import metric_records

SHORT = ["sft.steps=400", "train.steps=20", "train.eval_every=10", "eval.max_tasks=50"]
"""The demo, shorter: still a policy that searches and answers."""


def measure(run_dir: Path, max_steps: int = MAX_STEPS) -> dict[str, Any]:
    """Sizes of the run's token log and report, and the extrapolation to 1,000 steps."""
    lines = (run_dir / "trajectories.jsonl").read_bytes().splitlines(keepends=True)
    rl: dict[int, int] = {}
    evals: dict[str, int] = {}
    rl_eps = rl_tokens = 0
    for raw in lines:
        r = json.loads(raw)
        if r["label"] == "rl":
            rl[r["step"]] = rl.get(r["step"], 0) + len(raw)
            rl_eps += 1
            rl_tokens += len(r["token_ids"])
        else:
            evals[r["label"]] = evals.get(r["label"], 0) + len(raw)
    rows = metric_records(run_dir, "rl")
    per_step = statistics.mean(rl.values())
    report = write_report([run_dir], run_dir / "report.html", max_steps, quiet=True)
    log_share = statistics.mean(r.get("time/log_tokens", 0.0) / r["time/step"] for r in rows)
    # What the page holds per RL step (its episodes; its metrics row) and per evaluation.
    data = load_run(run_dir, max_steps)
    n_rl, n_ev = data["shown"]["rl_shown"], data["shown"]["evals_shown"]
    rl_page = len(embed_json([e for e in data["episodes"] if e["label"] == "rl"])) / n_rl
    ev_eps = [e for e in data["episodes"] if e["label"] != "rl"]
    ev_page = len(embed_json(ev_eps)) / max(1, n_ev)
    row_page = len(embed_json(data["rl"])) / len(rows)
    html = report.stat().st_size
    out = {
        "rl_steps": len(rl),
        "episodes_per_step": rl_eps / len(rl),
        "tokens_per_episode": rl_tokens / rl_eps,
        "log_bytes_per_rl_step": per_step,
        "log_bytes_per_token": sum(rl.values()) / rl_tokens,
        "log_bytes_per_eval": statistics.mean(evals.values()) if evals else 0.0,
        "trajectories_jsonl": sum(len(x) for x in lines),
        "metrics_jsonl_bytes_per_step": (run_dir / "metrics.jsonl").stat().st_size / len(rows),
        "report_html": html,
        "page_bytes_per_rl_step": rl_page,
        "page_bytes_per_eval": ev_page,
        "page_bytes_per_metrics_row": row_page,
        "log_tokens_share_of_step": log_share,
    }
    # A 1,000-step run: the log grows with the steps; the page holds max_steps of them
    # (and max_steps evaluations) but every step's metrics row.
    out["log_1000_steps_MB"] = 1000 * per_step / 1e6
    rest = html - n_rl * rl_page - n_ev * ev_page - len(rows) * row_page
    page = rest + max_steps * (rl_page + ev_page) + 1000 * row_page
    out["report_1000_steps_MB"] = page / 1e6
    return out


def screenshot(run_dir: Path, png: Path, width: int = 1000) -> Path:
    """The report's trajectory viewer in headless Chromium, the rewarded episode with the
    most tool calls coloured by advantage, saved to ``png`` (scaled to ``width`` pixels,
    128 colours)."""
    from PIL import Image
    from playwright.sync_api import sync_playwright

    report = run_dir / "report.html"
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path="/usr/bin/chromium", args=["--no-sandbox"])
        page = b.new_page(viewport={"width": 1500, "height": 1000})
        page.goto(report.resolve().as_uri())
        page.wait_for_selector("body[data-ready='1']")
        page.select_option("#f-step", "all")
        page.fill("#f-rmin", "0.5")
        rows = page.locator("#episode-list tr.ep")
        calls = [int(rows.nth(i).locator("td").nth(6).inner_text()) for i in range(rows.count())]
        if calls:  # the rewarded episode with the most tool calls
            rows.nth(calls.index(max(calls))).click()
        page.select_option("#layer", "advantage")
        raw = png.with_suffix(".raw.png")
        page.locator("#viewer").screenshot(path=str(raw))
        b.close()
    img = Image.open(raw)
    img = img.resize((width, round(img.height * width / img.width)), Image.LANCZOS)
    img.convert("P", palette=Image.ADAPTIVE, colors=128).save(png, optimize=True)
    raw.unlink()
    return png


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("overrides", nargs="*", help="section.field=value after SHORT")
    ap.add_argument("--no-train", action="store_true", help="measure an existing run")
    ap.add_argument("--screenshot", type=Path, default=None, help="write the report's PNG")
    args = ap.parse_args()
    if not args.no_train:
        cfg = load_config(None, [*SHORT, *args.overrides, f"train.run_dir={args.run_dir}"])
        train(cfg)
    for k, v in measure(args.run_dir).items():
        print(f"{k:28s} {v:,.3f}" if isinstance(v, float) else f"{k:28s} {v:,}")
    if args.screenshot is not None:
        print("screenshot:", screenshot(args.run_dir, args.screenshot))


if __name__ == "__main__":
    main()

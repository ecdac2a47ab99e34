"""The run report (agentr1.report) on run directories written by hand: what a killed or
corrupted run leaves is skipped and named, the rest reported; the page holds its data,
loads nothing from anywhere and shows a run's text as text."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from agentr1.report import ReportError, Skipped, load_runs, render, write_report
from agentr1.report.data import load_run, spread
from agentr1.report.html import embed_json
from agentr1.trainer.run import trajectory_line
from agentr1.trainer.tokenlog import token_pieces
from agentr1.types import StopReason, ToolLogEntry, Trajectory

INJECTION = "</script><script>alert(1)</script><img src=x onerror=alert(2)>"


def episode(step: int, sample: int, reward: float, content: str = "found it") -> Trajectory:
    """A two-turn episode of 12 tokens: prompt 3, a search turn 3, the tool's answer 2,
    an answer turn 4."""
    t = Trajectory(task_id=f"t{step}", sample_index=sample)
    t.append_prompt([1, 2, 3])
    t.append_sampled([4, 5, 6], [-0.5, -1.0, -0.1], "search")
    t.tool_log.append(ToolLogEntry(0, "search", {"query": "x"}, ok=sample == 0, content=content))
    t.append_inserted([7, 8])
    t.append_sampled([9, 10, 11, 12], [-0.2, -0.3, -0.4, -0.05], "answer")
    t.outcome_reward = reward
    t.stop_reason = StopReason.ANSWERED if reward else StopReason.MAX_TURNS
    t.answer = "Paris" if reward else None
    return t


def decode(ids: Any) -> str:
    return "".join(chr(96 + i) for i in ids)


def layers(t: Trajectory) -> dict[str, list[float | None]]:
    on = [bool(m) for m in t.loss_mask]
    return {
        "advantage": [0.5 if m else None for m in on],
        "ratio": [1.1 if m else None for m in on],
        "kl": [0.01 if m else None for m in on],
    }


def write_run(d: Path, content: str = "found it") -> Path:
    """A run directory of 3 RL steps and evaluations before and after, its logs well formed."""
    d.mkdir(parents=True, exist_ok=True)
    rows = [{"phase": "eval_before", "greedy": {"test": {"all": {"em": 0.1, "n": 10.0}}}}]
    for s in range(3):
        rows.append({"phase": "rl", "step": float(s), "reward": 0.1 * s, "kl": 0.01 * s})
    rows.append({"phase": "eval_after", "greedy": {"test": {"all": {"em": 0.4, "n": 10.0}}}})
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    lines = []
    for s in range(3):
        for i, reward in enumerate((1.0, 0.0)):
            t = episode(s, i, reward, content)
            where = {"step": s, "split": "train", "label": "rl", "group": 0}
            lines.append(trajectory_line(where, t, decode, layers(t)))
    t = episode(3, 0, 1.0, content)
    lines.append(
        trajectory_line({"step": 3, "split": "test", "label": "after", "group": 0}, t, decode, None)
    )
    (d / "trajectories.jsonl").write_text("".join(lines), encoding="utf-8")
    (d / "config.yaml").write_text("algo:\n  estimator: grpo\n  clip_low: 0.2\n  clip_high: 0.28\n")
    return d


def embedded(page: str) -> dict[str, Any]:
    m = re.search(r'<script type="application/json" id="report-data">(.*?)</script>', page, re.S)
    assert m, "no data block"
    data: dict[str, Any] = json.loads(m.group(1))
    return data


def test_a_well_formed_run_is_read_whole(tmp_path: Path) -> None:
    run = load_run(write_run(tmp_path / "run"))
    assert run["skipped"] == []
    assert run["rl"]["step"] == [0.0, 1.0, 2.0] and run["rl"]["kl"] == [0.0, 0.01, 0.02]
    assert [(e["label"], e["step"]) for e in run["evals"]] == [("before", 0), ("after", 3.0)]
    assert run["metric_names"] == ["em"]
    eps = run["episodes"]
    assert len(eps) == 7 and {e["split"] for e in eps} == {"train", "test"}
    first = eps[0]
    assert first["loss_mask"] == [0, 0, 0, 1, 1, 1, 0, 0, 1, 1, 1, 1]
    assert "".join(first["pieces"]) == decode(range(1, 13))
    # the sampled log-probs where the policy sampled, none elsewhere
    assert first["layers"]["logprob"][:4] == [None, None, None, -0.5]
    assert first["layers"]["ratio"][3] == 1.1 and first["reward"] == 1.0
    assert first["tool_errors"] == 0 and eps[1]["tool_errors"] == 1


def test_a_killed_or_corrupted_run_reports_what_is_readable_and_names_the_rest(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    d = write_run(tmp_path / "run")
    metrics = d / "metrics.jsonl"
    with open(metrics, "ab") as f:
        f.write(b"garbage that is not json\n")
        f.write(b'{"phase": "rl", "step": 3.0, "reward": \xff\xfe}\n')  # not UTF-8
        f.write(b"[1, 2, 3]\n")
        f.write(b'{"phase": "rl", "step": 4.0, "reward": NaN}\n')  # JSON's NaN: kept, as None
        f.write(b'{"phase": "rl", "step": 5.0, "rew')  # killed mid-write
    traj = d / "trajectories.jsonl"
    good = traj.read_bytes().splitlines(keepends=True)
    bad_mask = json.loads(good[0])
    bad_mask["loss_mask"] = bad_mask["loss_mask"][:-1]
    with open(traj, "wb") as f:
        f.write(good[0])
        f.write(b"\x80\x81 not utf-8\n")
        f.write((json.dumps(bad_mask) + "\n").encode())
        f.writelines(good[1:])
        f.write(good[1][: len(good[1]) // 2])  # torn last line
    (d / "summary.json").write_text('{"task": "world", "eval_after": ')

    run = load_run(d)
    assert run["rl"]["step"] == [0.0, 1.0, 2.0, 4.0]
    assert run["rl"]["reward"][-1] is None
    assert len(run["episodes"]) == 7 and run["summary"] is None
    skipped = run["skipped"]
    expected = [  # metrics.jsonl had 5 lines, trajectories.jsonl 7
        (f"{d}/summary.json:", "unreadable (JSONDecodeError"),
        (f"{metrics}:6:", "not JSON (Expecting value, column 1)"),
        (f"{metrics}:7:", "not UTF-8 (byte 39 of the line)"),
        (f"{metrics}:8:", "a JSON list, not an object"),
        (f"{metrics}:10:", "truncated last line"),
        (f"{traj}:2:", "not UTF-8 (byte 0 of the line)"),
        (f"{traj}:3:", "12 token_ids but 11 loss_mask values"),
        (f"{traj}:10:", "truncated last line"),
    ]
    for where, why in expected:
        assert any(s.startswith(where) and why in s for s in skipped), (where, why, skipped)
    assert len(skipped) == len(expected)

    out = write_report([d])
    assert out == d / "report.html"
    err = capsys.readouterr().err
    assert f"skipped {metrics}:10: truncated last line (a run killed mid-write?)" in err
    assert err.count("agentr1 report: skipped") == len(skipped)
    page = out.read_text(encoding="utf-8")
    assert embedded(page)["runs"][0]["skipped"] == skipped  # shown in the page too


def test_not_a_run_directory_is_one_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ReportError, match="no such run directory"):
        load_runs([tmp_path / "absent"])
    with pytest.raises(ReportError, match=r"not a run directory \(no metrics.jsonl"):
        load_runs([tmp_path])


def test_the_page_is_self_contained_and_holds_its_data(tmp_path: Path) -> None:
    runs = load_runs([write_run(tmp_path / "a"), write_run(tmp_path / "b")])
    page = render(runs)
    assert embedded(page)["runs"] == json.loads(json.dumps(runs))
    assert not re.search(r"""(src|href|action)\s*=\s*["']?\s*(https?:)?//""", page, re.I)
    assert not re.search(r"<link\b|<script[^>]*\bsrc=|@import|url\(", page, re.I)
    assert "https://" not in page and page.count("http://") == 1  # the SVG namespace name
    assert "http://www.w3.org/2000/svg" in page
    assert "connect-src 'none'" in page  # opened from disk, the page may fetch nothing


def test_text_from_a_run_is_data_never_markup(tmp_path: Path) -> None:
    """A tool result (and so the tokens of its response) that holds a closing script tag
    cannot end the data block or open a tag; it is read back exactly."""
    d = write_run(tmp_path / "run", content=INJECTION)
    page = render(load_runs([d]))
    assert "<script>alert" not in page and "<img" not in page
    assert page.count("</script>") == 2  # the data block's and the script's own
    data = embedded(page)
    assert data["runs"][0]["episodes"][0]["tool_log"][0]["content"] == INJECTION
    assert embed_json({"x": "\u2028</script>&"}) == '{"x": "\\u2028\\u003c/script\\u003e\\u0026"}'


def test_spread_keeps_first_and_last() -> None:
    assert spread([1, 2, 3], 5) == [1, 2, 3]
    assert spread(list(range(100)), 3) == [0, 50, 99]
    assert spread(list(range(5)), 1) == [4] and spread([1], 0) == []


def test_token_pieces_keep_a_split_character_whole() -> None:
    """Byte-level BPE may cut "é" (c3 a9) over two tokens: the first shows nothing, the
    second the whole character, and the pieces join to the decoded text."""
    table = {1: b"a", 2: b"\xc3", 3: b"\xa9", 4: b"b"}

    def dec(ids: Any) -> str:
        return b"".join(table[i] for i in ids).decode("utf-8", errors="replace")

    assert token_pieces([1, 2, 3, 4], dec) == ["a", "", "é", "b"]
    assert "".join(token_pieces([2, 3, 2], dec)) == dec([2, 3, 2])  # a torn end stays "�"


def test_skipped_reads_as_file_line_reason() -> None:
    assert str(Skipped("m.jsonl", 3, "not JSON")) == "m.jsonl:3: not JSON"
    assert str(Skipped("summary.json", 0, "unreadable")) == "summary.json: unreadable"

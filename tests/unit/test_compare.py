"""Paired comparison of two evaluations: hand-computed values, clear errors, the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agentr1.cli import main
from agentr1.eval.compare import compare_files, load_scores, paired, sign_test


def test_sign_test_matches_the_binomial_by_hand() -> None:
    # 9 disagreements, 1 against: P(X <= 1) = (1 + 9) / 2^9 = 10/512; two-sided doubles it
    assert sign_test(8, 1) == pytest.approx(20 / 512)
    assert sign_test(1, 8) == sign_test(8, 1)
    # 5 wins, 0 losses: 2 / 32
    assert sign_test(5, 0) == pytest.approx(1 / 16)
    assert sign_test(0, 0) == 1.0 and sign_test(4, 4) == 1.0


def test_paired_counts_and_means() -> None:
    a = {"q1": 1.0, "q2": 0.0, "q3": 0.0, "q4": 1.0}
    b = {"q1": 1.0, "q2": 1.0, "q3": 1.0, "q4": 0.0}
    r = paired(a, b, "em")
    assert (r.n, r.wins, r.losses, r.ties) == (4, 2, 1, 1)
    assert r.mean_a == 0.5 and r.mean_b == 0.75 and r.diff == pytest.approx(0.25)
    assert r.ci_low <= r.diff <= r.ci_high
    assert r.p_sign == pytest.approx(1.0)  # 2 vs 1: P(X <= 1) = 4/8, doubled -> 1
    assert not r.significant and "not significant" in r.line()


def test_a_clear_gain_is_significant_and_one_question_is_not() -> None:
    a = {f"q{i}": 0.0 for i in range(40)}
    one = {**a, "q0": 1.0}
    assert not paired(a, one).significant  # +2.5 points of EM on 40 questions is noise
    ten = {f"q{i}": float(i < 10) for i in range(40)}
    r = paired(a, ten)
    assert r.significant and r.ci_low > 0 and r.p_sign == pytest.approx(2 / 2**10)


def test_bootstrap_is_seeded() -> None:
    a = {f"q{i}": float(i % 3 == 0) for i in range(30)}
    b = {f"q{i}": float(i % 2 == 0) for i in range(30)}
    assert paired(a, b, seed=3) == paired(a, b, seed=3)


def test_different_questions_are_refused() -> None:
    with pytest.raises(ValueError, match=r"same questions: 1 only in A .*'q2'.*1 only in B"):
        paired({"q1": 1.0, "q2": 0.0}, {"q1": 1.0, "q3": 0.0})
    with pytest.raises(ValueError, match="no questions"):
        paired({}, {})


def _write(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_load_scores_filters_and_keys_by_split(tmp_path: Path) -> None:
    f = _write(
        tmp_path / "ep.jsonl",
        [
            {"label": "before", "split": "hotpotqa", "task_id": "1", "em": 0.0},
            {"label": "after", "split": "hotpotqa", "task_id": "1", "em": 1.0},
            {"label": "after", "split": "2wiki", "task_id": "1", "em": 0.0},
        ],
    )
    assert load_scores(f, "em", {"label": "after"}) == {"hotpotqa/1": 1.0, "2wiki/1": 0.0}
    with pytest.raises(ValueError, match=r"ep.jsonl:2: question 'hotpotqa/1' appears twice"):
        load_scores(f, "em")
    with pytest.raises(ValueError, match="no episodes with"):
        load_scores(f, "em", {"label": "step 3"})


def test_load_scores_names_file_and_line(tmp_path: Path) -> None:
    f = tmp_path / "bad.jsonl"
    f.write_text('{"task_id": "1", "em": 1}\n{oops\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:2: not JSON"):
        load_scores(f, "em")
    _write(f, [{"task_id": "1"}])
    with pytest.raises(ValueError, match=r"bad.jsonl:1: no field 'f1'"):
        load_scores(f, "f1")


def test_compare_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rows = [
        {"label": "after", "split": "s", "task_id": str(i), "em": 0.0, "f1": 0.1} for i in range(3)
    ]
    a = _write(tmp_path / "a.jsonl", rows)
    b = _write(tmp_path / "b.jsonl", [{**r, "em": 1.0, "f1": 0.5} for r in rows])
    assert main(["compare", str(a), str(b), "--where", "label=after"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("em: 0.000 -> 1.000 (+1.000") and "3 better, 0 worse" in out[0]
    assert out[1].startswith("f1: 0.100 -> 0.500")
    assert compare_files(a, b, ["em"])[0].wins == 3
    assert main(["compare", str(a), str(tmp_path / "missing.jsonl")]) == 2
    assert "missing.jsonl" in capsys.readouterr().err
    assert main(["compare", str(a), str(b), "--where", "label"]) == 2
    assert "KEY=VALUE" in capsys.readouterr().err


def test_common_pairs_the_shared_questions_only(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    row = {"label": "before", "split": "s", "em": 0.0, "f1": 0.0}
    small = _write(tmp_path / "small.jsonl", [{**row, "task_id": str(i)} for i in range(2)])
    big = _write(tmp_path / "big.jsonl", [{**row, "task_id": str(i), "em": 1.0} for i in range(5)])
    assert main(["compare", str(small), str(big)]) == 2
    assert "0 only in A (e.g. []), 3 only in B" in capsys.readouterr().err
    assert main(["compare", str(small), str(big), "--metric", "em", "--common"]) == 0
    assert "2 better, 0 worse, 0 same of 2" in capsys.readouterr().out
    (res,) = compare_files(big, small, ["em"], common=True)
    assert (res.n, res.mean_a, res.mean_b) == (2, 1.0, 0.0)

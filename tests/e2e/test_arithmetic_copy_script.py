"""`benchmarks/arithmetic_copy.py` runs on a model of the arithmetic example's own shape
and tokenizer, and counts every held-out problem once."""

from __future__ import annotations

from pathlib import Path

from agentr1.config import TinyModelConfig
from agentr1.tiny import build_and_save
from tests.benchmark_scripts import benchmark
from tests.e2e.test_examples import example


def test_an_untrained_model_neither_writes_the_program_nor_copies(tmp_path: Path) -> None:
    ex = example("arithmetic_python")
    texts = ex.make_task(ex.ArithmeticConfig(n_train=50, n_test=5)).tokenizer_texts()
    tiny = TinyModelConfig(vocab_size=600, split_digits=True, max_positions=256)
    model = build_and_save(tmp_path / "model", texts, tiny, seed=0)
    out = benchmark("arithmetic_copy").probe(str(model), max_tasks=4)
    assert out["tasks"] == 4
    assert out["program_exact"] == 0.0 and out["answer_copied"] == 0.0
    assert sum(int(v.split("/")[1]) for v in out["copied_by_digits"].values()) == 4

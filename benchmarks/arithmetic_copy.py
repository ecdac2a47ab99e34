"""Where the arithmetic example's warm start fails: the program, or the copy of the result.

Given a model of `examples/arithmetic_python.py` (a run's ``final_model``, or a warm
start saved after SFT), on the held-out problems of the recipe's task config:

- *program exact*: the greedy tool call after ``{"code": "`` is the problem's program;
- *answer copied*: given the call and a correct tool response, the greedy final answer
  is the tool's printed number (by the number's digits, 1-3).

A seed whose model runs the right program but does not copy the result gets no reward
from RL (benchmarks/RESULTS.md, "The cause is the answer copy").

    .venv/bin/python benchmarks/arithmetic_copy.py runs/arithmetic/final_model
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

import torch

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def probe(model_dir: str, max_tasks: int) -> dict[str, object]:
    """The two rates on the first ``max_tasks`` held-out problems."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    sys.path.insert(0, str(EXAMPLES))
    import arithmetic_python as ap

    from agentr1 import load_config

    config = load_config(ap.RECIPE, [])
    tasks = ap.make_task(ap.ArithmeticConfig(**config.task.config)).splits["test"][:max_tasks]
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()

    def greedy(prompt: str, new: int) -> str:
        ids = torch.tensor([tok(prompt)["input_ids"]])
        with torch.no_grad():
            out = model.generate(ids, max_new_tokens=new, do_sample=False)
        return tok.decode(out[0, ids.shape[1] :])

    program = 0
    copied, seen = Counter[int](), Counter[int]()
    for t in tasks:
        user = f"<|im_start|>user\n{t.question}<|im_end|>\n<|im_start|>assistant\n"
        head = ap.call("")[: -len('"}}</tool_call>')]
        program += greedy(user + head, 40).startswith(t.metadata["code"] + '"')
        final = ap.answer(t.answers[0])
        cut = final.index(t.answers[0])
        prompt = (
            user
            + ap.call(t.metadata["code"])
            + "<|im_end|>\n<|im_start|>user\n<tool_response>\n"
            + f"{t.answers[0]}\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
            + final[:cut]
        )
        digits = len(t.answers[0])
        seen[digits] += 1
        copied[digits] += greedy(prompt, 6).startswith(final[cut:])
    return {
        "tasks": len(tasks),
        "program_exact": program / len(tasks),
        "answer_copied": sum(copied.values()) / len(tasks),
        "copied_by_digits": {d: f"{copied[d]}/{seen[d]}" for d in sorted(seen)},
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("model", help="a model directory of the arithmetic example")
    ap.add_argument("--max-tasks", type=int, default=100)
    args = ap.parse_args(argv)
    print(probe(args.model, args.max_tasks))


if __name__ == "__main__":
    main()

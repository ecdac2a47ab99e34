"""Does a policy read its search results? A counterfactual probe on 1-hop world questions.

For each 1-hop test question, the oracle's first turn and the real search result are put
in the context; then the answer in that search result is swapped for another entity of
the same kind (another city, person, ...). A policy that reads answers with whatever the
passage says; one that guesses from the question alone keeps its answer.

    .venv/bin/python experiments/smollm2_multihop/reading_probe.py runs/demo/final_model

Prints: EM on the true passages, "follows" = fraction of swapped passages whose new value
the policy answers, and "unchanged" = fraction where the answer did not move at all.
"""

from __future__ import annotations

import argparse
import random

from agentr1.backends.base import SamplingParams
from agentr1.backends.hf import HFGenerator
from agentr1.config import load_config
from agentr1.envs.parsers import HermesParser
from agentr1.models import load_model, load_tokenizer
from agentr1.rewards.qa import exact_match
from agentr1.rollout import ChatFormat, RolloutConfig, run_rollout
from agentr1.tasks import task_config
from agentr1.tasks.world import World, oracle_generator, world_env
from agentr1.templates import CHATML_TOOLS_MINIMAL


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("model", help="a model directory saved by a run (e.g. runs/demo/final_model)")
    ap.add_argument("--n", type=int, default=40)
    args = ap.parse_args()
    cfg = load_config(None)
    wcfg = task_config(cfg.task)
    world = World.build(wcfg.world)
    tok = load_tokenizer(args.model)
    model = load_model(args.model)
    chat = ChatFormat.from_hf(tok, chat_template=CHATML_TOOLS_MINIMAL)
    gen = HFGenerator(model, tok)
    tasks = [t for t in world.tasks("test") if t.metadata["hops"] == 1][: args.n]
    # The oracle's episode; the context is everything before its answer turn.
    rc = RolloutConfig(max_turns=3, max_tokens_per_turn=64, max_context=1024)
    groups = run_rollout(
        tasks, world_env(world, top_k=wcfg.top_k), oracle_generator(world, chat), chat, rc
    )
    rng = random.Random(0)
    parser = HermesParser()
    params = SamplingParams(max_new_tokens=24, temperature=0.0, stop_token_ids=chat.stop_token_ids)
    em = follows = unchanged = 0
    for g in groups:
        traj, task = g.trajectories[0], g.task
        gold = task.answers[0]
        context = chat.decode(traj.token_ids[: traj.turns[-1].start])
        same_kind = [
            a
            for t in world.tasks("train")
            for a in t.answers
            if t.metadata.get("type") == task.metadata.get("type") and a != gold
        ]
        swap = rng.choice(same_kind) if same_kind else gold
        outs = gen.generate(
            [chat.encode(context), chat.encode(context.replace(gold, swap))], params
        )
        a_true, a_swap = (parser.parse(chat.assistant_text(o.token_ids)).answer for o in outs)
        em += exact_match(a_true, [gold]) == 1.0
        follows += exact_match(a_swap, [swap]) == 1.0
        unchanged += a_true == a_swap
    n = len(groups)
    print(
        f"questions {n}  EM(true passage) {em / n:.2f}  follows swapped value {follows / n:.2f}  "
        f"answer unchanged by the swap {unchanged / n:.2f}"
    )


if __name__ == "__main__":
    main()

"""Re-test a comparison on fresh questions: greedy evals of several models on eval-split
questions that no run of the recipe has seen, then each model paired against the first.

A difference first seen on the recipe's ``task.config.n_eval`` questions per split (and
tested there) is a hypothesis; this script tests it again on new data. The fresh
questions of a split are the next ``--take`` in the split's seeded order (the recipe's own
n_eval come first, `agentr1.data.split`), minus every question the recipe trains on (by id
or normalized question): a split whose file is also a training file (2Wiki in
``recipes/multihop_smollm2.yaml``) has almost none left, and says so.

    PYTHONPATH=. .venv/bin/python experiments/smollm2_multihop/fresh_eval.py \\
        --out runs/multihop_real2/fresh \\
        --model warm=runs/multihop_real2/warm_start/final_model \\
        --model grpo40=runs/multihop_real2/grpo/final_model \\
        --take 200 --splits hotpotqa musique task.config.data_dir=../shared/data/raw

A second re-test on still newer questions takes more and skips those of the first
(``--take 400 --skip 185``: the first took 200 and found 185 fresh).

When the eval files run out, ``--train-pool RL_DRAWS`` tests on the recipe's training
questions that no model of the comparison trained on: neither the warm start's
demonstrations nor the first RL_DRAWS RL draws (`untrained_tasks`; a model whose run drew
more is refused). The recipe's pool holds 1,092 questions; 400 demonstrated and the first
200 draws leave 577:

    PYTHONPATH=. .venv/bin/python experiments/smollm2_multihop/fresh_eval.py \\
        --out runs/multihop_real2L/pool \\
        --model warm=runs/multihop_real2/warm_start/final_model \\
        --model grpo=runs/multihop_real2L/grpo/final_model \\
        --train-pool 200 --take 1000 task.config.data_dir=../shared/data/raw

When the recipe's files are used up, ``--questions FILE...`` tests on questions of other
files (question-only ones too) that no recipe file holds and whose answer a search of the
question finds (`outside_tasks`; a rule that looks at no model):

    PYTHONPATH=. .venv/bin/python experiments/smollm2_multihop/fresh_eval.py \\
        --out runs/multihop_real2W/outside \\
        --questions train_mixed/r1searcher_train_stage2_8148.jsonl --take 1000 \\
        --model warm=runs/multihop_real2/warm_start/final_model \\
        --model grpo45=runs/multihop_real2W/grpo/final_model task.config.data_dir=../shared/data/raw

``--answer-top-k 20 --answer-after 5`` keeps the questions whose answer is in the top 20
but not the top 5: a pool apart from the first, where one search of the question does not
show the answer.

Writes ``OUT/<name>.jsonl`` (one record per question, `agentr1.eval.compare` reads them)
and ``OUT/fresh.md`` (per split and overall: EM, F1 and the paired lines). A model whose
records exist is not evaluated again.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import TYPE_CHECKING

from agentr1 import Task
from agentr1.config import Config, load_config
from agentr1.fileio import write_atomic
from agentr1.rewards import ANSWER_METRICS
from agentr1.tasks import task_config

METRICS = tuple(ANSWER_METRICS)

if TYPE_CHECKING:
    from collections.abc import Sequence

    from agentr1.data import QASample
    from agentr1.eval.compare import Paired
    from agentr1.retrieval import Passage

RECIPE = Path(__file__).resolve().parents[2] / "recipes" / "multihop_smollm2.yaml"


def fresh_tasks(
    cfg: Config, take: int, splits: list[str], skip: int = 0
) -> tuple[dict[str, list[Task]], str]:
    """split -> the fresh tasks (see the module docstring), and a line saying how many of
    the next ``take`` were dropped for being training questions.

    ``skip`` drops the first fresh tasks of each split: those of an earlier run with
    ``--take`` T are the first ``len`` of any later one with a larger take, because the
    seeded order does not depend on how many are taken. A second re-test then never meets
    a question the first one saw."""
    import dataclasses

    from agentr1.data import normalize_question, seeded_rank
    from agentr1.tasks.multihop_qa import load_qa_data

    qa = task_config(cfg.task)
    if skip < 0 or take <= 0:
        raise ValueError(f"--take must be positive and --skip at least 0 (got {take}, {skip})")
    if qa.n_eval <= 0:
        raise ValueError("task.config.n_eval is 0: every question is already an eval question")
    bad = [name for name in splits if name not in qa.eval_files]
    if bad:
        raise ValueError(
            f"--splits: {bad[0]!r} is not an eval split of the recipe "
            f"(it has {', '.join(qa.eval_files)})"
        )
    used = load_qa_data(qa).tasks
    wider = load_qa_data(dataclasses.replace(qa, n_eval=qa.n_eval + take)).tasks
    seen_ids = {t.id for ts in used.values() for t in ts}
    seen_questions = {normalize_question(t.question) for ts in used.values() for t in ts}
    out: dict[str, list[Task]] = {}
    notes = []
    for name in splits:
        # Not a slice, and re-sorted: a sample that covers a whole file comes back in file
        # order, and the first n_eval of the seeded order are the recipe's eval questions.
        before = {t.id for t in used[name]}
        new = sorted(
            (t for t in wider[name] if t.id not in before),
            key=lambda t: seeded_rank(qa.split_seed, t.id),
        )
        fresh = [
            t
            for t in new
            if t.id not in seen_ids and normalize_question(t.question) not in seen_questions
        ]
        out[name] = fresh[skip:]
        skipped = f" after skipping the first {skip}" if skip else ""
        notes.append(f"{name}: {len(out[name])} fresh of the next {len(new)}{skipped}")
    return out, "; ".join(notes)


def untrained_tasks(
    cfg: Config, rl_draws: int, take: int, skip: int = 0
) -> tuple[dict[str, list[Task]], str]:
    """``pool_<dataset>`` -> the recipe's training questions that neither its warm start's
    demonstrations (`demo_picks`) nor its first ``rl_draws`` RL draws (`TaskSampler`,
    ``train.seed``) used; a line saying how many. `load_qa_data` already keeps the training
    questions unique and apart from the eval ones (by id and normalized question), so
    leaving out ids is enough.

    An RL run of S steps draws S x ``train.tasks_per_step`` questions, in the same seeded
    order whatever S, so excluding the first ``rl_draws`` covers every run that drew no
    more. The pool is taken in the seeded order (`seeded_rank`): ``skip`` drops its first
    questions, ``take`` caps the rest, so later re-tests can continue where one stopped."""
    from agentr1 import TaskSampler, demo_picks
    from agentr1.tasks.multihop_qa import load_qa_data

    if skip < 0 or take <= 0 or rl_draws < 0:
        raise ValueError(
            f"--take must be positive, --skip and --train-pool at least 0 "
            f"(got {take}, {skip}, {rl_draws})"
        )
    qa = task_config(cfg.task)
    train = load_qa_data(qa).tasks["train"]
    demos = demo_picks([train], cfg.sft.demos, cfg.train.seed)[0] if cfg.sft.enabled else []
    drawn = TaskSampler(train, cfg.train.seed).sample(rl_draws) if train else []
    used = {t.id for t in [*demos, *drawn]}
    pool = [t for t in train if t.id not in used]
    out, taken = take_by_dataset(pool, "pool_", qa.split_seed, take, skip)
    note = (
        f"training pool: {len(pool)} of {len(train)} questions untrained on (minus "
        f"{len({t.id for t in demos})} demonstrated and {len({t.id for t in drawn})} drawn by "
        f"the first {rl_draws} RL draws); {taken}"
    )
    return out, note


def take_by_dataset(
    tasks: list[Task], prefix: str, seed: int, take: int, skip: int
) -> tuple[dict[str, list[Task]], str]:
    """``tasks`` in the seeded order (`seeded_rank`), the first ``skip`` dropped and at
    most ``take`` kept, grouped as ``<prefix><dataset>``; and the note's words for it
    ("taking N[ after skipping the first S]; <group>: n; ...")."""
    from agentr1.data import seeded_rank

    picked = sorted(tasks, key=lambda t: seeded_rank(seed, t.id))[skip : skip + take]
    out: dict[str, list[Task]] = {}
    for t in picked:
        out.setdefault(f"{prefix}{t.metadata.get('dataset', 'qa')}", []).append(t)
    words = (
        f"taking {len(picked)}"
        + (f" after skipping the first {skip}" if skip else "")
        + "".join(f"; {name}: {len(ts)}" for name, ts in sorted(out.items()))
    )
    return out, words


def outside_tasks(
    cfg: Config,
    files: list[str],
    take: int,
    skip: int = 0,
    answer_top_k: int = 5,
    answer_after: int = 0,
    drop_yes_no: bool = False,
    max_answer_chance: float = 1.0,
    drop_answer_in_question: bool = False,
) -> tuple[dict[str, list[Task]], str]:
    """``q_<dataset>`` -> questions of ``files`` (any question format; question-only files
    are the point) that no file of the recipe holds, kept only when a search of the
    question itself finds the answer; a line saying how many.

    Question-only files have no context paragraphs in the corpus, so most of their questions
    cannot be answered from it (PROVENANCE.md: 6-28%). The filter keeps a question when
    any of its answers is in the title or the text, clipped as the search tool clips it
    (``task.passage_words``), of the recipe retriever's top ``answer_top_k`` passages for
    the question (`cover_exact_match`). The filter looks at no model, so a paired
    comparison on the kept questions is fair; it does favour questions one search can
    start on. ``answer_after`` K drops the questions whose answer is already in the top K,
    for a pool the first pool does not overlap (``answer_top_k`` 10, ``answer_after`` 5:
    the answer first shows at ranks 6-10, so one search of the question with the tool's
    top-k of at most 5 does not show it). ``drop_yes_no`` leaves out the questions whose
    answer is "yes" or "no": the word in a passage is no evidence, so the rule admits "no"
    by chance and almost never "yes" (all 96 yes/no questions of the 716 pool of
    NOTES.md are "no"), and a model that always says "no" scores 1.0 on them.
    ``max_answer_chance`` P generalizes that: it drops a question when any of its answers
    would be among ``answer_top_k`` passages drawn at random with probability above P
    (`answer_chances`: "American" is in 21% of the corpus's passages, so in a random top 5
    69% of the time; 234 of the 716's 286 nationality questions are "American").
    ``drop_answer_in_question`` leaves out the questions that name one of their answers
    (`answer_in_question`): mostly comparisons ("Which film came out first, X or Y?"),
    where naming either option is right half the time without reading anything (26 of
    the 272 chance-free questions of NOTES.md, 25 of them comparisons: the RL models
    learned to answer them with a name the question gives and gained most of their points
    there).

    Questions are deduplicated across ``files`` (`dedupe`), dropped when their id or
    normalized question is in any train or eval file of the recipe (all of each file, not
    only the sampled splits), filtered, then taken in the seeded order (`seeded_rank`,
    ``task.config.split_seed``): ``skip`` drops the first, ``take`` caps the rest."""
    from agentr1.data import Loader, dedupe, normalize_question, resolve_entry
    from agentr1.retrieval import retriever_from_spec
    from agentr1.rewards.qa import cover_exact_match
    from agentr1.tasks.multihop_qa import data_root, load_qa_data
    from agentr1.tools.search import clip_words

    if skip < 0 or take <= 0 or answer_top_k <= 0:
        raise ValueError(
            f"--take and --answer-top-k must be positive and --skip at least 0 "
            f"(got {take}, {answer_top_k}, {skip})"
        )
    if not 0.0 <= max_answer_chance <= 1.0:
        raise ValueError(f"--max-answer-chance must be in [0, 1] (got {max_answer_chance})")
    if not 0 <= answer_after < answer_top_k:
        raise ValueError(
            f"--answer-after must be at least 0 and below --answer-top-k "
            f"(got {answer_after}, {answer_top_k})"
        )
    qa = task_config(cfg.task)
    load = Loader()
    data = load_qa_data(qa, load)
    # Every question of every recipe file, not only those its splits sampled.
    recipe = [s for p in {p for ps in data.files.values() for p in ps} for s in load(p)]
    seen_ids = {s.id for s in recipe}
    seen_questions = {normalize_question(s.question) for s in recipe}
    root = data_root(qa)
    paths = [p for f in files for p in resolve_entry(f, root, "--questions")]
    read = [s for p in paths for s in load(p)]
    samples = dedupe(read)
    new = [
        s
        for s in samples
        if s.id not in seen_ids and normalize_question(s.question) not in seen_questions
    ]
    n_outside = len(new)
    if drop_yes_no:
        new = [s for s in new if not any(a.strip().lower() in ("yes", "no") for a in s.answers)]
    n_not_yes_no = len(new)
    if drop_answer_in_question:
        new = [s for s in new if not answer_in_question(s.question, s.answers)]
    n_no_answer_in_question = len(new)
    words = task_config(cfg.task).passage_words
    if max_answer_chance < 1.0:
        chances = answer_chances(data.passages, [list(s.answers) for s in new], words, answer_top_k)
        new = [s for s, c in zip(new, chances, strict=True) if c <= max_answer_chance]
    retriever = retriever_from_spec(qa.retriever, data.passages)
    hits = retriever.search_batch([s.question for s in new], answer_top_k)

    def found(sample: QASample, top: list[Passage]) -> bool:
        shown = " ".join(f"{p.title} {clip_words(p.text, words)}" for p in top)
        return cover_exact_match(shown, list(sample.answers))

    kept = [
        s
        for s, top in zip(new, hits, strict=True)
        if found(s, top) and not (answer_after and found(s, top[:answer_after]))
    ]
    out, taken = take_by_dataset([s.to_task() for s in kept], "q_", qa.split_seed, take, skip)
    note = (
        f"outside questions: {len(read)} in {len(paths)} file(s), {len(samples)} distinct, "
        f"{n_outside} in no recipe file, "
        + (f"{n_not_yes_no} not yes/no, " if drop_yes_no else "")
        + (
            f"{n_no_answer_in_question} not naming an answer in the question, "
            if drop_answer_in_question
            else ""
        )
        + (
            f"{len(new)} whose answers a random top {answer_top_k} shows with probability "
            f"<= {max_answer_chance:g}, "
            if max_answer_chance < 1.0
            else ""
        )
        + f"{len(kept)} with an answer in the top "
        f"{answer_top_k} passages for the question"
        + (f" but not in the top {answer_after}" if answer_after else "")
        + f"; {taken}"
    )
    return out, note


def answer_in_question(question: str, answers: Sequence[str]) -> bool:
    """Whether the question names one of ``answers`` (normalized, as whole words): the
    answer of "Which film came out first, X or Y?" is X or Y, so naming either is right
    half the time without reading anything."""
    from agentr1.rewards.qa import normalize_answer

    q = f" {normalize_answer(question)} "
    return any(a and f" {a} " in q for a in map(normalize_answer, answers))


def answer_chances(
    passages: list[Passage], answers: list[list[str]], words: int, k: int
) -> list[float]:
    """For each question's ``answers``: the probability that ``k`` passages drawn at random
    from ``passages`` show one of them (`cover_exact_match` on the title and the text
    clipped to ``words``, as the search tool shows a passage): 1 - (1 - df)^k with df the
    share of passages that contain the answer, the largest over the answers. A filter that
    keeps questions whose answer is in the top k is evidence of retrieval only when this
    is small."""
    from collections import defaultdict

    from agentr1.rewards.qa import normalize_answer
    from agentr1.tools.search import clip_words

    if not passages:
        raise ValueError("no passages to measure answers against")
    shown = [f" {normalize_answer(f'{p.title} {clip_words(p.text, words)}')} " for p in passages]
    index: dict[str, list[int]] = defaultdict(list)
    for i, text in enumerate(shown):
        for w in set(text.split()):
            index[w].append(i)
    cache: dict[str, float] = {}

    def df(answer: str) -> float:
        a = normalize_answer(answer)
        if a not in cache:
            # only passages holding the answer's rarest word can hold the answer
            rare = min((index.get(w, []) for w in a.split()), key=len, default=[])
            cache[a] = sum(f" {a} " in shown[i] for i in rare) / len(shown)
        return cache[a]

    return [max((1 - (1 - df(a)) ** k for a in ans), default=0.0) for ans in answers]


def delta_cells(em: Paired, f1: Paired) -> str:
    """Two markdown cells: the EM difference with its CI, better / worse and sign-test p;
    the F1 difference with its CI and p."""
    return (
        f"{em.diff:+.3f} [{em.ci_low:+.3f}, {em.ci_high:+.3f}], {em.wins}/{em.losses}, "
        f"{em.p_sign:.2g} | {f1.diff:+.3f} [{f1.ci_low:+.3f}, {f1.ci_high:+.3f}], {f1.p_sign:.2g}"
    )


def check_draws(model_dir: Path, rl_draws: int, seed: int) -> None:
    """Refuse a model whose run (``model_dir``'s parent, as the trainer writes it) drew
    more RL questions than ``rl_draws`` or drew them with another seed: its "untrained"
    pool would hold questions it trained on. Models from elsewhere are not checked."""
    run = model_dir.parent
    summary, config = run / "summary.json", run / "config.yaml"
    if not (summary.is_file() and config.is_file()):
        return
    import yaml

    cfg = yaml.safe_load(config.read_text()) or {}
    steps = int(json.loads(summary.read_text()).get("steps", 0))
    per_step = int(cfg.get("train", {}).get("tasks_per_step", 0))
    run_seed = cfg.get("train", {}).get("seed", seed)
    if steps and run_seed != seed:
        raise SystemExit(f"{run}: trained with train.seed={run_seed}, the pool assumes {seed}")
    if steps * per_step > rl_draws:
        raise SystemExit(
            f"{run}: {steps} RL steps x {per_step} questions = {steps * per_step} draws, more "
            f"than --train-pool {rl_draws}: some pool questions were trained on"
        )


def pool_scores(path: Path, metric: str, ids: set[str]) -> dict[str, float]:
    """``metric`` per question of the episode file ``path``, for the questions ``ids`` only.

    A model's records are written once and reused by later calls, so records written for a
    larger pool (the same questions with the yes/no ones, say) serve a subset of it without
    re-running the model; a file that lacks some of ``ids`` was written for other questions
    and is refused, naming it, rather than paired on fewer questions than the table says."""
    from agentr1.eval.compare import load_records

    try:
        records = load_records(path, [metric])
    except ValueError as e:
        raise SystemExit(str(e)) from None
    out = {k: float(r[metric]) for k, r in records.items() if str(r["task_id"]) in ids}
    missing = ids - {str(r["task_id"]) for r in records.values()}
    if missing:
        raise SystemExit(
            f"{path}: no record for {len(missing)} of the {len(ids)} questions (e.g. "
            f"{sorted(missing)[0]!r}); it was written for other questions - remove it to "
            "evaluate this model on these"
        )
    return out


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--model",
        action="append",
        required=True,
        metavar="NAME=DIR",
        help="a model to evaluate; the first is the reference of the pairing",
    )
    ap.add_argument(
        "--naive-rag",
        action="append",
        default=[],
        metavar="NAME=DIR",
        help="also Naive RAG with this model (top --rag-top-k passages for the question in "
        "the prompt, one greedy turn); Base Tool Call is a plain --model of the untrained one",
    )
    ap.add_argument("--rag-top-k", type=int, default=5, help="passages in the Naive RAG prompt")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--take", type=int, default=100, help="next questions per split")
    ap.add_argument(
        "--skip",
        type=int,
        default=0,
        help="drop the first N fresh questions per split (those of an earlier re-test)",
    )
    ap.add_argument("--splits", nargs="+", default=["hotpotqa", "musique"])
    ap.add_argument(
        "--train-pool",
        type=int,
        metavar="RL_DRAWS",
        help="test on the training questions no demonstration and none of the first "
        "RL_DRAWS RL draws used (`untrained_tasks`), instead of eval-split leftovers",
    )
    ap.add_argument(
        "--questions",
        nargs="+",
        metavar="FILE",
        help="test on these files' questions that no recipe file holds and whose answer a "
        "search of the question finds (`outside_tasks`), instead of eval-split leftovers",
    )
    ap.add_argument(
        "--answer-top-k",
        type=int,
        default=5,
        help="--questions: keep a question when its answer is in this many top passages",
    )
    ap.add_argument(
        "--answer-after",
        type=int,
        default=0,
        metavar="K",
        help="--questions: ...but not in the top K (a pool apart from the one of --answer-top-k K)",
    )
    ap.add_argument(
        "--drop-yes-no",
        action="store_true",
        help="--questions: leave out yes/no questions (the rule admits 'no' ones by chance)",
    )
    ap.add_argument(
        "--max-answer-chance",
        type=float,
        default=1.0,
        metavar="P",
        help="--questions: leave out questions whose answer a random top --answer-top-k "
        "would show with probability above P (common words: 'American', 'no'); e.g. 0.05",
    )
    ap.add_argument(
        "--drop-answer-in-question",
        action="store_true",
        help="--questions: leave out questions that name one of their answers "
        "('X or Y?' comparisons: naming either option is right half the time)",
    )
    ap.add_argument(
        "--also-against",
        nargs="+",
        default=[],
        metavar="NAME",
        help="also pair every other model with these (e.g. the baselines), on all questions",
    )
    ap.add_argument("--recipe", default=str(RECIPE))
    ap.add_argument("overrides", nargs="*", help="section.field=value")
    args = ap.parse_args()
    # --splits and --questions take several values, so overrides written after them land
    # there: move them.
    for name in ("splits", "questions", "also_against"):
        given = getattr(args, name) or []
        args.overrides += [s for s in given if "=" in s]
        setattr(args, name, [s for s in given if "=" not in s])
    if args.train_pool is not None and args.questions:
        ap.error("--train-pool and --questions choose the questions two ways: give one")
    models = [m.split("=", 1) for m in args.model]
    rag = [m.split("=", 1) for m in args.naive_rag]
    if any(len(m) != 2 or not m[0] for m in models + rag):
        ap.error("--model and --naive-rag take NAME=DIR")
    names = [name for name, _ in models + rag]
    if len(set(names)) != len(names):
        ap.error(f"every --model and --naive-rag needs its own NAME (got {', '.join(names)})")
    unknown = [n for n in args.also_against if n not in names]
    if unknown:
        ap.error(f"--also-against {', '.join(unknown)}: not a --model or --naive-rag NAME")

    from agentr1 import build_setup
    from agentr1.eval.compare import paired
    from agentr1.eval.evaluate import episode_record, evaluate
    from agentr1.tasks.multihop_qa.baselines import naive_rag

    base = load_config(args.recipe, args.overrides)
    if args.questions:
        tasks, note = outside_tasks(
            base,
            args.questions,
            args.take,
            args.skip,
            args.answer_top_k,
            args.answer_after,
            args.drop_yes_no,
            args.max_answer_chance,
            args.drop_answer_in_question,
        )
    elif args.train_pool is None:
        tasks, note = fresh_tasks(base, args.take, args.splits, args.skip)
    else:
        for _, path in models:
            check_draws(Path(path), args.train_pool, base.train.seed)
        tasks, note = untrained_tasks(base, args.train_pool, args.take, args.skip)
    print(note, flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    rag_names = {name for name, _ in rag}
    ids = {t.id for ts in tasks.values() for t in ts}
    for name, path in models + rag:
        records = args.out / f"{name}.jsonl"
        if records.exists():
            pool_scores(records, "em", ids)  # refuse a file for other questions before any eval
            continue
        setup = build_setup(load_config(args.recipe, [*args.overrides, f"model.path={path}"]))
        setup.policy.eval()
        lines = []
        for split, ts in tasks.items():
            t0 = time.perf_counter()
            if name in rag_names:
                res = naive_rag(
                    ts,
                    setup.task.tools[0].retriever,
                    setup.generator,
                    setup.chat,
                    top_k=args.rag_top_k,
                    rollout=base.rollout,
                    passage_words=task_config(base.task).passage_words,
                )
            else:
                res = evaluate(
                    ts,
                    setup.make_env,
                    setup.generator,
                    setup.chat,
                    base.rollout,
                    0.0,
                    batch_tasks=base.eval.batch_tasks,
                    metrics=setup.task.metric_names,
                    breakdown=setup.task.breakdown,
                )
            by_id = {t.id: t for t in ts}
            lines += [
                json.dumps({"split": split, **episode_record(t, by_id[t.task_id], METRICS)})
                for t in res.trajectories
            ]
            g = res.by_group["all"]
            print(
                f"{name} {split}: EM {g['em']:.3f} F1 {g['f1']:.3f} tool calls "
                f"{g['tool_calls']:.2f} ({len(ts)} q, {time.perf_counter() - t0:.0f} s)",
                flush=True,
            )
        write_atomic(records, "\n".join(lines) + "\n")

    ref = models[0][0]
    scores = {
        (name, m): pool_scores(args.out / f"{name}.jsonl", m, ids)
        for name, _ in models + rag
        for m in ("em", "f1")
    }
    md = [
        f"Fresh questions ({note}); greedy; each model paired against `{ref}`.",
        "",
        "| model | questions | n | EM | F1 | EM Δ [CI], better/worse, p | F1 Δ [CI], p |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, _ in models + rag:
        for title, keep in [*((s, (s,)) for s in tasks), ("all", tuple(tasks))]:
            em, f1 = (
                paired(
                    {k: v for k, v in scores[(ref, m)].items() if k.split("/", 1)[0] in keep},
                    {k: v for k, v in scores[(name, m)].items() if k.split("/", 1)[0] in keep},
                    m,
                )
                for m in ("em", "f1")
            )
            vs = delta_cells(em, f1) if name != ref else "reference |"
            md.append(f"| {name} | {title} | {em.n} | {em.mean_b:.3f} | {f1.mean_b:.3f} | {vs} |")
    for other in args.also_against:
        md += [
            "",
            f"Each model paired against `{other}`, all questions:",
            "",
            f"| model | n | `{other}` EM | EM | EM Δ [CI], better/worse, p | F1 Δ [CI], p |",
            "|---|---|---|---|---|---|",
        ]
        for name in (n for n in names if n != other):
            em, f1 = (paired(scores[(other, m)], scores[(name, m)], m) for m in ("em", "f1"))
            md.append(
                f"| {name} | {em.n} | {em.mean_a:.3f} | {em.mean_b:.3f} | {delta_cells(em, f1)} |"
            )
    text = "\n".join(md) + "\n"
    (args.out / "fresh.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()

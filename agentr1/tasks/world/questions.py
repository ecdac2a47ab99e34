"""Question sampling: chains, comparisons and kin inferences drawn from a `World`.

``hops`` is the number of searches the oracle needs. Types, in the HotpotQA / 2Wiki /
MuSiQue styles:

    single         1 hop   "Where was Bryn Carrow born?"
    bridge         2 hops  "The director of The Silent Harbor was born in which city?"
    compositional  3+ hops "In which country is the birthplace of the director of ...?"
    comparison     2-4     "Who was born first, A or B?", "Which film has the director
                           who was born first, F1 or F2?"
    inference      2-4     "Who is the maternal grandfather of X?" (composed kin relations)

Each question comes with a `Plan` (what the oracle searches and reads). `draw_splits`
draws every split from the world's one `random.Random`, so the same seed gives the same
questions. Imports no torch.
"""

from __future__ import annotations

import functools
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from agentr1.tasks.world.schema import (
    ATTR,
    ATTRIBUTES,
    BRIDGE_COMPARE,
    FIRST,
    KIN,
    KIN_TERMS,
    REL,
    RELATIONS,
    TYPES_BY_HOP,
    Attribute,
    Relation,
    words,
)

if TYPE_CHECKING:
    from agentr1.tasks.world.world import Entity, World, WorldConfig


@dataclass(frozen=True)
class Step:
    """One search of the oracle and the fact it then reads from the found passage."""

    query: str | int
    """The entity name to search, or the index of an earlier step whose read value is it."""
    read: str
    """The fact (a key of `SENTENCES`' slots, e.g. ``born_in``) to read about that entity."""


@dataclass(frozen=True)
class Comparison:
    """How a comparison question turns two read values into an answer."""

    left: int
    """Index of the step whose read value is the left side's number."""
    right: int
    """Index of the step whose read value is the right side's number."""
    left_answer: str | int
    """The answer if the left side wins: a name, or the index of a step that read it."""
    right_answer: str | int
    """The answer if the right side wins."""
    want: Literal["min", "max"]
    """Whether the smaller or the larger value wins."""


@dataclass(frozen=True)
class Plan:
    """What an oracle does for one question: the searches, then how to answer."""

    steps: tuple[Step, ...]
    """One step per search, in order (``len(steps)`` is the question's hop count)."""
    answer: int | Comparison
    """The index of the step whose read value is the answer, or a comparison."""


@dataclass
class Draft:
    """A question before it becomes a `Task`."""

    key: tuple[object, ...]
    """Identity of the question's content (so "A or B" and "B or A" are one question)."""
    question: str
    """The question text."""
    answer: str
    """The gold answer."""
    type: str
    """One of `QUESTION_TYPES`."""
    plan: Plan
    """What the oracle does."""
    searches: list[str]
    """Entity names the oracle searches, in order (ground truth)."""


def person_name(rng: random.Random, last: str) -> str:
    return f"{rng.choice(FIRST)} {last}"


def generation_sizes(cfg: WorldConfig) -> list[int]:
    """People per generation; later ones are larger, so most have grandparents."""
    weights = [g + 2 for g in range(cfg.n_generations)]
    sizes = [cfg.n_people * w // sum(weights) for w in weights]
    sizes[-1] += cfg.n_people - sum(sizes)
    return sizes


def in_types(cfg: WorldConfig, hop: int) -> tuple[str, ...]:
    return tuple(t for t in TYPES_BY_HOP[hop] if t not in cfg.ood_types)


def ood_types(cfg: WorldConfig, hop: int) -> tuple[str, ...]:
    if hop in cfg.ood_hops:
        return TYPES_BY_HOP[hop]
    return tuple(t for t in TYPES_BY_HOP[hop] if t in cfg.ood_types)


def follow(world: World, start: Entity, path: Sequence[str]) -> list[Entity] | None:
    """The entities along ``path`` from ``start``; None if undefined or revisiting."""
    chain = [start]
    for key in path:
        target = chain[-1].facts.get(key)
        if target is None:
            return None
        nxt = world.by_name[str(target)]
        if nxt in chain:  # "the capital of the country of X" may be X itself
            return None
        chain.append(nxt)
    return chain


def chain_draft(
    world: World, chain: list[Entity], path: Sequence[str], qtype: str, text: str
) -> Draft:
    steps = [Step(chain[0].name, path[0])] + [Step(i - 1, path[i]) for i in range(1, len(path))]
    return Draft(
        key=("chain", chain[0].name, tuple(path)),
        question=text,
        answer=chain[-1].name,
        type=qtype,
        plan=Plan(tuple(steps), len(steps) - 1),
        searches=[e.name for e in chain[:-1]],
    )


def draw_chain(world: World, rng: random.Random, hops: int, qtype: str) -> Draft | None:
    path = rng.choice(chain_paths(hops))
    chain = follow(world, rng.choice(world.by_kind[REL[path[0]].subject]), path)
    if chain is None:
        return None
    np_ = chain[0].name
    for key in path[:-1]:
        np_ = REL[key].noun.format(x=np_)
    last = REL[path[-1]]
    text = (last.bridge if qtype == "bridge" else last.question).format(x=np_)
    return chain_draft(world, chain, path, qtype, text[0].upper() + text[1:])


def draw_inference(world: World, rng: random.Random, hops: int) -> Draft | None:
    kin = rng.choice([k for k in KIN_TERMS if len(k) <= hops])
    tail = rng.choice(tail_paths(hops - len(kin))) if hops > len(kin) else ()
    path = kin + tail
    chain = follow(world, rng.choice(world.by_kind["person"]), path)
    if chain is None:
        return None
    np_ = f"the {KIN_TERMS[kin]} of {chain[0].name}"
    if not tail:
        text = f"Who is {np_}?"
    else:
        for key in tail[:-1]:
            np_ = REL[key].noun.format(x=np_)
        text = REL[tail[-1]].question.format(x=np_)
    return chain_draft(world, chain, path, "inference", text[0].upper() + text[1:])


def draw_comparison(world: World, rng: random.Random, hops: int) -> Draft | None:
    want: Literal["min", "max"] = rng.choice(("min", "max"))
    sides: list[tuple[Entity, tuple[str, ...]]]
    if hops == 2:
        attr = rng.choice(ATTRIBUTES)
        a, b = rng.sample(world.by_kind[attr.subject], 2)
        sides = [(a, ()), (b, ())]
        opening = attr.ask_min if want == "min" else attr.ask_max
    elif hops == 3:
        rel, attr = rng.choice(MIXED_COMPARE)
        a = rng.choice(world.by_kind[attr.subject])
        b = rng.choice(world.by_kind[rel.subject])
        sides = [(a, ()), (b, (rel.key,))]
        rng.shuffle(sides)
        opening = attr.ask_min if want == "min" else attr.ask_max
    elif hops == 4:
        (rel_key, attr_key), openings = rng.choice(sorted(BRIDGE_COMPARE.items()))
        rel, attr = REL[rel_key], ATTR[attr_key]
        a, b = rng.sample(world.by_kind[rel.subject], 2)
        sides = [(a, (rel_key,)), (b, (rel_key,))]
        opening = openings[0] if want == "min" else openings[1]
    else:
        return None
    followed = [follow(world, start, path) for start, path in sides]
    chains = [c for c in followed if c is not None]
    if len(chains) != 2:
        return None
    ends = [c[-1] for c in chains]
    involved = [e.name for c in chains for e in c]
    if len(set(involved)) != len(involved):
        return None
    values = [int(e.facts[attr.key]) for e in ends]
    if values[0] == values[1]:
        return None  # a tie has no answer
    steps: list[Step] = []
    value_steps: list[int] = []
    answers: list[str | int] = []
    for (start, path), end in zip(sides, ends, strict=True):
        if path:
            steps.append(Step(start.name, path[0]))
            steps.append(Step(len(steps) - 1, attr.key))
            # 4 hops ask which *start* wins; 3 hops ask which compared entity wins.
            answers.append(start.name if hops == 4 else len(steps) - 2)
        else:
            steps.append(Step(start.name, attr.key))
            answers.append(end.name)
        value_steps.append(len(steps) - 1)
    pick = min if want == "min" else max
    win = values.index(pick(values))
    # 3 hops name the compared entity by a noun phrase ("the director of X").
    mentions = [
        REL[path[0]].noun.format(x=start.name) if path and hops == 3 else start.name
        for start, path in sides
    ]
    searches = [e.name for c in chains for e in c]
    return Draft(
        key=("cmp", attr.key, want, tuple(sorted((s.name, p) for s, p in sides))),
        question=f"{opening}, {mentions[0]} or {mentions[1]}?",
        answer=ends[win].name if hops != 4 else sides[win][0].name,
        type="comparison",
        plan=Plan(
            tuple(steps),
            Comparison(value_steps[0], value_steps[1], answers[0], answers[1], want),
        ),
        searches=searches,
    )


def draw(world: World, rng: random.Random, hops: int, qtype: str) -> Draft | None:
    if qtype in ("single", "bridge", "compositional"):
        return draw_chain(world, rng, hops, qtype)
    if qtype == "inference":
        return draw_inference(world, rng, hops)
    return draw_comparison(world, rng, hops)


def sample(
    world: World,
    rng: random.Random,
    cells: dict[int, tuple[str, ...]],
    n: int,
    seen: set[tuple[object, ...]],
    vocab: set[str] | None,
) -> list[Draft]:
    """``n`` new questions, even over hop counts, round-robin over types per hop.

    With ``vocab``, questions whose searches or answer need a word outside it are
    skipped (counted in `dropped_uncovered`).
    """
    hops = [h for h in sorted(cells) if cells[h]]
    if n and not hops:
        raise ValueError("a split has questions to draw but no (hops, type) to draw from")
    out: list[Draft] = []
    for j, hop in enumerate(hops):
        quota = n // len(hops) + (1 if j < n % len(hops) else 0)
        for i in range(quota):
            qtype = cells[hop][i % len(cells[hop])]
            for _ in range(world.config.max_draws):
                draft = draw(world, rng, hop, qtype)
                if draft is None or draft.key in seen:
                    continue
                if vocab is not None and not needed_words(draft.searches, draft.answer) <= vocab:
                    world.dropped_uncovered += 1
                    continue
                seen.add(draft.key)
                out.append(draft)
                break
            else:
                raise ValueError(
                    f"could not draw a new {hop}-hop {qtype} question in "
                    f"{world.config.max_draws} tries: enlarge the world or ask fewer"
                )
    return out


def draw_splits(world: World, rng: random.Random) -> dict[str, list[Draft]]:
    """The questions of every split, drawn in order (train first: its words are the
    vocabulary test questions must stay within)."""
    cfg = world.config
    in_cells = {h: in_types(cfg, h) for h in cfg.hops}
    ood_cells = {h: ood_types(cfg, h) for h in sorted(set(cfg.hops) | set(cfg.ood_hops))}
    seen: set[tuple[object, ...]] = set()
    train = sample(world, rng, in_cells, cfg.n_train, seen, None)
    vocab: set[str] = set()
    for d in train:
        vocab.update(words(d.question))
        vocab.update(needed_words(d.searches, d.answer))
    return {
        "train": train,
        "test": sample(world, rng, in_cells, cfg.n_test, seen, vocab),
        "test_ood": sample(world, rng, ood_cells, cfg.n_test_ood, seen, vocab),
    }


@functools.cache
def chain_paths(hops: int) -> list[tuple[str, ...]]:
    """Relation sequences of length ``hops`` for chain questions, in a fixed order.

    Parent-of-parent pairs are left to inference questions, and "the country of the
    capital of X" (always X) is never asked.
    """
    paths: list[tuple[str, ...]] = [(r.key,) for r in RELATIONS]
    for _ in range(hops - 1):
        paths = [
            (*p, r.key)
            for p in paths
            for r in RELATIONS
            if r.subject == REL[p[-1]].object
            and not (p[-1] in KIN and r.key in KIN)
            and not (p[-1] == "capital" and r.key == "country")
        ]
    return paths


@functools.cache
def tail_paths(length: int) -> list[tuple[str, ...]]:
    """What an inference question may ask about the relative: no further parents."""
    return [p for p in chain_paths(length) if REL[p[0]].subject == "person" and p[0] not in KIN]


MIXED_COMPARE: tuple[tuple[Relation, Attribute], ...] = tuple(
    (r, a) for r in RELATIONS for a in ATTRIBUTES if r.object == a.subject
)


def needed_words(searches: Sequence[str], answer: str) -> set[str]:
    return {w for text in [*searches, answer] for w in words(text)}


def vocabulary_coverage(world: World) -> set[str]:
    """Words a test or test_ood question needs the policy to write but train never shows.

    A question needs the words of its searches (entity names) and of its canonical answer;
    train shows the words of its questions, answers and searches. Empty is good: a model
    with a word-level vocabulary learned from train can write every test query and answer.
    """
    shown: set[str] = set()
    for t in world.tasks("train"):
        shown.update(words(t.question))
        shown.update(needed_words(world.gold_searches[t.id], t.answers[0]))
    needed: set[str] = set()
    for split in ("test", "test_ood"):
        for t in world.tasks(split):
            needed |= needed_words(world.gold_searches[t.id], t.answers[0])
    return needed - shown

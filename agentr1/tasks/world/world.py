"""The embedded multi-hop world: a seeded, fictional encyclopedia and its questions.

`World.build(WorldConfig(seed=...))` generates, deterministically and in well under a
second, a few hundred fictional entities (people over five generations, cities, countries,
companies, films, universities) with relations (born in, studied at, father, mother,
located in, capital, founded by, headquartered in, directed by) and numeric attributes
(birth year, population, founding and release years). Each fact becomes one `Passage`
(id ``w:<slug>:<key>``, title = the entity's name, text = the fact's sentence from
`SENTENCES`, e.g. "Bryn Carrow has father Idris Carrow."), which the search engine finds by
subject and relation ("father of Bryn Carrow"); ``passage_unit="entity"`` gives one passage
per entity instead. Questions of 1-4 hops (`agentr1.tasks.world.questions`) are sampled
from it, evenly by hop count.

Splits: ``train`` and ``test`` share one distribution (hops `WorldConfig.hops`, types not
in `WorldConfig.ood_types`) with disjoint questions; ``test_ood`` holds the held-out hop
counts and/or question types. `vocabulary_coverage` checks that each word a test question
needs (its searches and its answer) occurs in the training split, and generation only
keeps test questions for which that holds. Imports no torch.
"""

from __future__ import annotations

import functools
import random
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from agentr1.retrieval.base import Passage
from agentr1.tasks.world.questions import (
    Draft,
    Plan,
    draw_splits,
    generation_sizes,
    in_types,
    person_name,
)
from agentr1.tasks.world.schema import (
    CITY_PREFIX,
    CITY_SUFFIX,
    COMPANY_KIND,
    COMPANY_STEM,
    COUNTRY_PREFIX,
    COUNTRY_SUFFIX,
    FILM_ADJ,
    FILM_NOUN,
    FIRST,
    KIND_ORDER,
    LAST,
    MAX_HOPS,
    QUESTION_TYPES,
    SENTENCES,
    SPLITS,
    TYPES_BY_HOP,
    UNI_KIND,
    UNI_STEM,
    fact_noun,
    format_value,
    passage_id,
    search_query,
)
from agentr1.types import Task


@dataclass
class WorldConfig:
    """How big the world is and how its questions are split."""

    seed: int = 0
    """Seed of the one `random.Random` that draws everything: same seed, same world."""
    n_people: int = 200
    """People, spread over `n_generations` generations (each has a father and a mother
    from the generation before, except the first)."""
    n_generations: int = 5
    """Generations of people; kin questions need at least 3 (grandparents)."""
    n_cities: int = 60
    """Cities (one-word names, prefix + suffix)."""
    n_countries: int = 12
    """Countries; each gets at least one city, its capital."""
    n_companies: int = 50
    """Companies ("<Stem> <Kind>"), each with a founder, a city and a founding year."""
    n_films: int = 70
    """Films ("The <Adj> <Noun>"), each with a director and a release year."""
    n_universities: int = 20
    """Universities ("<Stem> <Kind>"), each with a city and a founding year."""
    n_train: int = 1800
    """Training questions, split evenly over `hops`."""
    n_test: int = 150
    """In-distribution test questions (disjoint from train), split evenly over `hops`."""
    n_test_ood: int = 100
    """Out-of-distribution test questions, split evenly over their hop counts."""
    hops: tuple[int, ...] = (1, 2, 3)
    """Hop counts of train and test."""
    ood_hops: tuple[int, ...] = (4,)
    """Hop counts held out of train/test; all their question types go to test_ood."""
    ood_types: tuple[str, ...] = ()
    """Question types held out of train/test; test_ood gets them at every hop count."""
    max_draws: int = 5000
    """Attempts to draw one new question before giving up (the world is too small)."""
    passage_unit: Literal["fact", "entity"] = "fact"
    """"fact": one passage per fact ("Bryn Carrow has father Idris Carrow."), found by
    searching the relation and the entity ("father of Bryn Carrow"); "entity": one passage
    per entity with all its facts, found by searching the name. With facts, reading a
    result is copying its one value; with entities the agent must also pick the right
    sentence, which a tiny model learns far more slowly (benchmarks/RESULTS.md)."""

    def validate(self) -> None:
        """Raise ValueError, with the reason, for a config that cannot make a sound world."""
        for name in ("hops", "ood_hops"):
            bad = [h for h in getattr(self, name) if h not in TYPES_BY_HOP]
            if bad:
                raise ValueError(f"{name} {bad}: questions have 1 to {MAX_HOPS} hops")
        if set(self.hops) & set(self.ood_hops):
            raise ValueError("hops and ood_hops overlap: test_ood would not be held out")
        bad_types = [t for t in self.ood_types if t not in QUESTION_TYPES]
        if bad_types:
            raise ValueError(f"unknown ood_types {bad_types}; known: {QUESTION_TYPES}")
        if not any(in_types(self, h) for h in self.hops):
            raise ValueError("no question type is left in distribution: train would be empty")
        if self.n_generations < 3:
            raise ValueError("n_generations < 3: kin (inference) questions need grandparents")
        sizes = generation_sizes(self)
        if min(sizes) < 2:
            raise ValueError("n_people too small: each generation needs a father and a mother")
        if (sizes[0] + 1) // 2 > len(LAST):
            raise ValueError(f"first generation too large: its men need {len(LAST)} surnames")
        families = (sizes[0] + 1) // 2
        if 1 + sum(-(-s // families) for s in sizes[1:]) > len(FIRST):
            raise ValueError("n_people too large for n_generations: a family runs out of names")
        limits = {
            "n_cities": len(CITY_PREFIX) * len(CITY_SUFFIX),
            "n_countries": min(self.n_cities, len(COUNTRY_PREFIX) * len(COUNTRY_SUFFIX)),
            "n_companies": len(COMPANY_STEM) * len(COMPANY_KIND),
            "n_films": len(FILM_ADJ) * len(FILM_NOUN),
            "n_universities": len(UNI_STEM) * len(UNI_KIND),
            "n_people": len(FIRST) * len(LAST) // 2,
        }
        for name, limit in limits.items():
            if not 2 <= getattr(self, name) <= limit:
                raise ValueError(f"{name} must be in [2, {limit}] (unique names from the pools)")
        if self.passage_unit not in ("fact", "entity"):
            raise ValueError(f"passage_unit must be 'fact' or 'entity', got {self.passage_unit!r}")
        for name in ("n_train", "n_test", "n_test_ood"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0")


@dataclass
class Entity:
    """One thing in the world; it gets one passage."""

    name: str
    """Unique name (also the passage title and the oracle's search query)."""
    kind: str
    """``person``, ``city``, ``country``, ``company``, ``film`` or ``university``."""
    facts: dict[str, str | int] = field(default_factory=dict)
    """Relation key -> entity name, attribute key -> number."""


class World:
    """A generated world: entities, passages, tasks by split, and one plan per task.

    Build it with `World.build`. Attributes:
        config: the config it was built from.
        entities: every entity, in passage order.
        passages: one passage per fact (`passage_id`: ``"w:<slug>:<key>"``) or, with
            ``passage_unit="entity"``, per entity (``"w:<slug>"``).
        plans: task id -> the oracle's `Plan`.
        gold_searches: task id -> the queries an oracle searches (ground truth; for
            checks such as `vocabulary_coverage`, never for the oracle itself).
        dropped_uncovered: test/test_ood candidates dropped because a word they need is
            not in the training split.
    """

    def __init__(self, config: WorldConfig) -> None:
        self.config = config
        self.entities: list[Entity] = []
        self.passages: list[Passage] = []
        self.plans: dict[str, Plan] = {}
        self.gold_searches: dict[str, list[str]] = {}
        self.index_texts: dict[str, str] = {}
        self.dropped_uncovered = 0
        self.by_name: dict[str, Entity] = {}
        self.by_kind: dict[str, list[Entity]] = {k: [] for k in KIND_ORDER}
        self._tasks: dict[str, list[Task]] = {s: [] for s in SPLITS}
        self._task_by_id: dict[str, Task] = {}

    # --------------------------------------------------------------------- public API
    @classmethod
    def build(cls, config: WorldConfig | None = None) -> World:
        """Generate the world of ``config`` (default `WorldConfig()`); deterministic."""
        config = config or WorldConfig()
        config.validate()
        world = cls(config)
        rng = random.Random(config.seed)
        world._make_entities(rng)
        world._make_passages()
        world._make_tasks(rng)
        return world

    def tasks(self, split: str) -> list[Task]:
        """The tasks of ``split`` ("train", "test" or "test_ood"), a new list."""
        if split not in self._tasks:
            raise KeyError(f"unknown split {split!r}; splits are {SPLITS}")
        return list(self._tasks[split])

    def task(self, task_id: str) -> Task:
        """The task with id ``task_id``."""
        return self._task_by_id[task_id]

    def entity(self, name: str) -> Entity:
        """The entity called ``name``."""
        return self.by_name[name]

    # --------------------------------------------------------------------- entities
    def _add(self, entity: Entity) -> Entity:
        self.entities.append(entity)
        self.by_name[entity.name] = entity
        self.by_kind[entity.kind].append(entity)
        return entity

    def _new_name(self, make: Callable[[], str]) -> str:
        """A fresh name that neither contains nor is contained in an existing name."""
        for _ in range(1000):
            name = make()
            low = name.lower()
            if all(low not in n.lower() and n.lower() not in low for n in self.by_name):
                return name
        raise ValueError("could not draw a fresh name; the world is too big for its pools")

    def _make_entities(self, rng: random.Random) -> None:
        cfg = self.config
        countries: list[Entity] = []
        for _ in range(cfg.n_countries):
            name = self._new_name(lambda: rng.choice(COUNTRY_PREFIX) + rng.choice(COUNTRY_SUFFIX))
            countries.append(self._add(Entity(name, "country")))
        populations = rng.sample(range(8_000, 2_500_000), cfg.n_cities)
        for i in range(cfg.n_cities):
            name = self._new_name(lambda: rng.choice(CITY_PREFIX) + rng.choice(CITY_SUFFIX))
            # The first cities found one country each (its capital); the rest fall anywhere.
            country = countries[i] if i < len(countries) else rng.choice(countries)
            city = self._add(Entity(name, "city", {"country": country.name}))
            city.facts["population"] = populations[i]
            if i < len(countries):
                country.facts["capital"] = name
        cities = self.by_kind["city"]
        years = rng.sample(range(1300, 1900), cfg.n_universities)
        for i in range(cfg.n_universities):
            name = self._new_name(lambda: f"{rng.choice(UNI_STEM)} {rng.choice(UNI_KIND)}")
            facts: dict[str, str | int] = {"located_in": rng.choice(cities).name}
            facts["established"] = years[i]
            self._add(Entity(name, "university", facts))
        self._make_people(rng)
        people = self.by_kind["person"]
        for _ in range(cfg.n_companies):
            name = self._new_name(lambda: f"{rng.choice(COMPANY_STEM)} {rng.choice(COMPANY_KIND)}")
            founder = rng.choice(people)
            facts = {"founder": founder.name, "hq": rng.choice(cities).name}
            facts["founded"] = int(founder.facts["birth_year"]) + rng.randint(25, 50)
            self._add(Entity(name, "company", facts))
        for _ in range(cfg.n_films):
            name = self._new_name(lambda: f"The {rng.choice(FILM_ADJ)} {rng.choice(FILM_NOUN)}")
            director = rng.choice(people)
            released = int(director.facts["birth_year"]) + rng.randint(25, 55)
            self._add(Entity(name, "film", {"released": released, "director": director.name}))
        self.entities.sort(key=lambda e: KIND_ORDER.index(e.kind))  # stable: passage order

    def _make_people(self, rng: random.Random) -> None:
        sizes = generation_sizes(self.config)
        cities = self.by_kind["city"]
        unis = self.by_kind["university"]
        # Each man of the first generation founds a family; children take the father's
        # surname. Children are dealt round-robin over the families, a son first in each,
        # so no family dies out or outgrows the first-name pool.
        founders = rng.sample(LAST, (sizes[0] + 1) // 2)
        others = [n for n in LAST if n not in founders] or list(LAST)
        previous: list[tuple[Entity, str]] = []  # (person, sex) of the generation before
        for gen, size in enumerate(sizes):
            current: list[tuple[Entity, str]] = []
            fathers = [p for p, s in previous if s == "m"]
            mothers = [p for p, s in previous if s == "f"]
            families = list(dict.fromkeys(f.name.split()[-1] for f in fathers))
            rng.shuffle(families)
            for i in range(size):
                facts: dict[str, str | int] = {"born_in": rng.choice(cities).name}
                if gen == 0:
                    sex = "m" if i % 2 == 0 else "f"
                    last = founders[i // 2] if sex == "m" else rng.choice(others)
                    facts["birth_year"] = rng.randint(1840, 1860)
                else:
                    last = families[i % len(families)]
                    sex = "m" if (i // len(families)) % 2 == 0 else "f"
                    father = rng.choice([f for f in fathers if f.name.endswith(" " + last)])
                    outside = [m for m in mothers if not m.name.endswith(" " + last)]
                    mother = rng.choice(outside or mothers)
                    older = max(int(father.facts["birth_year"]), int(mother.facts["birth_year"]))
                    facts["birth_year"] = older + rng.randint(20, 34)
                    facts["father"], facts["mother"] = father.name, mother.name
                facts["studied_at"] = rng.choice(unis).name
                name = self._new_name(functools.partial(person_name, rng, last))
                current.append((self._add(Entity(name, "person", facts)), sex))
            previous = current

    def _make_passages(self) -> None:
        for e in self.entities:
            slots = {"name": e.name} | {k: format_value(k, v) for k, v in e.facts.items()}
            facts: list[tuple[str, str]] = []  # (fact key, sentence)
            for template in SENTENCES[e.kind]:
                needed = re.findall(r"\{(\w+)\}", template)
                if all(k in slots for k in needed):
                    facts.append((needed[-1], template.format(**slots)))
            if self.config.passage_unit == "entity":
                text = " ".join(sentence for _, sentence in facts)
                self.passages.append(Passage(passage_id(e.name), e.name, text))
                continue
            for key, sentence in facts:
                p = Passage(passage_id(e.name, key), e.name, sentence)
                self.passages.append(p)
                self.index_texts[p.id] = f"{e.name} {fact_noun(key)}"

    def index_text(self, passage: Passage) -> str:
        """What the world's search engine indexes for a passage: for a fact, its subject
        and relation (not its value, so "father of Bryn Carrow" finds Bryn's father, not a
        fact whose value is Bryn); for an entity passage, its title and text."""
        return self.index_texts.get(passage.id, f"{passage.title} {passage.text}")

    def _make_tasks(self, rng: random.Random) -> None:
        cfg = self.config
        drafts = draw_splits(self, rng)
        for split, items in drafts.items():
            rng.shuffle(items)
            for i, d in enumerate(items):
                task = Task(
                    id=f"world{cfg.seed}-{split}-{i:05d}",
                    question=d.question,
                    answers=[d.answer],
                    metadata={
                        "hops": len(d.plan.steps),
                        "type": d.type,
                        "dataset": "world",
                        "split": split,
                        "supporting": self._supporting(d),
                    },
                )
                self._tasks[split].append(task)
                self._task_by_id[task.id] = task
                self.plans[task.id] = d.plan
                unit = cfg.passage_unit
                self.gold_searches[task.id] = [
                    search_query(name, step.read, unit)
                    for name, step in zip(d.searches, d.plan.steps, strict=True)
                ]

    def _supporting(self, d: Draft) -> list[str]:
        """Passage ids of the evidence: one per step (the fact it reads, or its entity)."""
        if self.config.passage_unit == "entity":
            return [passage_id(name) for name in d.searches]
        return [passage_id(n, st.read) for n, st in zip(d.searches, d.plan.steps, strict=True)]

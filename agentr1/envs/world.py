"""The embedded multi-hop world: a seeded, fictional encyclopedia and its questions.

`World.build(WorldConfig(seed=...))` generates, deterministically and in well under a
second, a few hundred fictional entities (people over five generations, cities, countries,
companies, films, universities) with relations (born in, studied at, father, mother,
located in, capital, founded by, headquartered in, directed by) and numeric attributes
(birth year, population, founding and release years). Each fact becomes one `Passage`
(id ``w:<slug>:<key>``, title = the entity's name, text = the fact's sentence from
`SENTENCES`, e.g. "Bryn Carrow has father Idris Carrow."), which the search engine finds by
subject and relation ("father of Bryn Carrow"); ``passage_unit="entity"`` gives one passage
per entity instead. Questions of 1-4 hops in the HotpotQA / 2Wiki / MuSiQue styles are
sampled from it, evenly by hop count:

    single         1 hop   "Where was Bryn Carrow born?"
    bridge         2 hops  "The director of The Silent Harbor was born in which city?"
    compositional  3+ hops "In which country is the birthplace of the director of ...?"
    comparison     2-4     "Who was born first, A or B?", "Which film has the director
                           who was born first, F1 or F2?"
    inference      2-4     "Who is the maternal grandfather of X?" (composed kin relations)

``hops`` is the number of searches the oracle needs. Splits: ``train`` and ``test`` share
one distribution (hops `WorldConfig.hops`, types not in `WorldConfig.ood_types`) with
disjoint questions; ``test_ood`` holds the held-out hop counts and/or question types.

Names are built from small shared word pools (first x last names, city prefix + suffix,
"The <Adj> <Noun>" films, "<Stem> <Kind>" companies and universities), so that a model
with a word-level vocabulary can copy every word it must write: `vocabulary_coverage`
checks that each word a test question needs (its searches and its answer) occurs in the
training split, and generation only keeps test questions for which that holds.

`OraclePolicy` is a scripted agent for tests and SFT demonstrations: it searches each
entity and relation, reads each fact from the retrieved passage text with the world's own
sentence templates (never from the ground truth) and answers with what it read.
"""

from __future__ import annotations

import functools
import random
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

from agentr1.envs.parsers import search_call
from agentr1.retrieval.base import Passage
from agentr1.types import Task

QUESTION_TYPES: tuple[str, ...] = ("single", "bridge", "compositional", "comparison", "inference")
SPLITS: tuple[str, ...] = ("train", "test", "test_ood")
MAX_HOPS = 4
NO_RESULTS = "No results found."

# Which question types exist at each hop count.
TYPES_BY_HOP: dict[int, tuple[str, ...]] = {
    1: ("single",),
    2: ("bridge", "comparison", "inference"),
    3: ("compositional", "comparison", "inference"),
    4: ("compositional", "comparison", "inference"),
}

# ---------------------------------------------------------------------------- word pools
_FIRST = (
    "Aldric", "Bryn", "Caspian", "Delphine", "Elowen", "Faolan", "Galen", "Hestia", "Idris",
    "Juno", "Kestrel", "Lysander", "Maelis", "Niamh", "Orsino", "Perrin", "Quilla", "Rowan",
    "Sabine", "Tamsin", "Ulric", "Vesna", "Wren", "Xanthe", "Yorick", "Zephyr", "Anselm",
    "Briar", "Corin", "Dario", "Esme", "Fintan", "Greer", "Halvard", "Ilse", "Jorund",
    "Katya", "Leoric", "Mireille", "Nestor",
)  # fmt: skip
_LAST = (
    "Ashcombe", "Blackwood", "Carrow", "Dunmore", "Everly", "Fairbrook", "Greystone",
    "Hollis", "Ironwood", "Jessop", "Kimber", "Larkspur", "Merriweather", "Northcott",
    "Oakhurst", "Pembrook", "Quarrie", "Ravensworth", "Stroud", "Thackeray", "Underhill",
    "Vantreight", "Whitlock", "Yarrowby", "Zeller", "Alderton", "Brightwater", "Coldridge",
    "Dray", "Emberley",
)  # fmt: skip
_CITY_PREFIX = (
    "Vel", "Kor", "Ost", "Dra", "Mar", "Tal", "Ser", "Bran", "Cal", "Eld", "Fen", "Gal",
    "Hal", "Ith", "Lor", "Nor", "Pel", "Quen", "Rav", "Sil",
)  # fmt: skip
_CITY_SUFFIX = (
    "mora", "dun", "heim", "vale", "ford", "stad", "wick", "grad", "holm", "port", "anor",
    "esse",
)  # fmt: skip
_COUNTRY_PREFIX = (
    "Drov", "Kelt", "Ambr", "Sund", "Tyr", "Vost", "Marr", "Quor", "Brel", "Zan", "Ylv",
    "Corv", "Esk", "Lun",
)  # fmt: skip
_COUNTRY_SUFFIX = ("ania", "oria", "avia", "esia", "iland")
_COMPANY_STEM = (
    "Arvex", "Zentra", "Quillon", "Nexor", "Bravik", "Cyrano", "Dovetail", "Ferrox",
    "Glimmer", "Halcyon", "Ionis", "Jadeite", "Korvane", "Lumen", "Novalis", "Orbis",
    "Pyxis", "Quanta", "Rune", "Solace", "Tessel", "Umbra", "Vireo", "Wyvern",
)  # fmt: skip
_COMPANY_KIND = ("Dynamics", "Systems", "Labs", "Works", "Industries", "Holdings")
_FILM_ADJ = (
    "Silent", "Crimson", "Hollow", "Distant", "Gilded", "Broken", "Endless", "Hidden",
    "Last", "Midnight", "Pale", "Restless", "Scarlet", "Sunken", "Velvet", "Wandering",
)  # fmt: skip
_FILM_NOUN = (
    "Harbor", "Lantern", "Orchard", "Tide", "Compass", "Garden", "Mirror", "Citadel",
    "Voyage", "Winter", "Echo", "Feather", "Signal", "Threshold", "Archive", "Cathedral",
)  # fmt: skip
_UNI_STEM = (
    "Halden", "Morrow", "Ashfield", "Brackley", "Caldera", "Dunstan", "Elmswood",
    "Fairhaven", "Glenrock", "Harwick", "Invermay", "Kingsleigh", "Lochmere", "Marlow",
    "Norwood", "Penhallow",
)  # fmt: skip
_UNI_KIND = ("University", "College", "Institute")

# ------------------------------------------------------------------- facts and sentences
# One sentence per fact, "<name> has <noun> <value>.", with the nouns the compositional
# questions use ("the birthplace of the director of X"). Passages are written with them;
# the oracle reads facts back with regexes built from the very same strings, and restates
# what it read in this form (its notes). Reading then becomes copying: the value follows
# its relation noun directly, and within one passage the noun's last word is unique, so
# a model that writes "Bryn Carrow has mother" finds the value after "mother" in the
# passage (one token of match, the easiest lookup a small transformer learns).
SENTENCES: dict[str, tuple[str, ...]] = {
    "person": (
        "{name} has birthplace {born_in}.",
        "{name} has birth year {birth_year}.",
        "{name} has alma mater {studied_at}.",
        "{name} has father {father}.",
        "{name} has mother {mother}.",
    ),
    "city": ("{name} has country {country}.", "{name} has population {population}."),
    "country": ("{name} has capital {capital}.",),
    "company": (
        "{name} has founder {founder}.",
        "{name} has founding year {founded}.",
        "{name} has headquarters city {hq}.",
    ),
    "film": ("{name} has director {director}.", "{name} has release year {released}."),
    "university": (
        "{name} has home city {located_in}.",
        "{name} has founding year {established}.",
    ),
}
_KIND_ORDER = ("country", "city", "university", "person", "company", "film")


@dataclass(frozen=True)
class _Relation:
    """A functional relation between two entity kinds, with its question phrasings."""

    key: str
    """Fact key in `SENTENCES` and `Entity.facts`."""
    subject: str
    """Kind of entity the relation starts from."""
    object: str
    """Kind of entity it leads to."""
    noun: str
    """Noun phrase naming the object, e.g. "the birthplace of {x}"."""
    question: str
    """Single / compositional question asking for the object."""
    bridge: str
    """HotpotQA-style question asking for the object."""


_RELATIONS: tuple[_Relation, ...] = (
    _Relation(
        "born_in", "person", "city", "the birthplace of {x}", "Where was {x} born?",
        "{x} was born in which city?",
    ),
    _Relation(
        "studied_at", "person", "university", "the alma mater of {x}",
        "Which university did {x} attend?", "{x} studied at which university?",
    ),
    _Relation(
        "father", "person", "person", "the father of {x}", "Who is the father of {x}?",
        "Who was the father of {x}?",
    ),
    _Relation(
        "mother", "person", "person", "the mother of {x}", "Who is the mother of {x}?",
        "Who was the mother of {x}?",
    ),
    _Relation(
        "country", "city", "country", "the country of {x}", "In which country is {x}?",
        "{x} is located in which country?",
    ),
    _Relation(
        "capital", "country", "city", "the capital of {x}", "What is the capital of {x}?",
        "Which city is the capital of {x}?",
    ),
    _Relation(
        "founder", "company", "person", "the founder of {x}", "Who founded {x}?",
        "{x} was founded by whom?",
    ),
    _Relation(
        "hq", "company", "city", "the headquarters city of {x}",
        "In which city is {x} headquartered?", "{x} is headquartered in which city?",
    ),
    _Relation(
        "director", "film", "person", "the director of {x}", "Who directed {x}?",
        "{x} was directed by whom?",
    ),
    _Relation(
        "located_in", "university", "city", "the home city of {x}",
        "In which city is {x} located?", "{x} is located in which city?",
    ),
)  # fmt: skip
_REL = {r.key: r for r in _RELATIONS}
_KIN = ("father", "mother")


@dataclass(frozen=True)
class _Attribute:
    """A numeric fact that comparison questions compare."""

    key: str
    """Fact key in `SENTENCES` and `Entity.facts`."""
    subject: str
    """Kind of entity that has it."""
    ask_min: str
    """Question opening when the smaller value wins."""
    ask_max: str
    """Question opening when the larger value wins."""


_ATTRIBUTES: tuple[_Attribute, ...] = (
    _Attribute("birth_year", "person", "Who was born first", "Who was born later"),
    _Attribute(
        "founded", "company", "Which company was founded first",
        "Which company was founded more recently",
    ),
    _Attribute(
        "released", "film", "Which film was released first",
        "Which film was released more recently",
    ),
    _Attribute(
        "population", "city", "Which city has the smaller population",
        "Which city has the larger population",
    ),
    _Attribute(
        "established", "university", "Which university was founded first",
        "Which university was founded more recently",
    ),
)  # fmt: skip
_ATTR = {a.key: a for a in _ATTRIBUTES}

# 4-hop "bridge comparison" (2Wiki): both sides follow one relation, then compare.
# (relation, attribute) -> (opening when the smaller value wins, when the larger wins).
_BRIDGE_COMPARE: dict[tuple[str, str], tuple[str, str]] = {
    ("director", "birth_year"): (
        "Which film has the director who was born first",
        "Which film has the director who was born later",
    ),
    ("founder", "birth_year"): (
        "Which company has the founder who was born first",
        "Which company has the founder who was born later",
    ),
    ("father", "birth_year"): ("Whose father was born first", "Whose father was born later"),
    ("mother", "birth_year"): ("Whose mother was born first", "Whose mother was born later"),
    ("born_in", "population"): (
        "Who was born in the city with the smaller population",
        "Who was born in the city with the larger population",
    ),
    ("hq", "population"): (
        "Which company is headquartered in the city with the smaller population",
        "Which company is headquartered in the city with the larger population",
    ),
    ("located_in", "population"): (
        "Which university is in the city with the smaller population",
        "Which university is in the city with the larger population",
    ),
    ("capital", "population"): (
        "Which country has the capital with the smaller population",
        "Which country has the capital with the larger population",
    ),
    ("studied_at", "established"): (
        "Who attended the older university",
        "Who attended the younger university",
    ),
}

# Composed kin relations (2Wiki "inference"): parent sequence -> kin term.
_KIN_TERMS: dict[tuple[str, ...], str] = {
    ("father", "father"): "paternal grandfather",
    ("father", "mother"): "paternal grandmother",
    ("mother", "father"): "maternal grandfather",
    ("mother", "mother"): "maternal grandmother",
    ("father", "father", "father"): "patrilineal great-grandfather",
    ("mother", "mother", "mother"): "matrilineal great-grandmother",
    ("father", "father", "father", "father"): "patrilineal great-great-grandfather",
    ("mother", "mother", "mother", "mother"): "matrilineal great-great-grandmother",
}


# ------------------------------------------------------------------------------ config
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
        if not any(_in_types(self, h) for h in self.hops):
            raise ValueError("no question type is left in distribution: train would be empty")
        if self.n_generations < 3:
            raise ValueError("n_generations < 3: kin (inference) questions need grandparents")
        sizes = _generation_sizes(self)
        if min(sizes) < 2:
            raise ValueError("n_people too small: each generation needs a father and a mother")
        if (sizes[0] + 1) // 2 > len(_LAST):
            raise ValueError(f"first generation too large: its men need {len(_LAST)} surnames")
        families = (sizes[0] + 1) // 2
        if 1 + sum(-(-s // families) for s in sizes[1:]) > len(_FIRST):
            raise ValueError("n_people too large for n_generations: a family runs out of names")
        limits = {
            "n_cities": len(_CITY_PREFIX) * len(_CITY_SUFFIX),
            "n_countries": min(self.n_cities, len(_COUNTRY_PREFIX) * len(_COUNTRY_SUFFIX)),
            "n_companies": len(_COMPANY_STEM) * len(_COMPANY_KIND),
            "n_films": len(_FILM_ADJ) * len(_FILM_NOUN),
            "n_universities": len(_UNI_STEM) * len(_UNI_KIND),
            "n_people": len(_FIRST) * len(_LAST) // 2,
        }
        for name, limit in limits.items():
            if not 2 <= getattr(self, name) <= limit:
                raise ValueError(f"{name} must be in [2, {limit}] (unique names from the pools)")
        if self.passage_unit not in ("fact", "entity"):
            raise ValueError(f"passage_unit must be 'fact' or 'entity', got {self.passage_unit!r}")
        for name in ("n_train", "n_test", "n_test_ood"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0")


def _person_name(rng: random.Random, last: str) -> str:
    return f"{rng.choice(_FIRST)} {last}"


def _generation_sizes(cfg: WorldConfig) -> list[int]:
    """People per generation; later ones are larger, so most have grandparents."""
    weights = [g + 2 for g in range(cfg.n_generations)]
    sizes = [cfg.n_people * w // sum(weights) for w in weights]
    sizes[-1] += cfg.n_people - sum(sizes)
    return sizes


def _in_types(cfg: WorldConfig, hop: int) -> tuple[str, ...]:
    return tuple(t for t in TYPES_BY_HOP[hop] if t not in cfg.ood_types)


def _ood_types(cfg: WorldConfig, hop: int) -> tuple[str, ...]:
    if hop in cfg.ood_hops:
        return TYPES_BY_HOP[hop]
    return tuple(t for t in TYPES_BY_HOP[hop] if t in cfg.ood_types)


# ------------------------------------------------------------------------ plans, entities
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
class Entity:
    """One thing in the world; it gets one passage."""

    name: str
    """Unique name (also the passage title and the oracle's search query)."""
    kind: str
    """``person``, ``city``, ``country``, ``company``, ``film`` or ``university``."""
    facts: dict[str, str | int] = field(default_factory=dict)
    """Relation key -> entity name, attribute key -> number."""


@dataclass
class _Draft:
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


_WORD = re.compile(r"\w+")


def words(text: str) -> list[str]:
    """The words of a text as a word-level vocabulary sees them (case kept).

    >>> words("The Silent Harbor, 1,204")
    ['The', 'Silent', 'Harbor', '1', '204']
    """
    return _WORD.findall(text)


def slug(name: str) -> str:
    """Passage-id form of a name.

    >>> slug("The Silent Harbor")
    'the-silent-harbor'
    """
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def passage_id(name: str, key: str | None = None) -> str:
    """Id of an entity's passage, or of one of its facts.

    >>> passage_id("Bryn Carrow"), passage_id("Bryn Carrow", "father")
    ('w:bryn-carrow', 'w:bryn-carrow:father')
    """
    return f"w:{slug(name)}" + (f":{key}" if key else "")


def _fmt(key: str, value: str | int) -> str:
    return f"{value:,}" if key == "population" else str(value)


def _sentence_of(key: str) -> str:
    for templates in SENTENCES.values():
        for t in templates:
            if "{" + key + "}" in t:
                return t
    raise KeyError(f"no sentence template states {key!r}")


def fact_pattern(key: str, name: str) -> re.Pattern[str]:
    """The regex that reads fact ``key`` about entity ``name`` from its passage text.

    Built from the same template that wrote the passage: the subject is the escaped name,
    the wanted slot is the group ``v``, other slots match lazily.

    >>> fact_pattern("born_in", "Bryn Carrow").search(
    ...     "Bryn Carrow has birthplace Velmora. Bryn Carrow has birth year 1873."
    ... ).group("v")
    'Velmora'
    """
    out = []
    for piece in re.split(r"(\{\w+\})", _sentence_of(key)):
        if piece == "{name}":
            out.append(re.escape(name))
        elif piece == "{" + key + "}":
            out.append(r"(?P<v>.+?)")
        elif piece.startswith("{"):
            out.append(r".+?")
        else:
            out.append(re.escape(piece))
    return re.compile("".join(out))


def fact_noun(key: str) -> str:
    """The relation words of fact ``key``, as its sentence and fact searches write them.

    >>> fact_noun("birth_year")
    'birth year'
    """
    m = re.fullmatch(r"\{name\} has (.+) \{" + key + r"\}\.", _sentence_of(key))
    if m is None:
        raise KeyError(f"the sentence of {key!r} is not '<name> has <noun> <value>.'")
    return m.group(1)


def search_query(name: str, key: str, unit: str = "fact") -> str:
    """What the oracle searches to read fact ``key`` of ``name``: "<relation> of <name>"
    when passages are facts, else the name. (The relation first: then the name's words
    follow a space, the same tokens as in the question, for a byte-level BPE.)

    >>> search_query("Bryn Carrow", "father")
    'father of Bryn Carrow'
    """
    return f"{fact_noun(key)} of {name}" if unit == "fact" else name


def fact_sentence(key: str, name: str, value: str) -> str:
    """The sentence stating fact ``key`` of ``name``: what passages say and notes restate.

    >>> fact_sentence("father", "Bryn Carrow", "Idris Carrow")
    'Bryn Carrow has father Idris Carrow.'
    """
    return _sentence_of(key).format(**{"name": name, key: value})


# ------------------------------------------------------------------------------- world
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
        self._by_name: dict[str, Entity] = {}
        self._by_kind: dict[str, list[Entity]] = {k: [] for k in _KIND_ORDER}
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
        return self._by_name[name]

    # --------------------------------------------------------------------- entities
    def _add(self, entity: Entity) -> Entity:
        self.entities.append(entity)
        self._by_name[entity.name] = entity
        self._by_kind[entity.kind].append(entity)
        return entity

    def _new_name(self, make: Callable[[], str]) -> str:
        """A fresh name that neither contains nor is contained in an existing name."""
        for _ in range(1000):
            name = make()
            low = name.lower()
            if all(low not in n.lower() and n.lower() not in low for n in self._by_name):
                return name
        raise ValueError("could not draw a fresh name; the world is too big for its pools")

    def _make_entities(self, rng: random.Random) -> None:
        cfg = self.config
        countries: list[Entity] = []
        for _ in range(cfg.n_countries):
            name = self._new_name(lambda: rng.choice(_COUNTRY_PREFIX) + rng.choice(_COUNTRY_SUFFIX))
            countries.append(self._add(Entity(name, "country")))
        populations = rng.sample(range(8_000, 2_500_000), cfg.n_cities)
        for i in range(cfg.n_cities):
            name = self._new_name(lambda: rng.choice(_CITY_PREFIX) + rng.choice(_CITY_SUFFIX))
            # The first cities found one country each (its capital); the rest fall anywhere.
            country = countries[i] if i < len(countries) else rng.choice(countries)
            city = self._add(Entity(name, "city", {"country": country.name}))
            city.facts["population"] = populations[i]
            if i < len(countries):
                country.facts["capital"] = name
        cities = self._by_kind["city"]
        years = rng.sample(range(1300, 1900), cfg.n_universities)
        for i in range(cfg.n_universities):
            name = self._new_name(lambda: f"{rng.choice(_UNI_STEM)} {rng.choice(_UNI_KIND)}")
            facts: dict[str, str | int] = {"located_in": rng.choice(cities).name}
            facts["established"] = years[i]
            self._add(Entity(name, "university", facts))
        self._make_people(rng)
        people = self._by_kind["person"]
        for _ in range(cfg.n_companies):
            name = self._new_name(
                lambda: f"{rng.choice(_COMPANY_STEM)} {rng.choice(_COMPANY_KIND)}"
            )
            founder = rng.choice(people)
            facts = {"founder": founder.name, "hq": rng.choice(cities).name}
            facts["founded"] = int(founder.facts["birth_year"]) + rng.randint(25, 50)
            self._add(Entity(name, "company", facts))
        for _ in range(cfg.n_films):
            name = self._new_name(lambda: f"The {rng.choice(_FILM_ADJ)} {rng.choice(_FILM_NOUN)}")
            director = rng.choice(people)
            released = int(director.facts["birth_year"]) + rng.randint(25, 55)
            self._add(Entity(name, "film", {"released": released, "director": director.name}))
        self.entities.sort(key=lambda e: _KIND_ORDER.index(e.kind))  # stable: passage order

    def _make_people(self, rng: random.Random) -> None:
        sizes = _generation_sizes(self.config)
        cities = self._by_kind["city"]
        unis = self._by_kind["university"]
        # Each man of the first generation founds a family; children take the father's
        # surname. Children are dealt round-robin over the families, a son first in each,
        # so no family dies out or outgrows the first-name pool.
        founders = rng.sample(_LAST, (sizes[0] + 1) // 2)
        others = [n for n in _LAST if n not in founders] or list(_LAST)
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
                name = self._new_name(functools.partial(_person_name, rng, last))
                current.append((self._add(Entity(name, "person", facts)), sex))
            previous = current

    def _make_passages(self) -> None:
        for e in self.entities:
            slots = {"name": e.name} | {k: _fmt(k, v) for k, v in e.facts.items()}
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

    # ------------------------------------------------------------------------ questions
    def _follow(self, start: Entity, path: Sequence[str]) -> list[Entity] | None:
        """The entities along ``path`` from ``start``; None if undefined or revisiting."""
        chain = [start]
        for key in path:
            target = chain[-1].facts.get(key)
            if target is None:
                return None
            nxt = self._by_name[str(target)]
            if nxt in chain:  # "the capital of the country of X" may be X itself
                return None
            chain.append(nxt)
        return chain

    def _chain_draft(
        self, chain: list[Entity], path: Sequence[str], qtype: str, text: str
    ) -> _Draft:
        steps = [Step(chain[0].name, path[0])] + [Step(i - 1, path[i]) for i in range(1, len(path))]
        return _Draft(
            key=("chain", chain[0].name, tuple(path)),
            question=text,
            answer=chain[-1].name,
            type=qtype,
            plan=Plan(tuple(steps), len(steps) - 1),
            searches=[e.name for e in chain[:-1]],
        )

    def _draw_chain(self, rng: random.Random, hops: int, qtype: str) -> _Draft | None:
        path = rng.choice(_chain_paths(hops))
        chain = self._follow(rng.choice(self._by_kind[_REL[path[0]].subject]), path)
        if chain is None:
            return None
        np_ = chain[0].name
        for key in path[:-1]:
            np_ = _REL[key].noun.format(x=np_)
        last = _REL[path[-1]]
        text = (last.bridge if qtype == "bridge" else last.question).format(x=np_)
        return self._chain_draft(chain, path, qtype, text[0].upper() + text[1:])

    def _draw_inference(self, rng: random.Random, hops: int) -> _Draft | None:
        kin = rng.choice([k for k in _KIN_TERMS if len(k) <= hops])
        tail = rng.choice(_tail_paths(hops - len(kin))) if hops > len(kin) else ()
        path = kin + tail
        chain = self._follow(rng.choice(self._by_kind["person"]), path)
        if chain is None:
            return None
        np_ = f"the {_KIN_TERMS[kin]} of {chain[0].name}"
        if not tail:
            text = f"Who is {np_}?"
        else:
            for key in tail[:-1]:
                np_ = _REL[key].noun.format(x=np_)
            text = _REL[tail[-1]].question.format(x=np_)
        return self._chain_draft(chain, path, "inference", text[0].upper() + text[1:])

    def _draw_comparison(self, rng: random.Random, hops: int) -> _Draft | None:
        want: Literal["min", "max"] = rng.choice(("min", "max"))
        sides: list[tuple[Entity, tuple[str, ...]]]
        if hops == 2:
            attr = rng.choice(_ATTRIBUTES)
            a, b = rng.sample(self._by_kind[attr.subject], 2)
            sides = [(a, ()), (b, ())]
            opening = attr.ask_min if want == "min" else attr.ask_max
        elif hops == 3:
            rel, attr = rng.choice(_MIXED_COMPARE)
            a = rng.choice(self._by_kind[attr.subject])
            b = rng.choice(self._by_kind[rel.subject])
            sides = [(a, ()), (b, (rel.key,))]
            rng.shuffle(sides)
            opening = attr.ask_min if want == "min" else attr.ask_max
        elif hops == 4:
            (rel_key, attr_key), openings = rng.choice(sorted(_BRIDGE_COMPARE.items()))
            rel, attr = _REL[rel_key], _ATTR[attr_key]
            a, b = rng.sample(self._by_kind[rel.subject], 2)
            sides = [(a, (rel_key,)), (b, (rel_key,))]
            opening = openings[0] if want == "min" else openings[1]
        else:
            return None
        followed = [self._follow(start, path) for start, path in sides]
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
            _REL[path[0]].noun.format(x=start.name) if path and hops == 3 else start.name
            for start, path in sides
        ]
        searches = [e.name for c in chains for e in c]
        return _Draft(
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

    def _draw(self, rng: random.Random, hops: int, qtype: str) -> _Draft | None:
        if qtype in ("single", "bridge", "compositional"):
            return self._draw_chain(rng, hops, qtype)
        if qtype == "inference":
            return self._draw_inference(rng, hops)
        return self._draw_comparison(rng, hops)

    def _sample(
        self,
        rng: random.Random,
        cells: dict[int, tuple[str, ...]],
        n: int,
        seen: set[tuple[object, ...]],
        vocab: set[str] | None,
    ) -> list[_Draft]:
        """``n`` new questions, even over hop counts, round-robin over types per hop.

        With ``vocab``, questions whose searches or answer need a word outside it are
        skipped (counted in `dropped_uncovered`).
        """
        hops = [h for h in sorted(cells) if cells[h]]
        if n and not hops:
            raise ValueError("a split has questions to draw but no (hops, type) to draw from")
        out: list[_Draft] = []
        for j, hop in enumerate(hops):
            quota = n // len(hops) + (1 if j < n % len(hops) else 0)
            for i in range(quota):
                qtype = cells[hop][i % len(cells[hop])]
                for _ in range(self.config.max_draws):
                    draft = self._draw(rng, hop, qtype)
                    if draft is None or draft.key in seen:
                        continue
                    if (
                        vocab is not None
                        and not _needed_words(draft.searches, draft.answer) <= vocab
                    ):
                        self.dropped_uncovered += 1
                        continue
                    seen.add(draft.key)
                    out.append(draft)
                    break
                else:
                    raise ValueError(
                        f"could not draw a new {hop}-hop {qtype} question in "
                        f"{self.config.max_draws} tries: enlarge the world or ask fewer"
                    )
        return out

    def _make_tasks(self, rng: random.Random) -> None:
        cfg = self.config
        in_cells = {h: _in_types(cfg, h) for h in cfg.hops}
        ood_cells = {h: _ood_types(cfg, h) for h in sorted(set(cfg.hops) | set(cfg.ood_hops))}
        seen: set[tuple[object, ...]] = set()
        train = self._sample(rng, in_cells, cfg.n_train, seen, None)
        vocab: set[str] = set()
        for d in train:
            vocab.update(words(d.question))
            vocab.update(_needed_words(d.searches, d.answer))
        drafts = {
            "train": train,
            "test": self._sample(rng, in_cells, cfg.n_test, seen, vocab),
            "test_ood": self._sample(rng, ood_cells, cfg.n_test_ood, seen, vocab),
        }
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

    def _supporting(self, d: _Draft) -> list[str]:
        """Passage ids of the evidence: one per step (the fact it reads, or its entity)."""
        if self.config.passage_unit == "entity":
            return [passage_id(name) for name in d.searches]
        return [passage_id(n, st.read) for n, st in zip(d.searches, d.plan.steps, strict=True)]


@functools.cache
def _chain_paths(hops: int) -> list[tuple[str, ...]]:
    """Relation sequences of length ``hops`` for chain questions, in a fixed order.

    Parent-of-parent pairs are left to inference questions, and "the country of the
    capital of X" (always X) is never asked.
    """
    paths: list[tuple[str, ...]] = [(r.key,) for r in _RELATIONS]
    for _ in range(hops - 1):
        paths = [
            (*p, r.key)
            for p in paths
            for r in _RELATIONS
            if r.subject == _REL[p[-1]].object
            and not (p[-1] in _KIN and r.key in _KIN)
            and not (p[-1] == "capital" and r.key == "country")
        ]
    return paths


@functools.cache
def _tail_paths(length: int) -> list[tuple[str, ...]]:
    """What an inference question may ask about the relative: no further parents."""
    return [p for p in _chain_paths(length) if _REL[p[0]].subject == "person" and p[0] not in _KIN]


_MIXED_COMPARE: tuple[tuple[_Relation, _Attribute], ...] = tuple(
    (r, a) for r in _RELATIONS for a in _ATTRIBUTES if r.object == a.subject
)


def _needed_words(searches: Sequence[str], answer: str) -> set[str]:
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
        shown.update(_needed_words(world.gold_searches[t.id], t.answers[0]))
    needed: set[str] = set()
    for split in ("test", "test_ood"):
        for t in world.tasks(split):
            needed |= _needed_words(world.gold_searches[t.id], t.answers[0])
    return needed - shown


# ----------------------------------------------------------------------------- oracle
def answer_turn(answer: str) -> str:
    """The assistant text of a final answer.

    The space after the tag (the parser strips it) keeps every word of the answer the same
    token as in the search result it was read from: with a byte-level BPE, "Velmora" after
    ">" and " Velmora" after a word are different tokens, and a tiny model would have to
    learn that pairing for every name instead of simply copying.

    >>> answer_turn("Velmora")
    '<answer> Velmora</answer>'
    """
    return f"<answer> {answer}</answer>"


_RESULT_HEADER = re.compile(r"^\[(\d+)\] (.*)$", re.MULTILINE)


def parse_search_results(content: str) -> list[tuple[str, str]]:
    """(title, text) of each passage in a search tool response (``[i] Title\\ntext``).

    >>> parse_search_results("[1] A\\none. two.\\n[2] B\\nthree.")
    [('A', 'one. two.'), ('B', 'three.')]
    >>> parse_search_results("No results found.")
    []
    """
    heads = list(_RESULT_HEADER.finditer(content))
    out = []
    for i, m in enumerate(heads):
        end = heads[i + 1].start() if i + 1 < len(heads) else len(content)
        out.append((m.group(2).strip(), content[m.end() : end].strip()))
    return out


class OraclePolicy:
    """A scripted agent that solves world questions by searching and reading.

    It follows the world's `Plan` for the task (which entity to search first, which fact
    to read at each step, how to compare) but reads every value from the observations:
    it finds the passage titled with the name it searched and applies that fact's
    template regex (`fact_pattern`). If a read fails it answers "unknown".

    Args:
        world: the world whose tasks it answers.
        early_answer_prob: chance, drawn once per episode at its first turn, that on a
            multi-hop question it answers right after the first search with what it just
            read (a plausible, always wrong guess): imperfect demonstrations for SFT.
        rng: source of those draws (default ``random.Random(0)``). Episodes of one task
            must not interleave, since the draw is kept per task id until its next start.
        notes: start each turn after a search with a note restating the fact just read
            (`fact_sentence`, e.g. "X has father Y."), then the call or answer. The note
            is the reasoning a small model can imitate: its words up to the value occur
            verbatim in the passage, so reading becomes copying what follows them.
    """

    def __init__(
        self,
        world: World,
        early_answer_prob: float = 0.0,
        rng: random.Random | None = None,
        notes: bool = True,
    ) -> None:
        if not 0.0 <= early_answer_prob <= 1.0:
            raise ValueError(f"early_answer_prob must be in [0, 1], got {early_answer_prob}")
        self.world = world
        self.early_answer_prob = early_answer_prob
        self.rng = rng or random.Random(0)
        self.notes = notes
        self._early: dict[str, bool] = {}

    def next_turn(self, task: Task, observations: list[str]) -> str:
        """The next assistant turn given the tool responses seen so far this episode."""
        plan = self.world.plans.get(task.id)
        if plan is None:
            raise KeyError(f"task {task.id!r} is not a question of this world")
        n = len(observations)
        if n == 0:
            draw = self.rng.random() if self.early_answer_prob > 0 else 1.0
            self._early[task.id] = draw < self.early_answer_prob
        values: list[str | None] = []
        for step, obs in zip(plan.steps, observations, strict=False):
            name = self._resolve(step.query, values)
            values.append(None if name is None else self._read(name, step.read, obs))
        note = self._note(plan, values, n) if self.notes else ""
        multi_hop = len(plan.steps) > 1
        if n == 1 and multi_hop and self._early.get(task.id, False):
            return note + answer_turn(self._early_guess(plan, values, task.answers[0]))
        if n < len(plan.steps):
            name = self._resolve(plan.steps[n].query, values)
            if not name:
                return note + answer_turn("unknown")
            unit = self.world.config.passage_unit
            return note + search_call(search_query(name, plan.steps[n].read, unit))
        return note + answer_turn(self._final(plan, values) or "unknown")

    def _note(self, plan: Plan, values: list[str | None], n: int) -> str:
        """The fact read from the latest search, restated, plus a newline ("" if none)."""
        if n == 0 or n > len(plan.steps) or values[n - 1] is None:
            return ""
        step = plan.steps[n - 1]
        name = self._resolve(step.query, values)
        value = values[n - 1]
        if name is None or value is None:
            return ""
        return fact_sentence(step.read, name, value) + "\n"

    def _early_guess(self, plan: Plan, values: list[str | None], gold: str) -> str:
        """A plausible, wrong answer after one search: for a chain, the entity just read
        (the bridge, not the end); for a comparison, a side's name that is not the winner
        (never a bare number: the question asks for a name)."""
        if not isinstance(plan.answer, Comparison):
            return values[0] or "unknown"
        sides = (plan.answer.left_answer, plan.answer.right_answer)
        known = [c for c in sides if isinstance(c, str) or c < len(values)]
        named = [n for n in (self._resolve(c, values) for c in known) if n is not None]
        # If only the winner is known yet, a name from the question is the wrong guess.
        named += [s.query for s in plan.steps if isinstance(s.query, str)]
        wrong = [n for n in named if n != gold]
        return wrong[0] if wrong else "unknown"

    @staticmethod
    def _resolve(query: str | int, values: list[str | None]) -> str | None:
        return query if isinstance(query, str) else values[query]

    @staticmethod
    def _read(name: str, key: str, observation: str) -> str | None:
        for title, text in parse_search_results(observation):
            if title == name:
                m = fact_pattern(key, name).search(text)
                if m:
                    return m.group("v")
        return None

    def _final(self, plan: Plan, values: list[str | None]) -> str | None:
        if isinstance(plan.answer, int):
            return values[plan.answer]
        c = plan.answer
        left, right = values[c.left], values[c.right]
        if left is None or right is None:
            return None
        lv, rv = int(left.replace(",", "")), int(right.replace(",", ""))
        left_wins = lv < rv if c.want == "min" else lv > rv
        return self._resolve(c.left_answer if left_wins else c.right_answer, values)

"""The embedded world's schema: word pools, relations, attributes and their sentences.

Names are built from small shared word pools (first x last names, city prefix + suffix,
"The <Adj> <Noun>" films, "<Stem> <Kind>" companies and universities), so that a model
with a word-level vocabulary can copy every word it must write. Each fact is one sentence,
"<name> has <noun> <value>." (`SENTENCES`); the oracle reads facts back with regexes built
from the very same strings (`fact_pattern`). Imports no torch.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

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
FIRST = (
    "Aldric", "Bryn", "Caspian", "Delphine", "Elowen", "Faolan", "Galen", "Hestia", "Idris",
    "Juno", "Kestrel", "Lysander", "Maelis", "Niamh", "Orsino", "Perrin", "Quilla", "Rowan",
    "Sabine", "Tamsin", "Ulric", "Vesna", "Wren", "Xanthe", "Yorick", "Zephyr", "Anselm",
    "Briar", "Corin", "Dario", "Esme", "Fintan", "Greer", "Halvard", "Ilse", "Jorund",
    "Katya", "Leoric", "Mireille", "Nestor",
)  # fmt: skip
LAST = (
    "Ashcombe", "Blackwood", "Carrow", "Dunmore", "Everly", "Fairbrook", "Greystone",
    "Hollis", "Ironwood", "Jessop", "Kimber", "Larkspur", "Merriweather", "Northcott",
    "Oakhurst", "Pembrook", "Quarrie", "Ravensworth", "Stroud", "Thackeray", "Underhill",
    "Vantreight", "Whitlock", "Yarrowby", "Zeller", "Alderton", "Brightwater", "Coldridge",
    "Dray", "Emberley",
)  # fmt: skip
CITY_PREFIX = (
    "Vel", "Kor", "Ost", "Dra", "Mar", "Tal", "Ser", "Bran", "Cal", "Eld", "Fen", "Gal",
    "Hal", "Ith", "Lor", "Nor", "Pel", "Quen", "Rav", "Sil",
)  # fmt: skip
CITY_SUFFIX = (
    "mora", "dun", "heim", "vale", "ford", "stad", "wick", "grad", "holm", "port", "anor",
    "esse",
)  # fmt: skip
COUNTRY_PREFIX = (
    "Drov", "Kelt", "Ambr", "Sund", "Tyr", "Vost", "Marr", "Quor", "Brel", "Zan", "Ylv",
    "Corv", "Esk", "Lun",
)  # fmt: skip
COUNTRY_SUFFIX = ("ania", "oria", "avia", "esia", "iland")
COMPANY_STEM = (
    "Arvex", "Zentra", "Quillon", "Nexor", "Bravik", "Cyrano", "Dovetail", "Ferrox",
    "Glimmer", "Halcyon", "Ionis", "Jadeite", "Korvane", "Lumen", "Novalis", "Orbis",
    "Pyxis", "Quanta", "Rune", "Solace", "Tessel", "Umbra", "Vireo", "Wyvern",
)  # fmt: skip
COMPANY_KIND = ("Dynamics", "Systems", "Labs", "Works", "Industries", "Holdings")
FILM_ADJ = (
    "Silent", "Crimson", "Hollow", "Distant", "Gilded", "Broken", "Endless", "Hidden",
    "Last", "Midnight", "Pale", "Restless", "Scarlet", "Sunken", "Velvet", "Wandering",
)  # fmt: skip
FILM_NOUN = (
    "Harbor", "Lantern", "Orchard", "Tide", "Compass", "Garden", "Mirror", "Citadel",
    "Voyage", "Winter", "Echo", "Feather", "Signal", "Threshold", "Archive", "Cathedral",
)  # fmt: skip
UNI_STEM = (
    "Halden", "Morrow", "Ashfield", "Brackley", "Caldera", "Dunstan", "Elmswood",
    "Fairhaven", "Glenrock", "Harwick", "Invermay", "Kingsleigh", "Lochmere", "Marlow",
    "Norwood", "Penhallow",
)  # fmt: skip
UNI_KIND = ("University", "College", "Institute")

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
KIND_ORDER = ("country", "city", "university", "person", "company", "film")


@dataclass(frozen=True)
class Relation:
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


RELATIONS: tuple[Relation, ...] = (
    Relation(
        "born_in", "person", "city", "the birthplace of {x}", "Where was {x} born?",
        "{x} was born in which city?",
    ),
    Relation(
        "studied_at", "person", "university", "the alma mater of {x}",
        "Which university did {x} attend?", "{x} studied at which university?",
    ),
    Relation(
        "father", "person", "person", "the father of {x}", "Who is the father of {x}?",
        "Who was the father of {x}?",
    ),
    Relation(
        "mother", "person", "person", "the mother of {x}", "Who is the mother of {x}?",
        "Who was the mother of {x}?",
    ),
    Relation(
        "country", "city", "country", "the country of {x}", "In which country is {x}?",
        "{x} is located in which country?",
    ),
    Relation(
        "capital", "country", "city", "the capital of {x}", "What is the capital of {x}?",
        "Which city is the capital of {x}?",
    ),
    Relation(
        "founder", "company", "person", "the founder of {x}", "Who founded {x}?",
        "{x} was founded by whom?",
    ),
    Relation(
        "hq", "company", "city", "the headquarters city of {x}",
        "In which city is {x} headquartered?", "{x} is headquartered in which city?",
    ),
    Relation(
        "director", "film", "person", "the director of {x}", "Who directed {x}?",
        "{x} was directed by whom?",
    ),
    Relation(
        "located_in", "university", "city", "the home city of {x}",
        "In which city is {x} located?", "{x} is located in which city?",
    ),
)  # fmt: skip
REL = {r.key: r for r in RELATIONS}
KIN = ("father", "mother")


@dataclass(frozen=True)
class Attribute:
    """A numeric fact that comparison questions compare."""

    key: str
    """Fact key in `SENTENCES` and `Entity.facts`."""
    subject: str
    """Kind of entity that has it."""
    ask_min: str
    """Question opening when the smaller value wins."""
    ask_max: str
    """Question opening when the larger value wins."""


ATTRIBUTES: tuple[Attribute, ...] = (
    Attribute("birth_year", "person", "Who was born first", "Who was born later"),
    Attribute(
        "founded", "company", "Which company was founded first",
        "Which company was founded more recently",
    ),
    Attribute(
        "released", "film", "Which film was released first",
        "Which film was released more recently",
    ),
    Attribute(
        "population", "city", "Which city has the smaller population",
        "Which city has the larger population",
    ),
    Attribute(
        "established", "university", "Which university was founded first",
        "Which university was founded more recently",
    ),
)  # fmt: skip
ATTR = {a.key: a for a in ATTRIBUTES}

# 4-hop "bridge comparison" (2Wiki): both sides follow one relation, then compare.
# (relation, attribute) -> (opening when the smaller value wins, when the larger wins).
BRIDGE_COMPARE: dict[tuple[str, str], tuple[str, str]] = {
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
KIN_TERMS: dict[tuple[str, ...], str] = {
    ("father", "father"): "paternal grandfather",
    ("father", "mother"): "paternal grandmother",
    ("mother", "father"): "maternal grandfather",
    ("mother", "mother"): "maternal grandmother",
    ("father", "father", "father"): "patrilineal great-grandfather",
    ("mother", "mother", "mother"): "matrilineal great-grandmother",
    ("father", "father", "father", "father"): "patrilineal great-great-grandfather",
    ("mother", "mother", "mother", "mother"): "matrilineal great-great-grandmother",
}


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


def format_value(key: str, value: str | int) -> str:
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

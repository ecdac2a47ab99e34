"""Multi-hop QA data: read the raw files into `QASample`s, dedupe, split, build a corpus.

    from agentr1.data import corpus_paragraphs, dedupe, load_file, qa_files, split

    samples = dedupe(s for path in qa_files() for s in load_file(path))  # formats.py
    sets = split(samples, (0.8, 0.1, 0.1), seed=0)      # disjoint, order-free
    tasks = [s.to_task() for s in sets["train"]]
    passages = corpus_paragraphs(samples)               # ids match Task "supporting"

Imports no torch.
"""

from agentr1.data.files import Loader, files_corpus, resolve_entry, sample_questions, wiki_files
from agentr1.data.formats import (
    ANSWER_KEYS,
    CORPUS_FORMATS,
    ID_KEYS,
    QA_FORMATS,
    QUESTION_KEYS,
    DataFormatError,
    LoadResult,
    OnError,
    Paragraph,
    QASample,
    Unanswerable,
    check_on_error,
    default_data_dir,
    detect_format,
    infer_dataset,
    load,
    load_corpus_file,
    load_dataset_name,
    load_file,
    paragraph_id,
    parse_fields,
    qa_files,
)
from agentr1.data.splits import (
    corpus_paragraphs,
    dedupe,
    normalize_question,
    seeded_rank,
    split,
)

__all__ = [
    "ANSWER_KEYS",
    "CORPUS_FORMATS",
    "ID_KEYS",
    "QA_FORMATS",
    "QUESTION_KEYS",
    "DataFormatError",
    "LoadResult",
    "Loader",
    "OnError",
    "Paragraph",
    "QASample",
    "Unanswerable",
    "check_on_error",
    "corpus_paragraphs",
    "dedupe",
    "default_data_dir",
    "detect_format",
    "files_corpus",
    "infer_dataset",
    "load",
    "load_corpus_file",
    "load_dataset_name",
    "load_file",
    "normalize_question",
    "paragraph_id",
    "parse_fields",
    "qa_files",
    "resolve_entry",
    "sample_questions",
    "seeded_rank",
    "split",
    "wiki_files",
]

"""Tests of ``experiments/`` (``make test-experiments``; the default ``make test`` does not
collect this folder).

Two folders go on ``sys.path``: the repository root, so a study's tests reuse the
product's test helpers (``from tests.integration.test_qa_env import tiny_qa_recipe``; ``tests`` is a
package), and each study's folder, so its tests import its scripts by bare name
(``import fresh_eval``) the way the scripts import each other when run as
``python experiments/<study>/<script>.py``.
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
STUDIES = sorted(p.parent for p in HERE.glob("*/tests"))

for folder in (ROOT, *STUDIES):
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))

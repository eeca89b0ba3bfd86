"""The project speaks for itself: learners and users have no issue tracker, no work sessions and
none of the documents the project was built from, so the words for those never reach the
notebooks, the README, the docs or the package."""
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
WORKSHOP = re.compile(
    r"BACKGROUND item|the lead'?s\b|\b(first|second|third|this|last) session\b|\bsession \d"
    r"|\bissues? ?[#-]?\d|\bthe seeds'|targets met\?|\.\./shared", re.IGNORECASE)


def _files():
    yield ROOT / "README.md"
    yield from sorted((ROOT / "docs").glob("*.md"))
    yield from sorted((ROOT / "notebooks").glob("*.py"))
    yield from sorted((ROOT / "notebooks").glob("*.ipynb"))
    yield from sorted((ROOT / "ropelib").rglob("*.py"))


@pytest.mark.parametrize("path", list(_files()), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_workshop_words(path):
    hits = [f"{path.name}:{i}: {line.strip()[:100]}"
            for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
            if WORKSHOP.search(line)]
    assert not hits, "say it in the project's own words:\n" + "\n".join(hits)


def test_the_pattern_catches_what_it_should():
    for text in ("see BACKGROUND item 1", "the lead's GPU run", "second session",
                 "Issue 5's targets", "issue 12", "the seeds' sweeps", "targets met? NO",
                 "../shared/BACKGROUND.md"):
        assert WORKSHOP.search(text), text
    for text in ("an earlier study", "the session of a training run", "tissue 5"):
        assert not WORKSHOP.search(text), text

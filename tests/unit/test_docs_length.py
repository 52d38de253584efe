"""The docs' length budget: docs/RESULTS.md at most 500 lines, docs/ARCHITECTURE.md at most 200."""
from pathlib import Path

DOCS = Path(__file__).resolve().parents[2] / "docs"
LIMITS = {"RESULTS.md": 500, "ARCHITECTURE.md": 200}


def test_docs_stay_within_their_line_budgets():
    for name, limit in LIMITS.items():
        lines = len((DOCS / name).read_text(encoding="utf-8").splitlines())
        assert lines <= limit, f"docs/{name}: {lines} lines, over its {limit}"

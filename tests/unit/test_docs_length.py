"""The docs' length budget: README.md at most 150 lines (the front door; the rest is docs/GUIDE.md),
docs/RESULTS.md at most 500, docs/ARCHITECTURE.md at most 200."""
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LIMITS = {"README.md": 150, "docs/RESULTS.md": 500, "docs/ARCHITECTURE.md": 200}


def test_docs_stay_within_their_line_budgets():
    for name, limit in LIMITS.items():
        lines = len((ROOT / name).read_text(encoding="utf-8").splitlines())
        assert lines <= limit, f"{name}: {lines} lines, over its {limit}"

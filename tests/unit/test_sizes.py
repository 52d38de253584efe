"""het's size budget (docs/STYLE.md: small files and functions): no Python file over 400 lines,
no function of 60 lines or more, no C++ source of the native core over 400 lines. Past that, a
file or function is split by concept."""

from __future__ import annotations

import ast
import pathlib

import het

ROOT = pathlib.Path(het.__file__).parent
MAX_FILE_LINES = 400
MAX_FUNCTION_LINES = 59

# Files over the budget, each with who splits it (none today).
KNOWN_LONG_FILES: set[str] = set()


def lines(path: pathlib.Path) -> int:
    return len(path.read_text().splitlines())


def long_functions(path: pathlib.Path, root: pathlib.Path = ROOT) -> list[str]:
    """``file:function (n lines)`` for each function of ``path`` (methods and nested ones
    too) of more than :data:`MAX_FUNCTION_LINES` lines, its decorators and docstring counted."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
            n = node.end_lineno - first + 1
            if n > MAX_FUNCTION_LINES:
                found.append(f"{path.relative_to(root)}:{node.name} ({n} lines)")
    return found


def test_no_python_file_over_400_lines():
    long = {str(p.relative_to(ROOT)): lines(p) for p in ROOT.rglob("*.py") if lines(p) > MAX_FILE_LINES}
    assert set(long) - KNOWN_LONG_FILES == set(), long


def test_the_known_long_files_are_still_long():
    """An exception whose file came under the budget goes from the list."""
    assert {f for f in KNOWN_LONG_FILES if lines(ROOT / f) <= MAX_FILE_LINES} == set()


def test_no_function_of_60_lines_or_more():
    assert [f for p in sorted(ROOT.rglob("*.py")) for f in long_functions(p)] == []


def test_no_native_source_over_400_lines():
    sources = sorted((ROOT / "native").glob("*.cpp")) + sorted((ROOT / "native").glob("*.h"))
    assert sources and {p.name: lines(p) for p in sources if lines(p) > MAX_FILE_LINES} == {}


def test_the_checks_find_what_is_over(tmp_path):
    """The checkers themselves: a function of 60 lines is found, one of 59 is not."""
    src = tmp_path / "m.py"
    body = "".join(f"    x{i} = {i}\n" for i in range(58))
    src.write_text(f"def ok():\n{body}\n\ndef over():\n{body}    return x0\n")
    assert long_functions(src, tmp_path) == ["m.py:over (60 lines)"]

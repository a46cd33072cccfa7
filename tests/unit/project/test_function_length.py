"""A length budget: no library function over `MAX_LINES` lines of code without a reason beside it.

Lines of code are the lines of a function's body that hold code: blank lines, comment lines and
the docstring do not count. A function that must stay long says why in a `# length: <reason>`
comment on its `def` line or on a line just above it (above its decorators too). The complexity
budget is ruff's C901 (pyproject.toml); this is the other half, the one a linter does not measure.
"""

from __future__ import annotations

import ast
import io
import tokenize
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
LIBRARY = ("hooked", "components", "loading")
MAX_LINES = 80
REASON = "# length:"


def code_lines(node: ast.FunctionDef | ast.AsyncFunctionDef, comment_lines: set[int], lines: list[str]) -> int:
    """The lines of `node` (its signature and body) that hold code, less its docstring."""
    assert node.end_lineno is not None
    skip = set(comment_lines)
    first = node.body[0]
    if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
        skip.update(range(first.lineno, (first.end_lineno or first.lineno) + 1))  # the docstring
    return sum(
        1 for number in range(node.lineno, node.end_lineno + 1) if number not in skip and lines[number - 1].strip()
    )


def has_reason(node: ast.FunctionDef | ast.AsyncFunctionDef, lines: list[str]) -> bool:
    """A `# length:` comment on the `def` line, or on the lines just above it and its decorators."""
    if REASON in lines[node.lineno - 1]:
        return True
    first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
    above = first - 2
    while above >= 0 and lines[above].strip().startswith("#"):
        if REASON in lines[above]:
            return True
        above -= 1
    return False


def function_sizes(source: str) -> list[tuple[str, int, int, bool]]:
    """`(qualified name, line, lines of code, has a reason)` for every function in `source`."""
    lines = source.splitlines()
    comments = {
        token.start[0]
        for token in tokenize.generate_tokens(io.StringIO(source).readline)
        if token.type == tokenize.COMMENT and lines[token.start[0] - 1].strip().startswith("#")
    }
    found = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                name = prefix + child.name
                found.append((name, child.lineno, code_lines(child, comments, lines), has_reason(child, lines)))
                visit(child, name + ".")
            elif isinstance(child, ast.ClassDef):
                visit(child, prefix + child.name + ".")
            else:
                visit(child, prefix)

    visit(ast.parse(source), "")
    return found


def library_functions() -> list[tuple[str, int, bool]]:
    """`("path:line name", lines of code, has a reason)` for every function of the library."""
    rows = []
    for folder in LIBRARY:
        for path in sorted((REPO / folder).rglob("*.py")):
            for name, line, size, reason in function_sizes(path.read_text()):
                rows.append((f"{path.relative_to(REPO)}:{line} {name}", size, reason))
    return rows


def test_no_library_function_is_over_the_budget_without_a_reason():
    over = [f"{where}: {size} lines" for where, size, reason in library_functions() if size > MAX_LINES and not reason]
    assert not over, (
        f"{len(over)} functions over {MAX_LINES} lines of code: split them into named steps, or write why one "
        f"must stay long in a `{REASON} <reason>` comment on its def line:\n" + "\n".join(over)
    )


def test_the_count_skips_docstrings_comments_and_blank_lines():
    source = 'def f(x):\n    """Doc.\n\n    More doc.\n    """\n\n    # why\n    y = x  # kept\n    return y\n'
    [(name, line, size, reason)] = function_sizes(source)
    assert (name, line, size, reason) == ("f", 1, 3, False)


def test_a_long_function_is_caught_and_a_reason_excuses_it():
    body = "".join(f"    x{i} = {i}\n" for i in range(MAX_LINES))
    long = f"def long(x):\n{body}"
    [(_, _, size, reason)] = function_sizes(long)
    assert size == MAX_LINES + 1 and not reason
    for excused in (f"# length: one table\ndef long(x):\n{body}", f"def long(x):  # length: one table\n{body}"):
        assert function_sizes(excused)[0][3]
    decorated = f"# length: one table\n@staticmethod\ndef long(x):\n{body}"
    assert function_sizes(decorated)[0][3]
    nested = "class C:\n    def m(self):\n        def inner():\n            pass\n"
    assert [name for name, *_ in function_sizes(nested)] == ["C.m", "C.m.inner"]


def test_the_library_is_scanned():
    rows = library_functions()
    assert len(rows) > 1000 and any("hooked/models/hooked_transformer.py" in where for where, _, _ in rows)

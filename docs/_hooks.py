"""MkDocs hook: show the word after ```python (`fragment`, or a block's name) as the block's title.

Python-Markdown's fences accept only a language there, so ```python fragment would not render as code;
docs/contributing.md explains the markers, and tests/integration/test_docs_examples.py enforces them.
"""

import re

_TITLES = {"fragment": "fragment (not run by the tests)"}
_FENCE = re.compile(r"^```python[ \t]+([\w.-]+)[ \t]*$", flags=re.M)


def on_page_markdown(markdown, **kwargs):
    return _FENCE.sub(lambda m: f"```python title=\"{_TITLES.get(m.group(1), m.group(1))}\"", markdown)

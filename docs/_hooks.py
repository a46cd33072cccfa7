"""MkDocs hook: show the word after a fence's language (```python fragment, ```bash fragment, a block's name)
as the block's title.

Python-Markdown's fences accept only a language there (or `{...}` attributes), so ```bash fragment would not
be a fence at all: the block would render as a paragraph with literal backticks and swallow the block after it.
docs/contributing.md explains the markers, tests/integration/test_docs_examples.py enforces them for Python,
and tests/integration/test_docs_site.py checks the built pages for fences that did not render.
"""

import re

_TITLES = {"fragment": "fragment (not run by the tests)"}
# an opening fence (any indentation, ``` or ~~~, any language) followed by one bare word
_FENCE = re.compile(r"^(?P<open>[ \t]*(?:`{3,}|~{3,})[\w+-]+)[ \t]+(?P<word>[\w.-]+)[ \t]*$", flags=re.M)


def _titled(match: re.Match) -> str:
    word = match.group("word")
    title = _TITLES.get(word, word) if match.group("open").endswith("python") else word
    return f'{match.group("open")} title="{title}"'


def on_page_markdown(markdown, **kwargs):
    return _FENCE.sub(_titled, markdown)

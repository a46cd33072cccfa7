"""The README's Python examples (```python blocks) run as written, in order, on the bundled model.

Blocks fenced ```py are fragments: they need what the repository does not ship (a BERT checkpoint, a
harvested dataset) or inputs defined by the reader (a circuit's prompts and metric); the tests of
those modules run the same calls on tiny models.
"""

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[2] / "README.md"
pytestmark = pytest.mark.slow


def test_readme_python_blocks_run():
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    assert len(blocks) == 3, "update this test when README examples are added or removed"
    namespace: dict = {}
    exec(compile(blocks[0], "README block 1", "exec"), namespace)
    exec(compile(blocks[1], "README block 2 (generation)", "exec"), namespace)
    model, out = namespace["model"], namespace["out"]
    n_fed = out.sequences.shape[-1] - 1  # the last sampled token is never fed (SPEC §11)
    assert out.cache["pattern", 0].shape == (1, model.cfg.n_heads, n_fed, n_fed)
    exec(compile(blocks[2], "README block 3 (patching)", "exec"), namespace)
    assert namespace["logits"].shape[:2] == namespace["tokens"].shape

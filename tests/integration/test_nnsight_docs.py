"""docs/nnsight.md's Python blocks run as written, in order, on the bundled SmolLM2.

nnsight re-reads the source of each `with` block, so the blocks are written to a file and
run from there (code `exec`'d from a string has no source to read).
"""

from __future__ import annotations

import re
import runpy
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parents[2] / "docs" / "nnsight.md"
pytestmark = pytest.mark.slow


def test_nnsight_doc_blocks_run(tmp_path):
    blocks = re.findall(r"```python nnsight_doc\n(.*?)```", DOC.read_text(), flags=re.S)
    assert len(blocks) == 8, "update this test when docs/nnsight.md examples are added or removed"
    script = tmp_path / "nnsight_doc.py"
    script.write_text("\n".join(blocks))
    namespace = runpy.run_path(str(script))
    model, ids = namespace["model"], namespace["ids"]
    assert ids.shape[1] == model.to_tokens(namespace["prompt"]).shape[1] + 3
    assert len(namespace["states"]) == 3 and len(namespace["lens"]) == model.cfg.n_layers
    assert namespace["grad"].shape == namespace["resid"].shape
    torch = namespace["torch"]
    assert torch.allclose(namespace["patched"], model(namespace["source"]), atol=1e-4)
    assert not torch.allclose(namespace["rome"], namespace["paris"])
    # the remote recipes ran against a server, each asserting equality with nnsight on the local model; the edits
    # changed something
    assert not torch.allclose(namespace["remote_steered"], model(namespace["prompt"]), atol=1e-3)
    assert not torch.allclose(namespace["ablated"], model(namespace["prompt"]), atol=1e-3)

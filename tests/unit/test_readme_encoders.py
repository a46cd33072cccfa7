"""The README's encoder table lists exactly the encoder classes `HookedEncoder` loads, each with its converter module."""

import re
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"
SECTION = "## Encoders: `HookedEncoder` (BERT family)"


def test_encoder_table_matches_the_encoder_registry():
    from loading.encoders import ENCODER_ARCHITECTURES

    text = README.read_text()
    assert SECTION in text, f"README.md lost its {SECTION!r} section"
    section = text[text.index(SECTION) :].split("\n## ", 1)[0]
    rows = [[c.strip() for c in line.strip().strip("|").split("|")] for line in section.splitlines() if line.startswith("| `")]
    classes = [re.fullmatch(r"`(\w+)`", row[0]).group(1) for row in rows]
    assert sorted(classes) == sorted(ENCODER_ARCHITECTURES)
    for row in rows:
        module = row[2].strip("`").removesuffix(".py")
        assert ENCODER_ARCHITECTURES[row[0].strip("`")].config.__module__ == f"loading.{module}"

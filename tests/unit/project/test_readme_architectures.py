"""docs/architectures.md's table lists exactly the registered HF classes, each with its converter module."""

import re
from pathlib import Path

from hooked import loading

PAGE = Path(__file__).resolve().parents[3] / "docs" / "architectures.md"
SECTION = "## Every supported class"


def table_rows() -> list[list[str]]:
    text = PAGE.read_text()
    assert SECTION in text, f"docs/architectures.md lost its {SECTION!r} section"
    section = text[text.index(SECTION) :].split("\n## ", 1)[0]
    rows = [
        [c.strip() for c in line.strip().strip("|").split("|")]
        for line in section.splitlines()
        if line.startswith("| `")
    ]
    return rows


def test_table_lists_every_registered_architecture_and_nothing_else():
    classes = [re.fullmatch(r"`(\w+)`", row[0]).group(1) for row in table_rows()]
    assert len(classes) == len(set(classes)), "a class is listed twice"
    other_model_classes = set(loading.registry.MODEL_CLASS_ARCHITECTURES)  # T5, HuBERT: their own model classes
    assert set(classes) == set(loading.supported_architectures()) | other_model_classes


def test_each_row_names_the_module_that_registers_the_class():
    for row in table_rows():
        cls, module = row[0].strip("`"), row[2].strip("`").removesuffix(".py")
        arch = loading.ARCHITECTURES.get(cls) or loading.registry.MODEL_CLASS_ARCHITECTURES[cls][1]
        converter = arch.config
        assert converter.__module__ == f"hooked.loading.{module}", f"{cls} is converted in {converter.__module__}"

"""`hooked.loading.gguf`: the GGUF -> HF conversion's own helpers (the bundled models' conversion: test_bundled.py)."""

from __future__ import annotations

import gguf
import pytest

from hooked.loading.gguf import _one_reader_per_file


def tiny_gguf(path):
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_uint32("tiny.value", 7)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_a_conversion_parses_each_file_once_and_restores_the_reader(tmp_path):
    one, other = tiny_gguf(tmp_path / "one.gguf"), tiny_gguf(tmp_path / "other.gguf")
    make_reader = gguf.GGUFReader
    with pytest.raises(RuntimeError, match="stop"), _one_reader_per_file():
        first = gguf.GGUFReader(one)
        assert gguf.GGUFReader(str(one)) is first  # transformers passes a str: the same reader
        assert gguf.GGUFReader(other) is not first
        assert first.fields["tiny.value"].contents() == 7
        raise RuntimeError("stop")
    assert gguf.GGUFReader is make_reader  # restored, even after an error
    assert gguf.GGUFReader(one) is not gguf.GGUFReader(one)

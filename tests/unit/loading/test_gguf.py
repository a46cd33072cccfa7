"""`hooked.loading.gguf`: the GGUF -> HF conversion's own helpers (the bundled models' conversion: test_bundled.py)."""

from __future__ import annotations

import threading

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


def test_conversions_in_two_threads_take_turns_and_leave_the_reader_restored(tmp_path):
    path = tiny_gguf(tmp_path / "one.gguf")
    make_reader = gguf.GGUFReader
    inside, release, seen = threading.Event(), threading.Event(), []

    def first():
        with _one_reader_per_file():
            inside.set()
            assert release.wait(timeout=30)

    def second():
        with _one_reader_per_file():
            seen.append(gguf.GGUFReader(path) is gguf.GGUFReader(path))

    a = threading.Thread(target=first)
    a.start()
    assert inside.wait(timeout=30)
    b = threading.Thread(target=second)
    b.start()
    b.join(timeout=0.2)
    assert b.is_alive() and not seen  # waits for the first conversion
    release.set()
    a.join(timeout=30)
    b.join(timeout=30)
    assert not a.is_alive() and not b.is_alive() and seen == [True]
    assert gguf.GGUFReader is make_reader

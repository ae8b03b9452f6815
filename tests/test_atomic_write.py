"""``record/atomic.atomic_write``: a file is replaced whole or not at all.
A write that fails leaves the previous file as it was and no temporary
file behind (each process writes its own temporary name, so a leftover
would pile up and keep a run folder from being removed); a writer function
streams into the file (a torch rank's result pickle is never held whole in
memory)."""
import pickle

import pytest

from monsoon.record.atomic import atomic_write


def test_text_bytes_and_a_writer_function_are_written_whole(tmp_path):
    atomic_write(tmp_path / "a.txt", "text")
    atomic_write(tmp_path / "b.bin", b"\x00\x01", durable=False)
    big = {"params": list(range(100_000))}
    atomic_write(tmp_path / "c.pkl", lambda f: pickle.dump(big, f))
    assert (tmp_path / "a.txt").read_text() == "text"
    assert (tmp_path / "b.bin").read_bytes() == b"\x00\x01"
    assert pickle.loads((tmp_path / "c.pkl").read_bytes()) == big
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.txt", "b.bin", "c.pkl"]


@pytest.mark.parametrize("failing", [
    lambda f: (f.write(b"half"), pickle.dump(lambda: 0, f)),  # pickling fails midway
    "\ud800",  # text that cannot be encoded
])
def test_a_failed_write_keeps_the_old_file_and_leaves_no_temporary(tmp_path, failing):
    target = tmp_path / "summary.json"
    target.write_text("the earlier run's")
    with pytest.raises(Exception):
        atomic_write(target, failing)
    assert target.read_text() == "the earlier run's"
    assert [p.name for p in tmp_path.iterdir()] == ["summary.json"]

"""fixed_embed.atomic: the target holds its old content or the new, never part of it, and no
temporary file stays."""

import json
import os
from pathlib import Path

import pytest

from fixed_embed.atomic import atomic_path, atomic_write, atomic_write_text, temporary_name


def leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if ".tmp-" in p.name)


def test_text_is_written_whole_into_a_new_folder(tmp_path):
    target = tmp_path / "a" / "b" / "runs.json"
    assert atomic_write_text(target, "new\n") == target
    assert target.read_text() == "new\n"
    assert leftovers(target.parent) == []


def test_the_target_keeps_its_old_content_until_the_write_completes(tmp_path):
    target = tmp_path / "results.json"
    target.write_text("old")
    with atomic_write(target) as file:
        file.write("new, ")
        file.flush()
        # a reader mid-write sees the old file, not half the new one
        assert target.read_text() == "old"
        tmp = Path(file.name)
        assert tmp.parent == target.parent and tmp.name.startswith(".")  # same filesystem, hidden
        file.write("whole")
    assert target.read_text() == "new, whole"
    assert leftovers(tmp_path) == []


def test_an_exception_inside_the_write_leaves_the_old_file_and_no_temporary(tmp_path):
    target = tmp_path / "results.json"
    target.write_text("old")
    with pytest.raises(RuntimeError, match="mid-write"), atomic_write(target) as file:
        file.write("half of the new")
        raise RuntimeError("mid-write")
    assert target.read_text() == "old"
    assert leftovers(tmp_path) == []


def test_a_failed_first_write_leaves_no_target(tmp_path):
    target = tmp_path / "results.json"
    with pytest.raises(KeyboardInterrupt), atomic_write(target) as file:
        file.write("half")
        raise KeyboardInterrupt  # a BaseException too: Ctrl-C mid-write
    assert not target.exists() and leftovers(tmp_path) == []


def test_binary_mode(tmp_path):
    target = tmp_path / "blob.bin"
    target.write_bytes(b"old")
    with atomic_write(target, "wb") as file:
        file.write(bytes(range(256)))
    assert target.read_bytes() == bytes(range(256))
    assert leftovers(tmp_path) == []


@pytest.mark.parametrize("mode", ["a", "r", "r+", "x"])
def test_only_whole_file_modes_are_accepted(tmp_path, mode):
    target = tmp_path / "f.txt"
    target.write_text("old")
    with pytest.raises(ValueError, match="must start with 'w'"), atomic_write(target, mode):
        pass
    assert target.read_text() == "old"


def test_a_writer_that_takes_a_path_writes_through_atomic_path(tmp_path):
    target = tmp_path / "tokenizer.json"
    target.write_text("old")

    def save(path: str) -> None:  # like tokenizer.save(path) or torch.save(obj, path)
        with open(path, "w") as file:
            json.dump({"v": 2}, file)

    with atomic_path(target) as tmp:
        assert tmp == temporary_name(target) and tmp.parent == target.parent
        save(str(tmp))
        assert target.read_text() == "old"
    assert json.loads(target.read_text()) == {"v": 2}
    assert leftovers(tmp_path) == []


def test_a_path_writer_that_fails_or_writes_nothing_leaves_the_old_file(tmp_path):
    target = tmp_path / "model.bin"
    target.write_bytes(b"old")
    with pytest.raises(OSError, match="disk full"), atomic_path(target) as tmp:
        tmp.write_bytes(b"part")
        raise OSError("disk full")
    assert target.read_bytes() == b"old" and leftovers(tmp_path) == []
    with pytest.raises(FileNotFoundError), atomic_path(target):
        pass  # the writer wrote no file: there is nothing to put in place
    assert target.read_bytes() == b"old" and leftovers(tmp_path) == []


def test_every_file_gets_the_mode_open_gives_also_from_a_writer_that_makes_it_private(tmp_path):
    import torch
    from safetensors.torch import save_file

    from fixed_embed.atomic import atomic_folder

    mask = os.umask(0o022)
    try:
        with atomic_path(tmp_path / "model.safetensors") as tmp:
            save_file({"w": torch.zeros(2)}, tmp)  # its own temporary file: 0600
        with atomic_folder(tmp_path / "export") as folder:
            save_file({"w": torch.zeros(2)}, folder / "model.safetensors")
            (folder / "config.json").write_text("{}")
    finally:
        os.umask(mask)
    for path in (tmp_path / "model.safetensors", *(tmp_path / "export").iterdir()):
        assert oct(path.stat().st_mode & 0o777) == "0o644", path

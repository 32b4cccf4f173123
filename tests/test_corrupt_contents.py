"""Contents that are well-formed but wrong: every file the project reads back, overwritten in
place (its size kept, bytes flipped in its middle), is refused in one line naming it, never read
silently (issue 32).

The files are discovered, not listed: everything that ``pretokenize`` writes, and everything a
tiny ``fit`` leaves in its run folder and the cache, is built once for the module. Each file
name is either read back (``READERS``: the reader the fit, eval or resume calls on it) or
written only (``NOT_READ``); a new kind of file fails
``test_every_file_the_project_writes_is_classified`` until it is given one of the two.
"""

import json
import shutil
import warnings
from collections.abc import Callable
from fnmatch import fnmatch
from pathlib import Path

import numpy as np
import pytest
import torch

from fixed_embed.data import DocumentSource, TextDataModule
from fixed_embed.data.pretokenize import pretokenize
from fixed_embed.data.token_shards import INDEX, TokenShards
from fixed_embed.errors import DataError, UserError
from fixed_embed.evaluation.loading import load_checkpoint
from fixed_embed.train.resume import read_checkpoint
from tests.cli import run_cli
from tests.test_lifecycle import fit_args

SEQ = 16


@pytest.fixture(scope="module")
def written(tmp_path_factory, corpus):
    """``{root name: folder}``: a pretokenized folder, a tiny fit's run folder, and the cache it
    filled."""
    data, tok = corpus
    tmp = tmp_path_factory.mktemp("written")
    pretokenize(
        DocumentSource(str(data)), str(tok), tmp / "shards", shards=2, holdout_per_mille=100
    )
    with pytest.MonkeyPatch.context() as env:
        env.setenv("FIXED_EMBED_CACHE", str(tmp / "cache"))
        result = run_cli(
            *fit_args(
                tmp, corpus, "gf2", "--trainer.max_steps", "1", "--data.holdout_per_mille", "100"
            )
        )
    assert result.returncode == 0, result.stderr[-3000:]
    return {"shards": tmp / "shards", "run": tmp / "logs", "cache": tmp / "cache"}


def files(written: dict[str, Path]) -> list[tuple[str, Path]]:
    """Every regular file under the roots, as ``(root, path relative to it)``; links are not
    contents."""
    found = [
        (name, p.relative_to(root))
        for name, root in written.items()
        for p in sorted(root.rglob("*"))
    ]
    return [
        (name, rel)
        for name, rel in found
        if (written[name] / rel).is_file() and not (written[name] / rel).is_symlink()
    ]


def flip(path: Path) -> None:
    """Complement 8 bytes in the middle of ``path``, in place: the same file and size, other
    contents."""
    size = path.stat().st_size
    with open(path, "r+b") as file:
        file.seek(size // 2)
        chunk = file.read(8)
        file.seek(size // 2)
        file.write(bytes(b ^ 0xFF for b in chunk))
    assert path.stat().st_size == size


# -- the readers: what the commands call on each kind of file
# ------------------------------------------------


def read_shards(folder: Path, path: Path, corpus) -> None:
    """What ``fit --data.train FOLDER`` reads before its first update: the index, tokenizer,
    shards, a batch."""
    dm = TextDataModule(
        train=str(folder), seq_len=SEQ, batch_size=4, val_sequences=4, holdout_per_mille=100
    )
    dm.check_inputs()
    dm.setup("fit")
    next(iter(dm.train_dataloader()))
    dm.validation_blocks()


def read_checkpoint_both_ways(folder: Path, path: Path, corpus) -> None:
    """The resume plan's reader (``fit --ckpt_path``) and eval / export's (weights into a model)."""
    read_checkpoint(path)
    load_checkpoint(path)


def read_validation_cache(folder: Path, path: Path, corpus) -> None:
    """The fit's validation set through the cache; an entry that does not match is rebuilt (a
    cache is never fatal), so what must hold is a warning naming it and the true blocks back,
    never the changed file's."""
    data, tok = corpus
    blocks = {}
    for cache in (folder, folder.parent / f"{folder.name}-fresh"):
        with pytest.MonkeyPatch.context() as env:
            env.setenv("FIXED_EMBED_CACHE", str(cache))
            dm = TextDataModule(
                train=str(data),
                tokenizer=str(tok),
                seq_len=32,
                val_sequences=4,
                holdout_per_mille=100,
            )
            blocks[cache] = dm.validation_blocks()
    assert torch.equal(*blocks.values())


def read_results(folder: Path, path: Path, corpus) -> None:
    """``fixed-embed table`` reads an evaluation's results back; its refusal is the command's
    error line."""
    result = run_cli("table", str(path))
    if result.returncode == 2:
        raise UserError(next(line for line in result.stderr.splitlines() if "error:" in line))
    assert result.returncode == 0, result.stderr[-2000:]


def read_default_corpus(folder: Path, path: Path, corpus) -> None:
    """The offline corpus (no data configured), as a fit reads it: the checks, then the
    validation blocks."""
    with pytest.MonkeyPatch.context() as env:
        env.setenv("FIXED_EMBED_CACHE", str(folder))
        dm = TextDataModule(seq_len=SEQ, val_sequences=4)
        dm.check_inputs()
        dm.validation_blocks()


# (root, file-name pattern) -> (its reader, whether it may be rebuilt with a warning instead of
# refused)
READERS: dict[tuple[str, str], tuple[Callable[[Path, Path, object], None], bool]] = {
    ("shards", "*.bin"): (read_shards, False),
    ("shards", INDEX): (read_shards, False),
    ("shards", "tokenizer.json"): (read_shards, False),
    ("run", "*.ckpt"): (read_checkpoint_both_ways, False),
    ("cache", "*.pt"): (read_validation_cache, True),
    ("cache", "*.jsonl"): (read_default_corpus, True),
    ("cache", "sha256.json"): (read_default_corpus, True),
    ("run", "results.json"): (read_results, False),
}
# written for people or other tools (config.yaml only as a --config: tests/test_bad_paths.py)
NOT_READ = {
    ("run", "events.out.tfevents.*"),
    ("run", "hparams.yaml"),
    ("run", "config.yaml"),
    ("run", "table.md"),
}

# Kinds still read without a refusal; the test fails when one starts refusing: drop it here then.
STILL_SILENT: dict[tuple[str, str], str] = {}


def kind(root: str, rel: Path, kinds) -> tuple[str, str] | None:
    return next((k for k in kinds if k[0] == root and fnmatch(rel.name, k[1])), None)


def outcome(reader, rebuilt_ok: bool, folder: Path, path: Path, corpus) -> str | None:
    """``None`` when the changed ``path`` was refused in one line naming it (or, for a cache,
    rebuilt saying so); otherwise what happened instead."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            reader(folder, path, corpus)
        except UserError as error:
            said = str(error)
            return (
                None
                if path.name in said and "\n" not in said
                else f"refused, but in other words: {said!r}"
            )
        except Exception as error:
            return f"{type(error).__name__}: {str(error)[:300]}"
    if rebuilt_ok and any(path.name in str(w.message) for w in caught):
        return None
    return "read without a word"


def test_every_file_the_project_writes_is_classified(written):
    kinds = [*READERS, *NOT_READ]
    unknown = [f"{root}/{rel}" for root, rel in files(written) if kind(root, rel, kinds) is None]
    assert not unknown, (
        f"files of no known kind {unknown}: add each to READERS (its reader) or NOT_READ"
    )
    seen = {kind(root, rel, kinds) for root, rel in files(written)}
    assert seen == set(kinds), f"kinds no longer written {set(kinds) - seen}: drop them"


def test_each_file_read_back_changed_in_place_is_refused_in_one_line_naming_it(
    written, corpus, tmp_path
):
    failures, tried = [], set()
    for n, (root, rel) in enumerate(files(written)):
        if (which := kind(root, rel, READERS)) is None:
            continue
        copy = tmp_path / f"{n}" / root
        shutil.copytree(written[root], copy, symlinks=True)
        flip(copy / rel)
        tried.add(which)
        why = outcome(*READERS[which], copy, copy / rel, corpus)
        if (why is None) == (which in STILL_SILENT):
            failures.append(f"{root}/{rel}: {why or 'now refused: drop it from STILL_SILENT'}")
    assert tried == set(READERS)
    assert not failures, "\n".join(failures)


# -- token shards: the two ways a shard goes wrong unseen by its size
# ---------------------------------------


def test_ids_inside_the_vocabulary_written_over_a_shard_are_refused_by_its_checksum(
    written, tmp_path
):
    folder = shutil.copytree(written["shards"], tmp_path / "s")
    shard = sorted(folder.glob("train-*.bin"))[-1]
    ids = np.memmap(shard, dtype=np.uint16, mode="r+")
    ids[len(ids) // 2 :] = 7  # a valid id: the model would train on it
    ids.flush()
    del ids
    with pytest.raises(
        DataError, match=rf"token shard \S*{shard.name} does not match its SHA-256 in \S*{INDEX}"
    ):
        TokenShards(folder)


def test_an_index_without_checksums_warns_and_a_bad_id_names_its_shard_and_block(written, tmp_path):
    folder = shutil.copytree(written["shards"], tmp_path / "s")
    index = json.loads((folder / INDEX).read_text())
    for entry in index["shards"]["train"]:
        del entry["sha256"]  # as pretokenize wrote them before checksums
    (folder / INDEX).write_text(json.dumps(index))
    shard = folder / index["shards"]["train"][1]["file"]
    ids = np.memmap(shard, dtype=np.uint16, mode="r+")
    ids[5] = 9000
    ids.flush()
    del ids
    with pytest.warns(
        UserWarning, match=rf"{INDEX} has no shard checksums: only sizes are checked"
    ):
        shards = TokenShards(folder)
    width = SEQ + 1
    block = (int(shards.starts[1]) + 5) // width
    with pytest.raises(
        DataError,
        match=rf"token shard \S*{shard.name}: block {block} holds id 9000, outside the vocab",
    ):
        shards.blocks(np.arange(shards.block_count(width)), width)
    # the blocks around it still read
    assert shards.blocks(np.array([block + 1]), width).max() < 300


# -- checkpoints: torch.save's CRC-32s, whatever path names the file
# ----------------------------------------------


def test_a_checkpoint_is_refused_by_its_crc32_and_one_saved_without_them_is_read(tmp_path):
    from fixed_embed.distributed.checkpoint import load_weights_only
    from fixed_embed.errors import CheckpointError

    torch.save({"weights": torch.arange(4096.0)}, tmp_path / "a.ckpt")
    flip(tmp_path / "a.ckpt")
    (tmp_path / "link.ckpt").symlink_to("a.ckpt")
    for name in ("a.ckpt", "link.ckpt"):
        with pytest.raises(
            CheckpointError,
            match=rf"{name}: its record \S+ does not match the CRC-32 written with it",
        ):
            load_weights_only(tmp_path / name, tmp_path / name)
    # torch writes 0 for every record: nothing to check against
    torch.serialization.set_crc32_options(False)
    try:
        torch.save({"weights": torch.arange(4096.0)}, tmp_path / "b.ckpt")
    finally:
        torch.serialization.set_crc32_options(True)
    assert load_weights_only(tmp_path / "b.ckpt", tmp_path / "b.ckpt")["weights"][-1] == 4095

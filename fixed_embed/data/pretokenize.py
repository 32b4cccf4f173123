"""Write token shards: ``{train,held_out}-NNNNN.bin`` per virtual shard, each atomic with its
``part-NNNNN.json`` and kept by a rerun of the same arguments; the index comes last
(docs/data.md, "Writing")."""

from __future__ import annotations

import json
import multiprocessing
import os
import time
from collections.abc import Callable
from concurrent.futures import FIRST_EXCEPTION, ProcessPoolExecutor, wait
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import numpy as np
from tokenizers import Tokenizer

from fixed_embed.atomic import atomic_write, atomic_write_text
from fixed_embed.data.sharding import is_held_out, reader_plan, virtual_shard_of
from fixed_embed.data.sources import DocumentSource
from fixed_embed.data.token_shards import (
    FORMAT,
    INDEX,
    SPLITS,
    TOKENIZER_FILE,
    VERSION,
    checksum,
    token_dtype,
)
from fixed_embed.data.tokenizer import EOS, load_tokenizer, special_token_id, tokenizer_fingerprint
from fixed_embed.errors import ConfigError, DataError, UserError

PLAN = "pretokenize.json"
PART = "part-{:05d}.json"  # a finished shard's counts, until the index gathers them
SHARD = "{}-{:05d}.bin"  # a split's file of a shard
CONCURRENT = (".task-", f".{PLAN}.tmp-")  # what tasks starting at once put in an empty --out
HOLDOUT_RULE = (
    "held out when int(sha256(utf-8 text).hexdigest()[:8], 16) % 1000 < per_mille "
    "(fixed_embed.data.sharding)"
)
Progress = Callable[[dict[str, int]], None]


def pretokenize(
    source: DocumentSource,
    tokenizer: str,
    out: str | os.PathLike,
    *,
    shards: int = 64,
    workers: int = 1,
    holdout_per_mille: int = 10,
    tokenize_batch: int = 64,
    overwrite: bool = False,
    progress: Progress | None = None,
    task: tuple[int, int] | None = None,
) -> dict[str, Any]:
    """Write ``source``'s documents as token shards into ``out``; returns the totals and the
    time taken. ``progress`` (called in this process): ``{"total_bytes": N}``, then increments
    of documents, tokens, text_bytes. ``task=(i, n)``: the i-th of n runs of shards only (the n
    may run at once), no index: the call without task's."""
    if not 0 <= holdout_per_mille <= 1000:
        raise ConfigError(
            f"pretokenize: --holdout-per-mille must be in [0, 1000], got {holdout_per_mille}"
        )
    start = time.perf_counter()
    out = Path(out).expanduser()
    if out.exists() and not out.is_dir():
        raise ConfigError(
            f"pretokenize: --out {out} is a file; --out names the folder to hold the shards"
        )
    tok = load_tokenizer(tokenizer)
    plan = _plan(source, tok, tokenizer) | {
        "shards": shards,
        "holdout": {"per_mille": holdout_per_mille, "rule": HOLDOUT_RULE},
        "tokenize_batch": tokenize_batch,
    }
    i, n = task or (0, 1)  # the i-th of n runs of the shards
    mine = range(i * shards // n, (i + 1) * shards // n)
    todo = _prepare(out, plan, overwrite, tok, mine)
    if progress is not None and source.is_local:
        progress({"total_bytes": sum(size for _, size in plan["source"]["fingerprint"]["files"])})
    _write_all(source, out, plan, todo, workers, progress)
    kept = len(mine) - len(todo)
    if task:  # the index is the call without task's
        return {
            "task": (*task, mine.start, mine.stop),
            "written": len(todo),
            "kept": kept,
            "out": str(out),
        }
    totals = _write_index(out, plan)
    seconds = time.perf_counter() - start
    return {
        **totals,
        "seconds": seconds,
        "tokens_per_s": totals["tokens"] / max(seconds, 1e-9),
        "resumed_shards": kept,
        "out": str(out),
    }


def _plan(source: DocumentSource, tok: Tokenizer, spec: str) -> dict[str, Any]:
    """The inputs a run writes from, kept in ``out`` until the index: a rerun of others is
    refused."""
    eos_id, vocab = special_token_id(tok, EOS), tok.get_vocab_size()
    try:
        ds = source.open()  # checks the files (or the hub) before anything is written
    except UserError:
        raise
    # no file, no network, no text field, mixed kinds
    except (OSError, KeyError, ValueError) as error:
        raise DataError(
            f"pretokenize: --data {source.path}: {str(error).strip(chr(39))}"
        ) from error
    return {
        "format": FORMAT,
        "version": VERSION,
        "source": {
            "path": source.path,
            "split": source.split,
            "name": source.name,
            "text_field": source.text_field,
            "fingerprint": source.fingerprint(),
            "source_shards": ds.num_shards,
        },
        "tokenizer": {
            "fingerprint": tokenizer_fingerprint(tok),
            "spec": str(spec),
            "file": TOKENIZER_FILE,
        },
        "vocab_size": vocab,
        "eos_id": eos_id,
        "dtype": token_dtype(vocab),
    }


def _prepare(
    out: Path, plan: dict[str, Any], overwrite: bool, tok: Tokenizer, mine: range
) -> list[int]:
    """Make ``out`` ready to write shards ``mine`` with ``tok``; return those still to write (an
    interrupted run of the same ``plan`` finished the others)."""
    if (out / INDEX).exists() and not overwrite:
        raise ConfigError(
            f"pretokenize: {out} already holds token shards ({INDEX}); pass --overwrite to replace "
            "them, or choose another --out"
        )
    try:
        saved = json.loads((out / PLAN).read_text())
    except (OSError, ValueError):
        saved = None
    existing = list(out.iterdir()) if out.exists() else []
    if overwrite:
        for path in existing:
            ours = path.name in (INDEX, PLAN, TOKENIZER_FILE) or path.suffix == ".bin"
            if path.is_file() and (ours or path.match("part-*.json")):
                path.unlink()
    elif saved is not None and saved != plan:
        changed = sorted(k for k in set(saved) | set(plan) if saved.get(k) != plan.get(k))
        raise ConfigError(
            f"pretokenize: {out} holds an unfinished pretokenize of other inputs (differing: "
            f"{', '.join(changed)}); pass --overwrite to start again there, or choose another --out"
        )
    elif saved is None and any(not p.name.startswith(CONCURRENT) for p in existing):
        raise ConfigError(
            f"pretokenize: {out} is not empty; choose an empty or new --out, or pass --overwrite"
        )
    out.mkdir(parents=True, exist_ok=True)
    if saved != plan or overwrite:
        atomic_write_text(out / PLAN, json.dumps(plan, indent=1))
    todo = [v for v in mine if not _finished(out, v, plan["dtype"])]
    # a killed writer's or worker's: these names are this run's alone while it holds the lock
    for half in (p for v in mine for s in SPLITS for p in out.glob(f".{SHARD.format(s, v)}.tmp-*")):
        half.unlink()
    # written over when it changed since a first run: the shards' ids are this one's
    if not (own := out / TOKENIZER_FILE).is_file() or own.read_text() != tok.to_str(pretty=True):
        atomic_write_text(own, tok.to_str(pretty=True))
    return todo


def _finished(out: Path, v: int, dtype: str) -> bool:
    try:
        part = json.loads((out / PART.format(v)).read_text())
    except (OSError, ValueError):
        return False
    itemsize = np.dtype(dtype).itemsize
    files = [(out / part[s]["file"], part[s]["tokens"] * itemsize) for s in SPLITS]
    # a shard without tokens has no file
    return all((path.stat().st_size if path.is_file() else 0) == n for path, n in files)


class _Shard(ExitStack):
    """The two files (train, held-out) of one output shard, written through temporary names
    (atomic) that closing it renames into place, and its ``part`` record."""

    def __init__(self, out: Path, v: int) -> None:
        super().__init__()
        self.out, self.v = out, v
        self.part: dict[str, Any] = {
            s: {"file": SHARD.format(s, v), "documents": 0, "tokens": 0} for s in SPLITS
        }
        self.part |= {"empty_documents": 0, "replaced_characters": 0}
        self.files = {
            s: self.enter_context(atomic_write(out / SHARD.format(s, v), "wb")) for s in SPLITS
        }

    def write(self, split: str, ids: np.ndarray) -> None:
        try:
            self.files[split].write(ids.tobytes())
        except OSError as error:  # named here: the error passes every open shard's atomic_path
            error.filename = error.filename or str(self.out / self.part[split]["file"])
            raise
        self.part[split]["documents"] += 1
        self.part[split]["tokens"] += len(ids)

    def finish(self) -> None:
        self.close()  # flush, fsync, rename into place
        for split in SPLITS:
            path = self.out / self.part[split]["file"]
            if self.part[split]["tokens"] == 0:
                path.unlink()  # the index lists only shards with tokens
            else:  # read back from the page cache: what the reader checks is what reached the file
                self.part[split]["sha256"] = checksum(path)
        atomic_write_text(self.out / PART.format(self.v), json.dumps(self.part))


def _write(
    source: DocumentSource,
    out: Path,
    plan: dict[str, Any],
    mine: list[int],
    progress: Progress | None,
) -> None:
    """Write shards ``mine`` of ``plan`` into ``out``, reading their source shards once."""
    tok = load_tokenizer(out / TOKENIZER_FILE)
    ds = source.open()
    s, v_all = ds.num_shards, plan["shards"]
    units = {v: reader_plan(s, v_all, v, v_all) for v in mine}
    per_mille = plan["holdout"]["per_mille"]
    with ExitStack() as unfinished:  # their temporary files removed on an error
        open_shards = {v: unfinished.enter_context(_Shard(out, v)) for v in mine}
        for f in sorted({f for plan_v in units.values() for f, _, _ in plan_v}):
            j = 0  # the number of the batch's first document in the source shard
            for batch in ds.shard(num_shards=s, index=f, contiguous=True).iter(
                batch_size=plan["tokenize_batch"]
            ):
                texts, kept = batch[source.text_field], []
                for i, text in enumerate(texts, j):
                    if (target := open_shards.get(virtual_shard_of(s, v_all, f, i))) is None:
                        continue  # not one of mine
                    if not isinstance(text, str) or not text.strip():
                        target.part["empty_documents"] += 1
                        continue
                    target.part["replaced_characters"] += text.count("\ufffd")
                    kept.append(
                        (target, "held_out" if is_held_out(text, per_mille) else "train", text)
                    )
                j += len(texts)
                # tokenized together; each to its shard's split, then EOS
                encodings = tok.encode_batch([text for *_, text in kept], add_special_tokens=False)
                for (target, split, _), encoding in zip(kept, encodings, strict=True):
                    ids = [*encoding.ids, plan["eos_id"]]
                    target.write(split, np.asarray(ids, dtype=plan["dtype"]))
                if progress is not None and kept:
                    tokens = sum(len(encoding.ids) + 1 for encoding in encodings)
                    text_bytes = sum(len(text.encode("utf-8", "replace")) for *_, text in kept)
                    progress({"documents": len(kept), "tokens": tokens, "text_bytes": text_bytes})
            # every shard's last source shard is among those read: all finish here
            for v in [v for v, plan_v in units.items() if plan_v[-1][0] == f]:
                open_shards.pop(v).finish()


def _init_worker(threads: int) -> None:
    # the tokenizer's own thread pool, sized so the workers share the cores, not each take all
    os.environ.setdefault("RAYON_NUM_THREADS", str(threads))
    os.environ.setdefault("RAYON_RS_NUM_CPUS", str(threads))


def _write_all(
    source: DocumentSource,
    out: Path,
    plan: dict[str, Any],
    todo: list[int],
    workers: int,
    progress: Progress | None,
) -> None:
    """Write shards ``todo``: here, or split into consecutive runs over ``workers`` processes."""
    workers = min(workers, len(todo))
    if workers <= 1:
        return _write(source, out, plan, todo, progress)
    ctx = multiprocessing.get_context("spawn")  # no forked tokenizer or datasets state
    threads = max(1, (os.cpu_count() or 1) // workers)
    with (
        ctx.Manager() as manager,
        ProcessPoolExecutor(
            workers, mp_context=ctx, initializer=_init_worker, initargs=(threads,)
        ) as pool,
    ):
        queue = manager.Queue()
        runs = (run.tolist() for run in np.array_split(todo, workers))  # consecutive shards
        pending = {pool.submit(_write, source, out, plan, run, queue.put) for run in runs}
        while pending:
            finished, pending = wait(pending, timeout=0.2, return_when=FIRST_EXCEPTION)
            _drain(queue, progress)
            for future in finished:
                future.result()  # re-raises a worker's error here
        _drain(queue, progress)


def _drain(queue: Any, progress: Progress | None) -> None:
    while not queue.empty():  # this process alone takes from it: get() does not wait
        update = queue.get()
        if progress is not None:
            progress(update)


def _write_index(out: Path, plan: dict[str, Any]) -> dict[str, Any]:
    """Gather the finished shards' counts into ``token_shards.json`` (atomically, last), then
    drop the parts and plan; returns the totals, with the tokens and their bytes."""
    parts = [json.loads((out / PART.format(v)).read_text()) for v in range(plan["shards"])]
    shards = {
        s: [{**p[s], "dtype": plan["dtype"]} for p in parts if p[s]["tokens"]] for s in SPLITS
    }
    totals: dict[str, Any] = {
        s: {k: sum(p[s][k] for p in parts) for k in ("documents", "tokens")}
        | {"shards": len(shards[s])}
        for s in SPLITS
    }
    totals |= {k: sum(p[k] for p in parts) for k in ("empty_documents", "replaced_characters")}
    index = {
        **plan,
        "packing": "each document: its ids, then eos_id; documents back to back in index order",
        "shards": shards,
        "totals": totals,
    }
    atomic_write_text(out / INDEX, json.dumps(index, indent=1))
    for v in range(plan["shards"]):
        (out / PART.format(v)).unlink(missing_ok=True)
    (out / PLAN).unlink(missing_ok=True)
    tokens = totals["train"]["tokens"] + totals["held_out"]["tokens"]
    return {**totals, "tokens": tokens, "bytes": tokens * np.dtype(plan["dtype"]).itemsize}


def summary_line(result: dict[str, Any]) -> str:
    """The one line ``fixed-embed pretokenize`` ends with."""
    if "task" in result:
        i, n, lo, hi = result["task"]
        return (
            f"pretokenize: task {i} of {n} wrote {result['written']} of its shards {lo}..{hi - 1} "
            f"({result['kept']} finished before) -> {result['out']}; once all {n} tasks have "
            f"finished, the same `fixed-embed pretokenize` command without --tasks/--task writes "
            f"the index {INDEX}"
        )
    train, held = result["train"], result["held_out"]
    resumed = (
        f", {result['resumed_shards']} shards kept from an earlier run"
        if result["resumed_shards"]
        else ""
    )
    return (
        f"pretokenize: {train['documents'] + held['documents']:,} documents ({held['documents']:,} "
        f"held out, {result['empty_documents']:,} empty skipped), {result['tokens']:,} tokens, "
        f"{result['bytes']:,} bytes in {train['shards'] + held['shards']} shard files, "
        f"{result['seconds']:.1f} s, {result['tokens_per_s']:,.0f} tokens/s{resumed} -> "
        f"{result['out']}"
    )

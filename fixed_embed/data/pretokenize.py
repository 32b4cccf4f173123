"""Write token shards: ``{train,held_out}-NNNNN.bin`` per virtual shard, each atomic with its
``part-NNNNN.json`` and kept by a rerun of the same arguments; the index comes last
(docs/data.md, "Writing")."""

from __future__ import annotations

import json
import multiprocessing
import os
import sys
import time
from collections.abc import Callable
from concurrent.futures import FIRST_EXCEPTION, ProcessPoolExecutor, wait
from contextlib import ExitStack, suppress
from dataclasses import dataclass
from pathlib import Path
from queue import Empty
from typing import Any

import numpy as np

from fixed_embed.atomic import atomic_path, atomic_write_text
from fixed_embed.data.sharding import document_cycle, is_held_out, reader_plan, virtual_shard_of
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
CONCURRENT = (
    ".task-",
    f".{PLAN}.tmp-",
)  # what tasks starting at once put in an empty --out: locks, the plan
HOLDOUT_RULE = (
    "held out when int(sha256(utf-8 text).hexdigest()[:8], 16) % 1000 < per_mille "
    "(fixed_embed.data.sharding)"
)
Progress = Callable[[dict[str, int]], None]


@dataclass(frozen=True)
class _Job:
    """One worker's share: the unfinished shards ``mine`` of ``shards``, tokenized with
    ``out``'s tokenizer."""

    source: DocumentSource
    out: str
    shards: int
    mine: tuple[int, ...]
    holdout_per_mille: int
    tokenize_batch: int
    dtype: str
    eos_id: int


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
    for name, value in (
        ("shards", shards),
        ("workers", workers),
        ("tokenize_batch", tokenize_batch),
    ):
        if not isinstance(value, int) or value < 1:
            raise ConfigError(
                f"pretokenize: --{name.replace('_', '-')} must be an integer >= 1, got {value!r}"
            )
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
    eos_id, vocab = special_token_id(tok, EOS), tok.get_vocab_size()
    dtype = token_dtype(vocab)
    try:
        ds = source.open()  # checks the files (or the hub) before anything is written
    except (
        OSError,
        KeyError,
        ValueError,
    ) as error:  # no file, no network, no text field, mixed kinds
        if isinstance(error, UserError):
            raise
        raise DataError(
            f"pretokenize: --data {source.path}: {str(error).strip(chr(39))}"
        ) from error
    plan = {
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
            "spec": str(tokenizer),
            "file": TOKENIZER_FILE,
        },
        "vocab_size": vocab,
        "eos_id": eos_id,
        "dtype": dtype,
        "shards": shards,
        "holdout": {"per_mille": holdout_per_mille, "rule": HOLDOUT_RULE},
        "tokenize_batch": tokenize_batch,
    }
    done = _prepare(out, plan, overwrite)
    mine = (
        range(task[0] * shards // task[1], (task[0] + 1) * shards // task[1])
        if task
        else range(shards)
    )
    for half in (
        p for v in mine for split in SPLITS for p in out.glob(f".{_shard_file(split, v)}.tmp-*")
    ):
        # a killed writer's or worker's: these names are this run's alone while it holds the lock
        half.unlink()
    saved = (
        out / TOKENIZER_FILE
    )  # written over when it changed since a first run: the shards' ids are this one's
    if not saved.is_file() or saved.read_text() != tok.to_str(pretty=True):
        atomic_write_text(saved, tok.to_str(pretty=True))
    if progress is not None and source.is_local:
        progress({"total_bytes": sum(size for _, size in plan["source"]["fingerprint"]["files"])})
    todo = [v for v in mine if v not in done]
    workers = min(
        workers, len(todo)
    )  # none when every shard is finished; each a consecutive run of them
    jobs = [
        _Job(
            source,
            str(out),
            shards,
            tuple(todo[w * len(todo) // workers : (w + 1) * len(todo) // workers]),
            holdout_per_mille,
            tokenize_batch,
            dtype,
            eos_id,
        )
        for w in range(workers)
    ]
    if len(jobs) == 1:
        _write(jobs[0], progress)
    elif jobs:
        _run_processes(jobs, progress)
    if task:  # the index is the call without task's
        return {
            "task": (*task, mine.start, mine.stop),
            "written": len(todo),
            "kept": len(mine) - len(todo),
            "out": str(out),
        }
    index = _write_index(out, plan)
    seconds = time.perf_counter() - start
    totals = index["totals"]
    tokens = totals["train"]["tokens"] + totals["held_out"]["tokens"]
    disk = sum((out / e["file"]).stat().st_size for split in SPLITS for e in index["shards"][split])
    return {
        **totals,
        "tokens": tokens,
        "bytes": disk,
        "seconds": seconds,
        "tokens_per_s": tokens / max(seconds, 1e-9),
        "resumed_shards": len(done),
        "out": str(out),
    }


def _part(out: Path, v: int) -> Path:
    return out / f"part-{v:05d}.json"


def _shard_file(split: str, v: int) -> str:
    return f"{split}-{v:05d}.bin"


def _prepare(out: Path, plan: dict[str, Any], overwrite: bool) -> set[int]:
    """Make ``out`` ready; return the shards already finished by an interrupted run of the same
    ``plan``."""
    if out.is_dir() and (out / INDEX).exists() and not overwrite:
        raise ConfigError(
            f"pretokenize: {out} already holds token shards ({INDEX}); pass --overwrite to replace "
            "them, "
            "or choose another --out"
        )
    try:
        saved = json.loads((out / PLAN).read_text())
    except (OSError, ValueError):
        saved = None
    if overwrite and out.is_dir():
        for path in out.iterdir():
            ours = (
                path.name in (INDEX, PLAN, TOKENIZER_FILE)
                or path.suffix == ".bin"
                or path.match("part-*.json")
            )
            if path.is_file() and ours:
                path.unlink()
    elif saved is not None and saved != plan:
        changed = sorted(k for k in set(saved) | set(plan) if saved.get(k) != plan.get(k))
        raise ConfigError(
            f"pretokenize: {out} holds an unfinished pretokenize of other inputs (differing: "
            f"{', '.join(changed)}); "
            "pass --overwrite to start again there, or choose another --out"
        )
    elif (
        saved is None
        and out.is_dir()
        and any(not p.name.startswith(CONCURRENT) for p in out.iterdir())
    ):
        raise ConfigError(
            f"pretokenize: {out} is not empty; choose an empty or new --out, or pass --overwrite"
        )
    out.mkdir(parents=True, exist_ok=True)
    if saved != plan or overwrite:
        atomic_write_text(out / PLAN, json.dumps(plan, indent=1))
    return {v for v in range(plan["shards"]) if _finished(out, v, plan["dtype"])}


def _finished(out: Path, v: int, dtype: str) -> bool:
    try:
        part = json.loads(_part(out, v).read_text())
    except (OSError, ValueError):
        return False
    itemsize = np.dtype(dtype).itemsize
    paths = {
        split: out / part[split]["file"] for split in SPLITS
    }  # a shard without tokens has no file
    return all(
        (p.stat().st_size if p.is_file() else 0) == part[s]["tokens"] * itemsize
        for s, p in paths.items()
    )


class _Shard:
    """The two files (train, held-out) of one output shard, written through temporary names
    (atomic)."""

    def __init__(self, out: Path, v: int) -> None:
        self.out, self.v, self.stack = out, v, ExitStack()
        self.files = {}
        for split in SPLITS:
            tmp = self.stack.enter_context(atomic_path(out / _shard_file(split, v)))
            self.files[split] = self.stack.enter_context(open(tmp, "wb"))  # noqa: SIM115 (closed by the stack)
        self.counts = {s: {"documents": 0, "tokens": 0} for s in SPLITS}
        self.empty_documents = self.replaced_characters = 0

    def finish(self) -> None:
        self.stack.close()  # flush, fsync, rename into place
        part = {s: {"file": _shard_file(s, self.v), **self.counts[s]} for s in SPLITS}
        for split in SPLITS:
            if self.counts[split]["tokens"] == 0:
                (
                    self.out / _shard_file(split, self.v)
                ).unlink()  # the index lists only shards with tokens
            else:  # read back from the page cache: what the reader checks is what reached the file
                part[split]["sha256"] = checksum(self.out / _shard_file(split, self.v))
        part.update(
            empty_documents=self.empty_documents, replaced_characters=self.replaced_characters
        )
        atomic_write_text(_part(self.out, self.v), json.dumps(part))


def _write(job: _Job, progress: Progress | None) -> None:
    """Write shards ``job.mine``, reading their source shards once."""
    out, dtype = Path(job.out), np.dtype(job.dtype)
    tok = load_tokenizer(out / TOKENIZER_FILE)
    ds = job.source.open()
    s, v_all = ds.num_shards, job.shards
    cycle = document_cycle(s, v_all)
    last_source = {v: reader_plan(s, v_all, v, v_all)[-1][0] for v in job.mine}
    open_shards = {v: _Shard(out, v) for v in job.mine}
    try:
        units = [u for v in job.mine for u in reader_plan(s, v_all, v, v_all)]
        for f in sorted({f for f, _, _ in units}):
            ranges = [(lo, hi) for g, lo, hi in units if g == f]
            j = 0
            for batch in ds.shard(num_shards=s, index=f, contiguous=True).iter(
                batch_size=job.tokenize_batch
            ):
                texts = batch[job.source.text_field]
                kept: list[tuple[_Shard, str, str]] = []
                for i, text in enumerate(texts, j):
                    if not any(lo <= i % cycle < hi for lo, hi in ranges):
                        continue
                    target = open_shards[
                        virtual_shard_of(s, v_all, f, i)
                    ]  # one of mine: the ranges are theirs
                    if not isinstance(text, str) or not text.strip():
                        target.empty_documents += 1
                        continue
                    target.replaced_characters += text.count("\ufffd")
                    kept.append(
                        (
                            target,
                            "held_out" if is_held_out(text, job.holdout_per_mille) else "train",
                            text,
                        )
                    )
                j += len(texts)
                if not kept:
                    continue
                encodings = tok.encode_batch(
                    [text for _, _, text in kept], add_special_tokens=False
                )
                tokens = text_bytes = 0
                for (target, split, text), encoding in zip(kept, encodings, strict=True):
                    ids = np.asarray([*encoding.ids, job.eos_id], dtype=dtype)
                    try:
                        target.files[split].write(ids.tobytes())
                    except (
                        OSError
                    ) as error:  # named here: the error passes every open shard's atomic_path
                        error.filename = error.filename or str(
                            target.out / _shard_file(split, target.v)
                        )
                        raise
                    target.counts[split]["documents"] += 1
                    target.counts[split]["tokens"] += len(ids)
                    tokens += len(ids)
                    text_bytes += len(text.encode("utf-8", "replace"))
                if progress is not None:
                    progress({"documents": len(kept), "tokens": tokens, "text_bytes": text_bytes})
            for v in [v for v, last in last_source.items() if last == f and v in open_shards]:
                open_shards.pop(
                    v
                ).finish()  # every shard's last source shard is among those read: all finish here
    except BaseException:
        for target in open_shards.values():
            target.stack.__exit__(*sys.exc_info())  # its temporary files removed
        raise


_QUEUE: Any = None


def _init_worker(queue: Any, threads: int) -> None:
    global _QUEUE
    _QUEUE = queue
    # the tokenizer's own thread pool, sized so the workers share the cores instead of each taking
    # all
    os.environ.setdefault("RAYON_NUM_THREADS", str(threads))
    os.environ.setdefault("RAYON_RS_NUM_CPUS", str(threads))


def _write_in_worker(job: _Job) -> None:
    _write(job, _QUEUE.put)


def _run_processes(jobs: list[_Job], progress: Progress | None) -> None:
    ctx = multiprocessing.get_context("spawn")  # no forked tokenizer or datasets state
    queue = ctx.Queue()
    threads = max(1, (os.cpu_count() or 1) // len(jobs))
    with ProcessPoolExecutor(
        len(jobs), mp_context=ctx, initializer=_init_worker, initargs=(queue, threads)
    ) as pool:
        pending = {pool.submit(_write_in_worker, job) for job in jobs}
        while pending:
            finished, pending = wait(pending, timeout=0.2, return_when=FIRST_EXCEPTION)
            _drain(queue, progress)
            for future in finished:
                future.result()  # re-raises a worker's error here
        _drain(queue, progress)


def _drain(queue: Any, progress: Progress | None) -> None:
    with suppress(Empty):
        while True:
            update = queue.get_nowait()
            if progress is not None:
                progress(update)


def _write_index(out: Path, plan: dict[str, Any]) -> dict[str, Any]:
    """Gather the finished shards' counts into ``token_shards.json`` (atomically, last); drop
    the parts and plan."""
    parts = [json.loads(_part(out, v).read_text()) for v in range(plan["shards"])]
    shards = {
        s: [{**p[s], "dtype": plan["dtype"]} for p in parts if p[s]["tokens"]] for s in SPLITS
    }
    totals: dict[str, Any] = {
        s: {k: sum(p[s][k] for p in parts) for k in ("documents", "tokens")} for s in SPLITS
    }
    for split in SPLITS:
        totals[split]["shards"] = len(shards[split])
    totals |= {k: sum(p[k] for p in parts) for k in ("empty_documents", "replaced_characters")}
    index = {
        **plan,
        "packing": "each document: its ids, then eos_id; documents back to back in index order",
        "shards": shards,
        "totals": totals,
    }
    atomic_write_text(out / INDEX, json.dumps(index, indent=1))
    for v in range(plan["shards"]):
        _part(out, v).unlink(missing_ok=True)
    (out / PLAN).unlink(missing_ok=True)
    return index


def summary_line(result: dict[str, Any]) -> str:
    """The one line ``fixed-embed pretokenize`` ends with."""
    if "task" in result:
        i, n, lo, hi = result["task"]
        return (
            f"pretokenize: task {i} of {n} wrote {result['written']} of its shards {lo}..{hi - 1} "
            f"({result['kept']} finished before) -> {result['out']}; once all {n} tasks have "
            "finished, the same "
            f"`fixed-embed pretokenize` command without --tasks/--task writes the index {INDEX}"
        )
    train, held = result["train"], result["held_out"]
    resumed = (
        f", {result['resumed_shards']} shards kept from an earlier run"
        if result["resumed_shards"]
        else ""
    )
    return (
        f"pretokenize: {train['documents'] + held['documents']:,} documents ({held['documents']:,} "
        "held out, "
        f"{result['empty_documents']:,} empty skipped), {result['tokens']:,} tokens, "
        f"{result['bytes']:,} bytes in "
        f"{train['shards'] + held['shards']} shard files, {result['seconds']:.1f} s, "
        f"{result['tokens_per_s']:,.0f} "
        f"tokens/s{resumed} -> {result['out']}"
    )

"""Which reader reads which document: the sharding arithmetic of ``PackedBlocks``, and the hash hold-out.

The source has ``S`` shards of its own (its files; for a hub stream, the stream's ``num_shards``)
and the stream ``V`` virtual shards (``num_shards``; ``None``, or fewer than the readers: one per
reader). Think of an ``S x V`` grid of units, ``V`` per source shard; virtual shard ``v`` is the
units ``[v * S, (v + 1) * S)``: whole files when ``V`` divides ``S``, a ``1 / (V / S)`` slice of
one file when ``S`` divides ``V``, in general at most ``ceil(S / V) + 1`` consecutive files.
Within a file, document ``j`` is in part ``j % m`` (``m = V / gcd(S, V)``, the finest cut any
shard boundary needs), which spans ``gcd(S, V)`` units: so virtual shard
``(f * V + gcd(S, V) * (j % m)) // S`` for document ``j`` of file ``f``. Each virtual shard packs
its own documents (its own carry), in file then document order.

The ``R = world_size x num_workers`` readers own consecutive virtual shards (reader ``r``:
``[r * V // R, (r + 1) * V // R)``), hence a consecutive run of units, and open only the source
shards those units lie in, each with ``datasets``' ``shard``: a reader downloads and parses
exactly its ``S / R`` files when ``R`` divides ``S`` (and ``V``), the one file it shares with
``R / S - 1`` other readers when ``S`` divides ``R``, and in general about ``S / R + 1`` source
shards at most -- never the whole stream. Within a shared file documents are split by index.

What the blocks depend on: ``V``, the source and the packing settings -- not the world. With a
fixed ``num_shards >= R``, any number of ranks and workers yields exactly the blocks of one
process (disjoint and complete); with more readers than ``num_shards`` (or ``num_shards=None``)
``V = R`` and the blocks depend on the number of readers. Readers own equal shares of the
documents when ``R`` divides ``V``. A resume with another reader count is refused either way.
"""

from __future__ import annotations

import hashlib
import math

__all__ = ["document_cycle", "is_held_out", "reader_plan", "virtual_shard_count", "virtual_shard_of"]


def is_held_out(text: str, per_mille: int) -> bool:
    """Hash-based document hold-out: the same documents on every machine and run."""
    return per_mille > 0 and int(hashlib.sha256(text.encode("utf-8", "replace")).hexdigest()[:8], 16) % 1000 < per_mille


def virtual_shard_count(num_shards: int | None, readers: int) -> int:
    """The virtual shards a stream of ``num_shards`` uses with ``readers`` readers (never fewer than them)."""
    return readers if num_shards is None or num_shards < readers else num_shards


def document_cycle(source_shards: int, virtual_shards: int) -> int:
    """``m``: document ``j`` of a source shard is in its part ``j % m`` (see the module docstring)."""
    return virtual_shards // math.gcd(source_shards, virtual_shards)


def virtual_shard_of(source_shards: int, virtual_shards: int, shard: int, doc: int) -> int:
    """The virtual shard of document ``doc`` (its index within the source shard) of source shard ``shard``."""
    g = math.gcd(source_shards, virtual_shards)
    return (shard * virtual_shards + g * (doc % (virtual_shards // g))) // source_shards


def reader_plan(source_shards: int, virtual_shards: int, reader: int, readers: int) -> list[tuple[int, int, int]]:
    """The source shards reader ``reader`` of ``readers`` opens, as ``(shard, lo, hi)``, in reading order.

    The reader keeps document ``j`` of source shard ``shard`` when ``lo <= j % m < hi``, with
    ``m = document_cycle(source_shards, virtual_shards)`` (``lo, hi = 0, m``: the whole shard).
    """
    s, v = source_shards, virtual_shards
    if not (s >= 1 and v >= readers >= 1 and 0 <= reader < readers):
        raise ValueError(f"bad sharding: {s} source shards, {v} virtual shards, reader {reader} of {readers}")
    g = math.gcd(s, v)
    first, end = reader * v // readers * s, (reader + 1) * v // readers * s  # its units [first, end)
    return [(f, max(first - f * v, 0) // g, min(end - f * v, v) // g) for f in range(first // v, (end - 1) // v + 1)]

"""Which reader reads which document (``PackedBlocks``' sharding; docs/data.md, "Sharding"), and
the hash hold-out. ``S`` source shards, ``V`` virtual shards, ``g = gcd(S, V)``, ``m = V / g``:
document ``j`` of file ``f`` is in virtual shard ``(f V + g (j % m)) // S``; reader ``r`` of
``R`` owns virtual shards ``[r V // R, (r + 1) V // R)``."""

from __future__ import annotations

import hashlib
import math


def is_held_out(text: str, per_mille: int) -> bool:
    """Hash-based document hold-out: the same documents on every machine and run."""
    return (
        per_mille > 0
        and int(hashlib.sha256(text.encode("utf-8", "replace")).hexdigest()[:8], 16) % 1000
        < per_mille
    )


def virtual_shard_count(num_shards: int | None, readers: int) -> int:
    """The virtual shards a stream of ``num_shards`` uses with ``readers`` readers (never fewer
    than them)."""
    return readers if num_shards is None or num_shards < readers else num_shards


def document_cycle(source_shards: int, virtual_shards: int) -> int:
    """``m``: document ``j`` of a source shard is in its part ``j % m`` (see the module
    docstring)."""
    return virtual_shards // math.gcd(source_shards, virtual_shards)


def virtual_shard_of(source_shards: int, virtual_shards: int, shard: int, doc: int) -> int:
    """The virtual shard of document ``doc`` (its index within the source shard) of source shard
    ``shard``."""
    g = math.gcd(source_shards, virtual_shards)
    return (shard * virtual_shards + g * (doc % (virtual_shards // g))) // source_shards


def reader_plan(
    source_shards: int, virtual_shards: int, reader: int, readers: int
) -> list[tuple[int, int, int]]:
    """The source shards reader ``reader`` of ``readers`` opens, as ``(shard, lo, hi)`` in
    reading order: it keeps document ``j`` when ``lo <= j % m < hi`` (``m =
    document_cycle(...)``; ``0, m``: the whole shard)."""
    s, v = source_shards, virtual_shards
    g = math.gcd(s, v)
    first, end = (
        reader * v // readers * s,
        (reader + 1) * v // readers * s,
    )  # its units [first, end)
    return [
        (f, max(first - f * v, 0) // g, min(end - f * v, v) // g)
        for f in range(first // v, (end - 1) // v + 1)
    ]

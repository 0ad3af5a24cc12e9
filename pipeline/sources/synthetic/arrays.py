"""Vectorised building blocks: expanding parents into children, scrambled ids, time and text columns.

Everything the generator makes is a flat NumPy column; these helpers keep the "one row per child of
each parent" bookkeeping in one place so no module needs a Python loop over rows.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

US_PER_MINUTE = 60_000_000
US_PER_HOUR = 60 * US_PER_MINUTE
US_PER_DAY = 24 * US_PER_HOUR


def year_start(year: np.ndarray) -> np.ndarray:
    """Microseconds since 1970 of 1 January of each ``year`` (MIMIC's shifted years, 2110-2210)."""
    days = (np.asarray(year, dtype="int64") - 1970).astype("datetime64[Y]").astype("datetime64[D]")
    return days.astype("int64") * US_PER_DAY


def expand(counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For ``counts[i]`` children of parent ``i``: each child's parent index and its rank (0-based)."""
    counts = np.asarray(counts, dtype=np.int64)
    parent = np.repeat(np.arange(len(counts)), counts)
    starts = np.cumsum(counts) - counts
    rank = np.arange(len(parent)) - starts[parent]
    return parent, rank


def rank_within(groups: np.ndarray) -> np.ndarray:
    """0-based position of each row within its run of equal ``groups`` values (rows already grouped)."""
    n = len(groups)
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    new = np.ones(n, dtype=bool)
    new[1:] = groups[1:] != groups[:-1]
    first = np.flatnonzero(new)
    return np.arange(n) - np.repeat(first, np.diff(np.append(first, n)))


def scrambled_ids(counter: np.ndarray, base: int, space: int) -> np.ndarray:
    """Distinct, random-looking ids ``base + (a*counter + c) mod space``: a bijection, so never a clash."""
    a = 7_368_787 if space % 7_368_787 else 7_368_791  # prime, coprime with the power-of-ten spaces used
    return (base + (np.asarray(counter, dtype=np.int64) * a + 1_234_567) % space).astype(np.int64)


def choice(rng: np.random.Generator, weights, n: int) -> np.ndarray:
    """Indices drawn from unnormalised ``weights``."""
    w = np.asarray(weights, dtype=float)
    return np.searchsorted(np.cumsum(w / w.sum()), rng.random(n), side="right").clip(0, len(w) - 1)


def uniform_between(rng: np.random.Generator, start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """A time uniformly inside [start, end] (microseconds)."""
    return start + (rng.random(len(start)) * (end - start)).astype(np.int64)


def floor_to(t: np.ndarray, unit: int) -> np.ndarray:
    return t - t % unit


def ceil_to(t: np.ndarray, unit: int) -> np.ndarray:
    return -((-t) // unit) * unit


def timestamps(t: np.ndarray, valid: np.ndarray | None = None) -> pa.Array:
    return pa.array(np.asarray(t, dtype=np.int64), type=pa.timestamp("us"),
                    mask=None if valid is None else ~valid)


def dates(t: np.ndarray) -> pa.Array:
    return pa.array((np.asarray(t, dtype=np.int64) // US_PER_DAY).astype(np.int32), type=pa.date32())


def labels(values, index: np.ndarray, valid: np.ndarray | None = None) -> pa.Array:
    """``values[index]`` as an Arrow string column (NULL where ``valid`` is False)."""
    out = pa.array(list(values), type=pa.string()).take(pa.array(np.asarray(index, dtype=np.int64)))
    if valid is not None:
        out = pc.if_else(pa.array(valid), out, pa.scalar(None, pa.string()))
    return out


def joined_ids(left: np.ndarray, right: np.ndarray) -> pa.Array:
    """MIMIC's ``<subject_id>-<seq>`` identifiers (poe_id, emar_id)."""
    return pc.binary_join_element_wise(pa.array(left).cast(pa.string()), pa.array(right).cast(pa.string()), "-")


def round_to(x: np.ndarray, decimals: np.ndarray | int) -> np.ndarray:
    """Round to ``decimals`` places, so the float equals the number its text shows."""
    scale = 10.0 ** np.asarray(decimals)
    return np.round(np.asarray(x) * scale) / scale


def decimal_text(x: np.ndarray, decimals: np.ndarray | int) -> pa.Array:
    """``x`` formatted with a fixed number of decimals per row ("1.0", "138", "7.38", "-3")."""
    x = np.asarray(x, dtype=float)
    decimals = np.broadcast_to(np.asarray(decimals, dtype=np.int64), x.shape)
    scaled = np.round(np.abs(x) * 10.0 ** decimals).astype(np.int64)
    scale = (10 ** decimals).astype(np.int64)
    whole = pa.array(scaled // scale).cast(pa.string())
    width = int(decimals.max()) if len(x) else 0
    frac = pc.utf8_lpad(pa.array(scaled % scale).cast(pa.string()), width=width, padding="0")
    kept = _tail(frac, width, decimals)
    text = pc.if_else(pa.array(decimals > 0), pc.binary_join_element_wise(whole, kept, "."), whole)
    sign = pa.array(np.where((x < 0) & (scaled > 0), "-", ""))
    return pc.binary_join_element_wise(sign, text, "")


def _tail(text: pa.Array, width: int, keep: np.ndarray) -> pa.Array:
    """Last ``keep[i]`` characters of fixed-width strings (vectorised over distinct ``keep`` values)."""
    out = text
    for k in np.unique(keep):
        piece = pc.utf8_slice_codeunits(text, start=width - int(k), stop=width)
        out = pc.if_else(pa.array(keep == k), piece, out)
    return out

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


def labels(values, index: np.ndarray, valid: np.ndarray | None = None) -> pa.DictionaryArray:
    """``values[index]`` as a dictionary-encoded string column (NULL where ``valid`` is False).

    Building it costs no string copies; staging decodes it to plain text on its writer threads.
    """
    index = np.asarray(index, dtype=np.int32)
    if valid is not None:
        valid = np.asarray(valid, dtype=bool)
        index = np.where(valid, index, 0)
    indices = pa.array(index, mask=None if valid is None else ~valid)
    return pa.DictionaryArray.from_arrays(indices, pa.array(list(values), type=pa.string()))


def joined_ids(left: np.ndarray, right: np.ndarray) -> pa.Array:
    """MIMIC's ``<subject_id>-<seq>`` identifiers (poe_id, emar_id)."""
    return pc.binary_join_element_wise(pa.array(left).cast(pa.string()), pa.array(right).cast(pa.string()), "-")


def round_to(x: np.ndarray, decimals: np.ndarray | int) -> np.ndarray:
    """Round to ``decimals`` places, so the float equals the number its text shows."""
    scale = 10.0 ** np.asarray(decimals)
    return np.round(np.asarray(x) * scale) / scale


def decimal_text(x: np.ndarray, decimals: np.ndarray | int) -> pa.DictionaryArray:
    """``x`` formatted with a fixed number of decimals per row ("1.0", "138", "7.38", "-3").

    Only the distinct (value, decimals) pairs are formatted - measurements repeat a lot - and
    rows index into them, so the cost is a sort rather than string work per row.
    """
    x = np.asarray(x, dtype=float)
    decimals = np.broadcast_to(np.asarray(decimals, dtype=np.int64), x.shape)
    scaled = np.round(x * 10.0 ** decimals).astype(np.int64)
    distinct, inverse = factorize(scaled * 8 + decimals)  # decimals < 8
    texts = [_fixed(int(k) >> 3, int(k) & 7) for k in distinct]
    return labels(texts, inverse)


def factorize(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Sorted distinct ``keys`` and each row's index into them; a lookup table instead of a sort when
    the keys span a small range, as measurements do."""
    if len(keys) == 0 or keys.max() - keys.min() > 4 * len(keys) + 4096:
        distinct, inverse = np.unique(keys, return_inverse=True)
        return distinct, inverse.reshape(-1)
    low = keys.min()
    seen = np.zeros(keys.max() - low + 1, dtype=bool)
    seen[keys - low] = True
    return np.flatnonzero(seen) + low, (np.cumsum(seen) - 1)[keys - low]


def _fixed(scaled: int, decimals: int) -> str:
    """The text of ``scaled / 10**decimals`` with exactly ``decimals`` places."""
    whole, frac = divmod(abs(scaled), 10 ** decimals)
    sign = "-" if scaled < 0 else ""
    return f"{sign}{whole}.{frac:0{decimals}d}" if decimals else f"{sign}{whole}"

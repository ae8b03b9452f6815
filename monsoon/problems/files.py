"""Readers for the data files users already have.

- svmlight / libsvm (``label [qid:N] index:value ... [# comment]``), as the
  real RCV1 is distributed: indices one-based (the format's convention) or
  zero-based, detected as scikit-learn does (any index 0 means zero-based).
- ratings (``user, item, rating[, timestamp]``), as MovieLens ships them:
  comma-, tab- or ``::``-separated, with an optional header line (the
  first that is not blank or a ``#`` comment).

Either may be compressed with gzip, bzip2 or xz (told by its first bytes),
and start with a UTF-8 byte-order mark (skipped, as a BOM-less file reads).

A malformed line raises ``DataFileError`` naming the file and line number;
so does a value that is not finite (NaN, Inf: it would make every loss NaN)
or that the training dtype cannot hold (float32 beyond 3.4e38 would be
Inf), and a feature index too large to allocate parameters for.
"""
from __future__ import annotations

import functools
import math
import os
import re
from pathlib import Path

import numpy as np
import scipy.sparse as sp

from ..errors import ConfigError


class DataFileError(ConfigError):
    """A data file could not be read; the message names the file and line."""


# A model holds several arrays of one float64 per feature (parameters, rule
# state, gradients, snapshots): this many bytes per feature, at least.
BYTES_PER_FEATURE = 32


def max_features() -> int:
    """The most features whose arrays fit in this machine's memory."""
    try:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        memory = 1 << 36
    return max(1, memory // BYTES_PER_FEATURE)


def _finite(value: float, what: str, where: str, dtype=None) -> float:
    """``value``, or a refusal naming ``where`` when it is NaN or Inf, or
    would be Inf in ``dtype`` (float32 tops out near 3.4e38)."""
    if not math.isfinite(value):
        raise DataFileError(f"{where}: {what} is {value}; NaN and Inf cannot be trained on: "
                            "fix or remove this line")
    if dtype is not None and abs(value) > _largest(dtype):
        raise DataFileError(f"{where}: {what} is {value:g}, beyond {dtype}'s largest "
                            f"({_largest(dtype):.3g}), so it would be Inf, which cannot be "
                            "trained on: fix or remove this line, or train in float64 "
                            "(--dtype float64)")
    return value


@functools.lru_cache(maxsize=None)
def _largest(dtype: str) -> float:
    return float(np.finfo(dtype).max)


# A compressed file's first bytes, and the module that reads it: the LIBSVM
# site ships its data sets as .bz2 and .xz, others as .gz
_COMPRESSED = ((b"\x1f\x8b", "gzip"), (b"BZh", "bz2"), (b"\xfd7zXZ\x00", "lzma"))


def _open_lines(path):
    path = Path(path)
    if path.is_dir():
        raise DataFileError(f"{path} is a directory; give the data file in it")
    if not path.is_file():
        raise DataFileError(f"{path}: no such file")
    with open(path, "rb") as f:
        head = f.read(6)
    opener = open
    for magic, module in _COMPRESSED:  # by content, whatever the name says
        if head.startswith(magic):
            opener = __import__(module).open
    with opener(path, "rt", encoding="utf-8-sig", errors="replace") as f:  # a BOM skipped
        try:
            for number, line in enumerate(f, start=1):
                yield number, line
        except (OSError, EOFError) as exc:  # a damaged or cut compressed file
            raise DataFileError(f"{path}: cannot be decompressed ({exc})") from exc


def load_svmlight(path, n_features: int | None = None, zero_based="auto", dtype="float64"):
    """Returns (X as CSR, y, qid or None)."""
    labels, qids, rows_idx, rows_val = [], [], [], []
    limit = max_features()
    dtype = np.dtype(dtype).name
    for number, raw in _open_lines(path):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        tokens = line.split()
        where = f"{path}:{number}"
        try:
            labels.append(float(tokens[0]))
        except ValueError:
            raise DataFileError(f"{where}: the label {tokens[0]!r} is not a number") from None
        _finite(labels[-1], "the label", where, dtype)
        rest = tokens[1:]
        if rest and rest[0].startswith("qid:"):
            try:
                qids.append(int(rest[0][4:]))
            except ValueError:
                raise DataFileError(f"{where}: bad query id {rest[0]!r}") from None
            rest = rest[1:]
        idx, val = [], []
        for token in rest:
            key, sep, value = token.partition(":")
            if not sep:
                raise DataFileError(f"{where}: expected index:value, got {token!r}")
            try:
                i, v = int(key), float(value)
            except ValueError:
                raise DataFileError(f"{where}: expected index:value, got {token!r}") from None
            if i < 0:
                raise DataFileError(f"{where}: negative feature index {i}")
            if i >= limit:
                raise DataFileError(f"{where}: feature index {i} is too large: a model with "
                                    f"{i + 1} features would need {i * BYTES_PER_FEATURE / 2**30:.3g}"
                                    f" GiB; this machine fits at most {limit} features")
            _finite(v, f"the value of feature {i}", where, dtype)
            if idx and i <= idx[-1]:
                raise DataFileError(f"{where}: feature indices must increase ({idx[-1]} then {i})")
            idx.append(i)
            val.append(v)
        rows_idx.append(idx)
        rows_val.append(val)
    if not labels:
        raise DataFileError(f"{path}: no examples in the file")
    if qids and len(qids) != len(labels):
        raise DataFileError(f"{path}: qid is given on some lines but not on others")
    all_idx = [i for row in rows_idx for i in row]
    offset = 0
    if zero_based == "auto":
        offset = 0 if (all_idx and min(all_idx) == 0) else 1
    elif not zero_based:
        offset = 1
    if offset and any(i == 0 for i in all_idx):
        raise DataFileError(f"{path}: index 0 in a one-based file")
    indptr = np.cumsum([0] + [len(r) for r in rows_idx])
    cols = np.array(all_idx, dtype=np.int64) - offset
    width = (int(cols.max()) + 1) if len(cols) else 0
    if n_features is not None:
        if width > n_features:
            raise DataFileError(f"{path}: a feature index reaches {width}, beyond n_features="
                                f"{n_features}")
        width = n_features
    X = sp.csr_matrix((np.array([v for row in rows_val for v in row], dtype=dtype), cols, indptr),
                      shape=(len(labels), width))
    return X, np.array(labels, dtype=dtype), (np.array(qids) if qids else None)


_SEPARATOR = re.compile(r"::|,|\t")


def load_ratings(path, dtype="float64"):
    """Returns (users, items, ratings): users and items re-indexed 0..U-1 and
    0..I-1 in order of first appearance, and the original ids of each
    (``user_ids[k]`` is user k's); an empty id, or a rating that ``dtype``
    cannot hold, is refused naming its line."""
    dtype = np.dtype(dtype).name
    users, items, ratings = [], [], []
    user_index, item_index = {}, {}  # id -> its index, in order of first appearance
    first = True  # the first line that is not blank or a comment: it may be a header
    for number, raw in _open_lines(path):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        fields = [f.strip() for f in _SEPARATOR.split(line)]
        if len(fields) < 3:
            raise DataFileError(f"{path}:{number}: expected user, item, rating; got {line!r}")
        header, first = first, False
        try:
            rating = float(fields[2])
        except ValueError:
            if header:
                continue
            raise DataFileError(f"{path}:{number}: the rating {fields[2]!r} is not a number") from None
        _finite(rating, "the rating", f"{path}:{number}", dtype)
        for what, value in (("user", fields[0]), ("item", fields[1])):
            if not value:
                raise DataFileError(f"{path}:{number}: the {what} id is empty; every line "
                                    f"needs user, item, rating: fix or remove this line")
        users.append(user_index.setdefault(fields[0], len(user_index)))
        items.append(item_index.setdefault(fields[1], len(item_index)))
        ratings.append(rating)
    if not ratings:
        raise DataFileError(f"{path}: no ratings in the file")
    return {"users": np.array(users, dtype=np.int64), "items": np.array(items, dtype=np.int64),
            "ratings": np.array(ratings), "user_ids": np.array(list(user_index)),
            "item_ids": np.array(list(item_index))}

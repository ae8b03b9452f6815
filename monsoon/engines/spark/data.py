"""Training data that lives in Spark: ``SparkData``.

    from monsoon.engines.spark import SparkData
    data = SparkData(df, features="features", label="label", loss="logistic")
    monsoon.train(data, strategy="async", workers=4, engine="spark", n_fetch=8, n_push=8)

``source`` is a DataFrame (a vector or array column, or a list of numeric
columns, and a label column), an RDD of ``(features, label)`` rows or of
``(X, y)`` array blocks (a dense 2-D array or a SciPy sparse matrix and
its labels), or a path Spark reads (Parquet; libsvm by ``fmt="libsvm"`` or
a .libsvm/.svm extension). The model is a linear one on sparse rows
(``SparseLinear``: logistic, hinge or squared loss with its degree-split
L2 term, weights then bias).

Nothing of the data reaches the driver. Each partition is converted once,
on its executor, into a ``Block`` (a CSR matrix and its labels) that is
persisted; one small job returns each partition's row count and feature
degrees (for the global L2 split), and the blocks are then rebuilt with
their global ids and persisted. The full-data loss the recorder reports
is a Spark job too: each partition returns its loss sum. Call
``unpersist()`` to free the cached blocks.
"""
from __future__ import annotations

import numpy as np

from ...errors import ConfigError
from ...problems.base import Problem
from .blocks import Block

LOSSES = ("logistic", "hinge", "squared")


def _rows_to_arrays(rows, features, label, n_features):
    """One partition's rows -> (CSR X, y), on the executor."""
    import scipy.sparse as sp

    data, indices, indptr, ys, width = [], [], [0], [], n_features or 0
    chunks = []
    for row in rows:
        if isinstance(row, tuple) and len(row) == 2 and _is_block(row[0]):
            chunks.append((sp.csr_matrix(row[0]), np.asarray(row[1], dtype=float).reshape(-1)))
            continue
        if hasattr(row, "asDict") and not isinstance(features, str):
            x, y = [row[c] for c in features], row[label]
        elif hasattr(row, "asDict"):
            x, y = row[features], row[label]
        else:
            x, y = row
        if hasattr(x, "indices") and hasattr(x, "size"):  # a SparseVector
            idx, val = np.asarray(x.indices, dtype=np.int64), np.asarray(x.values, dtype=float)
            width = max(width, int(x.size))
        else:
            val = np.asarray(x.toArray() if hasattr(x, "toArray") else x, dtype=float).ravel()
            width = max(width, len(val))
            idx = np.flatnonzero(val)
            val = val[idx]
        data.append(val)
        indices.append(idx)
        indptr.append(indptr[-1] + len(idx))
        ys.append(float(y))
    X = sp.csr_matrix((np.concatenate(data) if data else np.zeros(0),
                       np.concatenate(indices) if indices else np.zeros(0, dtype=np.int64),
                       np.asarray(indptr)), shape=(len(ys), width))
    y = np.asarray(ys, dtype=float)
    for cx, cy in chunks:
        width = max(width, cx.shape[1])
    if chunks:
        X.resize((X.shape[0], width))
        parts = [X] + [c.tocsr().copy() for c, _ in chunks]
        for p in parts:
            p.resize((p.shape[0], width))
        X = sp.vstack(parts, format="csr")
        y = np.concatenate([y] + [cy for _, cy in chunks])
    return X, y


def _is_block(x) -> bool:
    import scipy.sparse as sp

    return sp.issparse(x) or (isinstance(x, np.ndarray) and x.ndim == 2)


class SparkData(Problem):
    """A linear model on data held in Spark (see the module doc)."""

    defaults = {"lr": 0.5, "batch_size": 1024, "steps": 200}

    def __init__(self, source, features="features", label: str = "label",
                 loss: str = "logistic", lam: float = 1e-4, dtype: str = "float64",
                 n_features: int | None = None, fmt: str | None = None,
                 name: str = "spark-data", repartition: bool = False):
        if loss not in LOSSES:
            raise ConfigError(f"unknown loss {loss!r}; choose one of: {', '.join(LOSSES)}")
        self.source, self.features, self.label = source, features, label
        self.kind, self.lam, self.dtype = loss, float(lam), np.dtype(dtype)
        self.fmt, self.name, self.repartition = fmt, name, repartition
        self._n_features = n_features
        self._blocks = None
        self._sc = None
        self._prepare(n_features)

    # -- building the blocks, on the executors --------------------------------
    def _rdd(self):
        """The source as an RDD of rows (never collected)."""
        source = self.source
        if isinstance(source, str):
            from pyspark.sql import SparkSession

            spark = SparkSession.getActiveSession() or SparkSession.builder.getOrCreate()
            fmt = self.fmt or ("libsvm" if source.rstrip("/").endswith((".libsvm", ".svm"))
                               else "parquet")
            source = (spark.read.format("libsvm").load(source) if fmt == "libsvm"
                      else spark.read.parquet(source))
        if hasattr(source, "rdd") and hasattr(source, "columns"):  # a DataFrame
            cols = [self.features] if isinstance(self.features, str) else list(self.features)
            missing = [c for c in cols + [self.label] if c not in source.columns]
            if missing:
                raise ConfigError(f"the DataFrame has no column(s) {', '.join(missing)}; its "
                                  f"columns: {', '.join(source.columns)} (set features= "
                                  "and label=)")
            return source.select(*cols, self.label).rdd
        if hasattr(source, "mapPartitionsWithIndex"):
            return source
        raise ConfigError("SparkData needs a Spark DataFrame, an RDD or a path Spark reads, "
                          f"not {type(source).__name__}")

    def _prepare(self, n_features, partitions: int | None = None):
        rdd = self._rdd()
        if partitions is not None:
            rdd = rdd.repartition(partitions)
        self._sc = rdd.context
        from ..options import TIMEOUT
        from .preflight import check_executors

        check_executors(self._sc, TIMEOUT.default)
        features, label, kind, lam, dtype = (self.features, self.label, self.kind, self.lam,
                                             self.dtype)

        def convert(k, rows):
            X, y = _rows_to_arrays(rows, features, label, n_features)
            if kind in ("logistic", "hinge"):
                y = (y > 0).astype(float)
            yield k, X.astype(dtype), y.astype(dtype)

        raw = rdd.mapPartitionsWithIndex(convert).persist()
        stats = self._sc.runJob(raw, lambda it: [(k, X.shape[0], X.shape[1],
                                                  np.bincount(X.indices, minlength=X.shape[1]))
                                                 for k, X, _ in it])
        stats.sort(key=lambda s: s[0])
        width = max([s[2] for s in stats] + [n_features or 0])
        if width == 0 or sum(s[1] for s in stats) == 0:
            raw.unpersist()
            raise ConfigError("the Spark data set is empty (no rows, or no features)")
        degree = np.zeros(width)
        for s in stats:
            degree[:len(s[3])] += s[3]
        counts = [s[1] for s in stats]
        offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        inv_degree = np.divide(1.0, degree, out=np.zeros_like(degree), where=degree > 0)
        self.n_examples = int(offsets[-1])
        self.n_features = width
        self.n_params = width + 1
        self.partitions = len(counts)
        self.counts = counts
        self.inv_degree = inv_degree.astype(dtype)
        bc = self._sc.broadcast(self.inv_degree)

        def build(k, parts):
            from ...problems.sparse_linear import SparseLinear

            for _, X, y in parts:
                X.resize((X.shape[0], width))
                part = SparseLinear(X, y, kind, lam=lam, dtype=dtype, name="spark-partition",
                                    shuffle=False)
                part.inv_degree = bc.value
                yield Block(k, part, offsets[k] + np.arange(X.shape[0], dtype=np.int64))

        self._blocks = raw.mapPartitionsWithIndex(build).persist()
        self._sc.runJob(self._blocks, lambda it: [sum(1 for _ in it)])  # materialise
        raw.unpersist()
        bc.unpersist()

    def blocks(self, sc, workers: int, seed: int):
        """The persisted blocks, one per partition (the engine's workers).
        Data named on the command line (``spark:PATH``, ``spark-table:NAME``)
        is repartitioned to ``workers``; a DataFrame or RDD given in Python
        must already have that many partitions."""
        if workers != self.partitions and self.repartition:
            self.unpersist()
            self._prepare(self._n_features, partitions=workers)
        if workers != self.partitions:
            raise ConfigError(f"the Spark data has {self.partitions} partitions and each "
                              f"worker trains on one: use --workers {self.partitions}, or "
                              f"repartition({workers}) the data first")
        return self._blocks

    def unpersist(self) -> None:
        if self._blocks is not None:
            self._blocks.unpersist()

    # -- the Problem protocol, on the driver ----------------------------------
    def initial_params(self, seed: int) -> np.ndarray:
        return np.zeros(self.n_params, dtype=self.dtype)

    def gradient(self, w, indices, out=None, accumulate=False):
        raise ConfigError("SparkData lives in Spark: train it with engine='spark'")

    def loss(self, w) -> float:
        """Full-data objective: each partition returns its loss sum."""
        w = np.asarray(w, dtype=self.dtype)
        bc = self._sc.broadcast(w)
        try:
            sums = self._sc.runJob(self._blocks, lambda it: [
                b.problem._dloss(b.problem.X @ bc.value[:-1] + bc.value[-1], b.problem.y)[1]
                for b in it])
        finally:
            bc.unpersist()
        seen = self.inv_degree > 0
        reg = 0.5 * self.lam * float(w[:-1][seen] @ w[:-1][seen])
        return (float(sum(sums)) + reg) / self.n_examples

    def describe(self) -> dict:
        return {**super().describe(), "loss": self.kind, "lam": self.lam,
                "partitions": self.partitions}

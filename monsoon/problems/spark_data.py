"""Training data that lives in Spark: ``SparkData``, and what every
problem on such data shares (``SparkHeld``).

    from monsoon.engines.spark import SparkData   # or monsoon.problems.spark_data
    data = SparkData(df, features="features", label="label", loss="logistic")
    monsoon.train(data, strategy="async", workers=4, engine="spark", n_fetch=8, n_push=8)

``source`` is a DataFrame (a vector or array column, or a list of numeric
columns, and a label column), an RDD of ``(features, label)`` rows or of
``(X, y)`` array blocks (a dense 2-D array or a SciPy sparse matrix and
its labels), or a path Spark reads (Parquet; libsvm by ``fmt="libsvm"`` or
a .libsvm, .svm or .txt extension, as ``spark:PATH``). The model is a linear one on sparse rows
(``SparseLinear``: logistic, hinge or squared loss with its degree-split
L2 term, weights then bias).

Nothing of the data reaches the driver. Each partition is converted once,
on its executor, into a ``Block`` (a CSR matrix and its labels) that is
persisted; one small job returns each partition's row count and feature
degrees (for the global L2 split), and the blocks are then rebuilt with
their global ids and persisted. The full-data loss the recorder reports
is a Spark job too: each partition returns its loss sum. Call
``unpersist()`` to free the cached blocks. A DataFrame's label or features
that are not numbers are refused in one line before any job
(``check_columns``, which ``SparkTorchData`` shares); a null, NaN or Inf by
the conversion job, which reports it (the column, and for NaN or Inf the
partition's row) for the driver to refuse the data in one line: a bad input
(ConfigError, the command line's exit 2), not a failed run.

Layers: this module is the problem side (what a partition's rows become,
the model's math); reading the source, the jobs that convert and persist
the blocks and that evaluate on them are the spark engine's transport
(``engines/spark/data.py``), which installs itself as
``SparkHeld.transport`` when ``monsoon`` is imported: ``problems/`` never
imports ``engines/``.
"""
from __future__ import annotations

import numpy as np

from ..errors import ConfigError
from .base import Problem, check_finite
from .sparse_linear import column_moments, inverse_variance

LOSSES = ("logistic", "hinge", "squared")

# Spark's linear models: sync takes full-batch L-BFGS steps on standardized
# features, as MLlib's LogisticRegression does (one all-reduce a step in the
# barrier stage); the other strategies take AdaGrad
# mini-batch steps, for sparse features, the rare ones standardized
# (``rules/adagrad.py``: standardize_below), for at most 100 epochs (MLlib's
# maxIter is 100), stopping once an epoch lowers the loss by less than 0.02%
# (tol, as MLlib stops by its tol; a run given target_loss stops there); async,
# SSP and local SGD evaluate and return the parameters averaged over about the last epoch
# (average_epochs), whose loss falls smoothly where the last iterate's wanders
# by a percent between two checks (bench/spark_vs_mllib.py;
# docs/engines/spark.md). A problem's "by_strategy" defaults replace its others
# for that strategy; its values for its rule's options hold wherever that rule
# is the run's.
SPARK_DEFAULTS = {"rule": "adagrad", "standardize_below": 0.01, "lr": 1.0, "batch_size": 1024,
                  "epochs": 100, "tol": 2e-4, "average_epochs": 1.0,
                  "by_strategy": {"sync": {"rule": "lbfgs"}}}


def quoted(features) -> str:
    """The features column, or each of a list of them, quoted for a line:
    'a', 'b' (not the list as one name, 'a, b')."""
    return ", ".join(map(repr, [features] if isinstance(features, str) else features))


def holds_null(column: str) -> str:
    """What is wrong with a column that holds a null (on the executors)."""
    return f"column {column!r} holds a null: drop or fill those rows first (df.na.drop())"


class NullCell(ValueError):
    """A partition's rows hold a null where a number is needed (raised on
    the executors with ``holds_null``'s words; the driver refuses the data
    with them: ``SparkData._builder``)."""


def column_kind(field) -> str:
    """"numeric", "array" (of numbers), "vector", or the column's type."""
    from pyspark.sql.types import ArrayType, BooleanType, NumericType

    dt = field.dataType
    if isinstance(dt, (NumericType, BooleanType)):
        return "numeric"
    if isinstance(dt, ArrayType) and isinstance(dt.elementType, (NumericType, BooleanType)):
        return "array"
    if type(dt).__name__ == "VectorUDT":
        return "vector"
    return dt.simpleString()


def check_columns(df, cols: list, features, label: str, label_takes: str) -> dict:
    """Each of ``cols`` (the features) and ``label``'s kind (``column_kind``),
    read from ``df``'s schema on the driver, before any job: a label that
    is not numeric (it takes ``label_takes``), or features that are not
    numbers, refused in one line naming the column."""
    fields = {f.name: f for f in df.schema.fields}
    kind = {c: column_kind(fields[c]) for c in cols + [label]}
    if kind[label] != "numeric":
        raise ConfigError(f"the label column {label!r} holds {kind[label]}; it must be "
                          f"numeric ({label_takes})")
    if not isinstance(features, str):
        bad = [f"{c!r} ({kind[c]})" for c in cols if kind[c] != "numeric"]
        if bad:
            raise ConfigError(f"feature column(s) {', '.join(bad)} are not numeric; a "
                              "list of features names numeric columns")
    elif kind[features] not in ("vector", "array", "numeric"):
        raise ConfigError(f"the features column {features!r} holds {kind[features]}; give a "
                          "column of arrays of numbers, a Vector column, or numeric columns "
                          "(features=[...])")
    return kind


def _rows_to_arrays(rows, features, label, n_features):
    """One partition's rows -> (CSR X, y), on the executor."""
    import scipy.sparse as sp

    data, indices, indptr, ys, width = [], [], [0], [], n_features or 0
    chunks = []
    for row in rows:
        if isinstance(row, NullCell):  # an Arrow batch's (engines/spark/arrow.py)
            raise row
        if isinstance(row, tuple) and len(row) == 2 and _is_block(row[0]):
            chunks.append((sp.csr_matrix(row[0]), np.asarray(row[1], dtype=float).reshape(-1)))
            continue
        if hasattr(row, "asDict") and not isinstance(features, str):
            x, y = [row[c] for c in features], row[label]
            if None in x:
                raise NullCell(holds_null(features[x.index(None)]))
        elif hasattr(row, "asDict"):
            x, y = row[features], row[label]
        else:
            x, y = row
        if x is None:
            raise NullCell(holds_null(features if isinstance(features, str) else "features"))
        if hasattr(x, "indices") and hasattr(x, "size"):  # a SparseVector
            idx, val = np.asarray(x.indices, dtype=np.int64), np.asarray(x.values, dtype=float)
            width = max(width, int(x.size))
        else:
            val = np.asarray(x.toArray() if hasattr(x, "toArray") else x, dtype=float).ravel()
            width = max(width, len(val))
            idx = np.flatnonzero(val)
            val = val[idx]
        if y is None:
            raise NullCell(holds_null(label))
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


class DenseChunk:
    """Rows of a batch as a dense ``X`` (rows x features, float64) and
    ``y``; or ``error``, what is wrong with them (a torch model's data
    through Arrow, ``engines/spark/arrow.py``:
    ``spark_torch_data.partition_arrays`` stacks the chunks, or reports it)."""

    def __init__(self, X=None, y=None, error: str | None = None):
        self.X, self.y, self.error = X, y, error


class SparkHeld:
    """What every problem on data held in Spark shares: the source (read
    as an RDD of rows, never collected), converted once per partition on
    its executor into one persisted ``Block`` with global ids.

    A subclass gives ``_convert()``: a function run on the executors, one
    partition's rows (a DataFrame's come as Arrow chunks where pyarrow is
    here: CSR ``(X, y)``, or ``DenseChunk``s where ``_dense_names`` names
    the columns) -> ``(payload, stats)``, where ``stats`` is a small dict
    with ``rows`` (and anything the driver needs to see); and
    ``_builder(stats)``: run on the driver with every partition's stats,
    in order (it checks them, raising ConfigError, and sets the problem's
    sizes), returning the executor function ``payload -> the partition's
    problem``. ``spark_torch_data.SparkTorchData`` is the other subclass.

    ``transport`` does the Spark work (the spark engine's
    ``engines/spark/data.SparkSource``); it keeps the state it makes on the
    problem: ``n_examples``, ``partitions``, ``counts``, ``_sc``, ``_blocks``."""

    transport = None  # installed by monsoon.engines.spark.data
    repartition = False
    _blocks = None
    _sc = None
    timeout = None  # the run's --timeout, set by the engine (None, before it: the default)
    # while a run's long tasks hold the executors' slots, the engine sets this to
    # evaluate ``per_block`` through them: streams(W, per_block) -> list, or None
    streams = None
    _via_arrow = False
    label_takes = "0/1 or -1/+1 classes, or a float target for a squared loss"

    def _load(self, partitions: int | None = None) -> None:
        self.transport.load(self, partitions)

    def _dense_names(self):
        """Chunks through Arrow: None for CSR ones; (features, label) names
        for ``DenseChunk``s."""
        return None

    def _select(self, df, cols):
        """The DataFrame's feature and label columns, in that order, their
        types checked first (``check_columns``)."""
        check_columns(df, cols, self.features, self.label, self.label_takes)
        return df.select(*cols, self.label)

    def _built(self) -> None:
        """After the blocks are built (a subclass frees what built them)."""

    def blocks(self, sc, workers: int, seed: int, equal: bool = False):
        """The persisted blocks, one per partition (the engine's workers).
        Data named on the command line (``spark:PATH``, ``spark-table:NAME``)
        is repartitioned to ``workers``, and to equal partitions where
        ``equal`` (each worker trains on its own); a DataFrame or RDD given
        in Python must already have that many partitions."""
        return self.transport.blocks(self, workers, equal)

    def unpersist(self) -> None:
        """Free the blocks cached on the executors."""
        self.transport.unpersist(self)

    def _sums(self, w, per_block):
        """``per_block(block, w)`` for every partition's block, a Spark job
        with ``w`` broadcast: the list of what each returned."""
        return self.transport.sums(self, w, per_block)


def _loss_sums(block, W):
    """A partition's loss sum at each row of ``W`` (points x parameters)."""
    part, out = block.problem, []
    for a in range(0, len(W), 8):  # 8 points' margins at a time: rows x 8 floats
        Z = part.X @ W[a:a + 8, :-1].T + W[a:a + 8, -1]
        out += [part._dloss(Z[:, k], part.y)[1] for k in range(Z.shape[1])]
    return np.array(out)


class SparkData(SparkHeld, Problem):
    """A linear model on data held in Spark (see the module doc)."""

    defaults = dict(SPARK_DEFAULTS)

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
        self._load()

    # -- building the blocks, on the executors --------------------------------
    def _convert(self):
        features, label, kind, dtype = self.features, self.label, self.kind, self.dtype
        n_features = self._n_features
        names = quoted(features)

        def convert(rows):
            try:
                X, y = _rows_to_arrays(rows, features, label, n_features)
                check_finite(f"the features {names}", X.data, X.indptr)
                check_finite(f"the label column {label!r}", y)
            except (NullCell, ConfigError) as exc:  # the driver refuses the data, naming
                return None, {"rows": 0, "error": str(exc)}  # the column (and the row)
            if kind in ("logistic", "hinge"):
                y = (y > 0).astype(float)
            X, y = X.astype(dtype), y.astype(dtype)
            total, total_sq = column_moments(X)
            stats = {"rows": X.shape[0], "width": X.shape[1],
                     "degree": np.bincount(X.indices, minlength=X.shape[1]),
                     "sum": total, "sum_sq": total_sq,
                     "y_sum": float(y.sum()), "y_sq_sum": float(y @ y)}
            return (X, y), stats

        return convert

    def _builder(self, stats):
        for k, s in enumerate(stats):
            if s.get("error"):
                raise ConfigError(f"partition {k}: {s['error']}")
        width = max([s["width"] for s in stats] + [self._n_features or 0])
        if width == 0 or sum(s["rows"] for s in stats) == 0:
            raise ConfigError("the Spark data set is empty (no rows, or no features)")
        degree, total, total_sq = np.zeros(width), np.zeros(width), np.zeros(width)
        for s in stats:
            degree[:len(s["degree"])] += s["degree"]
            total[:len(s["sum"])] += s["sum"]
            total_sq[:len(s["sum_sq"])] += s["sum_sq"]
        self._inverse_variance = inverse_variance(total, total_sq,
                                                  sum(s["rows"] for s in stats))
        self._labels = (sum(s["rows"] for s in stats), sum(s["y_sum"] for s in stats),
                        sum(s["y_sq_sum"] for s in stats))
        inv_degree = np.divide(1.0, degree, out=np.zeros_like(degree), where=degree > 0)
        self.n_features = width
        self.n_params = width + 1
        self.inv_degree = inv_degree.astype(self.dtype)
        self._bc = bc = self._sc.broadcast(self.inv_degree)
        kind, lam, dtype = self.kind, self.lam, self.dtype

        def build(payload):
            from .sparse_linear import SparseLinear

            X, y = payload
            X.resize((X.shape[0], width))
            part = SparseLinear(X, y, kind, lam=lam, dtype=dtype, name="spark-partition",
                                shuffle=False)
            part.inv_degree = bc.value
            return part

        return build

    def _built(self) -> None:
        bc = getattr(self, "_bc", None)
        if bc is not None:
            bc.unpersist()
            self._bc = None

    # -- the Problem protocol, on the driver ----------------------------------
    def initial_params(self, seed: int) -> np.ndarray:
        return np.zeros(self.n_params, dtype=self.dtype)

    def gradient(self, w, indices, out=None, accumulate=False):
        raise ConfigError("SparkData lives in Spark: train it with engine='spark'")

    def loss(self, w) -> float:
        """Full-data objective: each partition returns its loss sum."""
        return self.evaluate_many([w])[0]["loss"]

    def evaluate_many(self, ws) -> list[dict]:
        """The full-data objective at each of ``ws`` (the loss curve's
        points), a Spark job per group of points the transport sends at once:
        each partition computes every point's margins in one product."""
        out, seen = [], self.inv_degree > 0  # the split L2 covers the features that occur
        per = self.transport.points_per_job(self.n_params * self.dtype.itemsize)
        for a in range(0, len(ws), per):
            W = np.stack([np.asarray(w, dtype=self.dtype) for w in ws[a:a + per]])
            sums = np.sum(self._sums(W, _loss_sums), axis=0)
            reg = 0.5 * self.lam * np.einsum("ij,ij->i", W[:, :-1][:, seen], W[:, :-1][:, seen])
            out += [{"loss": float(v)} for v in (sums + reg) / self.n_examples]
        return out

    def constant_loss(self) -> float:
        """The best constant prediction's loss, from the conversion's label sums."""
        from .sparse_linear import constant_loss

        return constant_loss(self.kind, *self._labels)

    def inverse_variance(self) -> np.ndarray:
        """1 / each feature's variance over every partition (then 1 for the
        bias), from the conversion's column sums: lbfgs's H_0."""
        return self._inverse_variance

    def describe(self) -> dict:
        return {**super().describe(), "loss": self.kind, "lam": self.lam,
                "partitions": self.partitions}

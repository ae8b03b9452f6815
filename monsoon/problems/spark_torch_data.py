"""Any torch model on data held in Spark: ``SparkTorchData``.

    problem = TorchProblem.from_spark(df, module, nn.CrossEntropyLoss(),
                                      features="features", label="label")
    monsoon.train(problem, strategy="sync", workers=problem.partitions, engine="spark")

Features: a column of arrays of numbers, a ``pyspark.ml`` Vector column
(made arrays in the JVM by ``vector_to_array``), one numeric column, or a
list of numeric columns. Label: a numeric column, given to a class-index
loss (``CrossEntropyLoss``, ``NLLLoss``, their functional forms, a partial
of one: ``class_index_loss``) as int64 ``(n,)``, to any other loss as
floats ``(n, 1)`` (``nn.Linear(d, 1)``'s shape).

Algorithm. Each partition's rows become tensors once, on its executor: one
job turns them into a ``TorchModel`` on that partition's rows alone, with
its own replica of the module (shipped once, in that job's closure), and
the partitions' problems are persisted as their ``Block``s with global
example ids (``spark_data.SparkHeld``; the Spark work is the spark engine's
transport, ``engines/spark/data.py``). A task then computes with its block's
problem as with a catalog torch problem's: ``gradient(w, rows)`` re-points
the replica at ``w``, the flat parameter vector the task received
(``TorchModel``'s layout), so only parameters and gradients travel, every
strategy the engine runs works unchanged, and its exactly-once guarantee
holds (the driver applies only what a finished job returns). The driver
holds the module (initial parameters, ``model_at``, ``model.pt``), never the
data: the reported loss and accuracy are a Spark job, each partition
returning its figures and row count.

Invariants: global example id = the partition's offset + the row's place in
it (a serial run on the rows in partition order visits the same examples);
nothing larger than parameters, gradients and per-partition figures reaches
the driver.

Refused in one line (ConfigError): before any job, a missing column, features
or a label that are not numbers; after the conversion job (which reports,
not fails), a null, rows of different lengths (within or across partitions),
NaN or Inf, a class label that is not a whole number >= 0; then ``misfit``.

Not yet: buffers (BatchNorm statistics) are not trained on Spark (a task
starts from the module's own), and Dropout is not seeded per worker.
"""
from __future__ import annotations

import copy

import numpy as np
import torch

from ..errors import ConfigError
from .spark_data import DenseChunk, SparkHeld, check_columns, holds_null, quoted
from .torch_model import TorchModel, class_index_loss


def partition_arrays(rows, many: bool, names: tuple, classes: bool, dtype):
    """One partition's rows (features..., label) -> ``(X, y)``, or a
    string saying what is wrong with them (on the executor)."""
    xs, ys, chunks = [], [], []
    for row in rows:
        if isinstance(row, DenseChunk):  # a batch through Arrow (engines/spark/arrow.py)
            if row.error:
                return row.error
            chunks.append(row)
            continue
        x = row[:-1] if many else row[0]
        xs.append(x.toArray() if hasattr(x, "toArray") else x)
        ys.append(row[-1])
    features, label = names
    if chunks:
        widths = sorted({c.X.shape[1] for c in chunks})
        if len(widths) > 1:
            return (f"the features column {features!r} holds rows of {widths[0]} and "
                    f"{widths[-1]} numbers: every row needs the same number of features")
        X = np.concatenate([c.X for c in chunks]).astype(dtype, copy=False)
        y = np.concatenate([c.y for c in chunks])
        return _labels(X, y, label, classes, dtype)
    if not ys:  # an empty partition
        return np.zeros((0, 0), dtype=dtype), np.zeros(0)
    if any(v is None for v in ys):
        return holds_null(label)
    for x in xs:  # a feature column's null: that column named
        if x is None or (many and None in x):
            return holds_null(features[list(x).index(None)] if many else features)
    if not many and not np.isscalar(xs[0]):  # one numeric column: one feature a row
        lengths = sorted({len(x) for x in xs})
        if len(lengths) > 1:
            return (f"the features column {features!r} holds rows of {lengths[0]} and "
                    f"{lengths[-1]} numbers: every row needs the same number of features")
    try:
        X = np.asarray(xs, dtype=dtype).reshape(len(xs), -1)
    except (TypeError, ValueError):
        return (f"the features {quoted(features)} hold a null or a non-number inside a row: "
                "drop or fill those rows first")
    return _labels(X, np.asarray(ys, dtype=np.float64), label, classes, dtype)


def _labels(X, y, label, classes, dtype):
    """``(X, y)`` with y as the loss takes it, or what is wrong with it."""
    if classes:
        bad = ~(y == np.round(y)) | (y < 0)
        if bad.any():
            return (f"the label column {label!r} holds {y[bad][0]:g}; a class-index loss "
                    "needs class numbers 0, 1, 2, ...")
        return X, y.astype(np.int64)
    return X, y.astype(dtype).reshape(-1, 1)


# the shape check's advice here: a float label reaches the loss as (n, 1)
SPARK_SHAPES_FIX = ("a float label column reaches the loss as targets of shape (n, 1), so "
                    "make the module's output (n, 1), one column (drop its squeeze or flatten)")


def misfit(part) -> str | None:
    """What ``TorchProblem``'s build-time probe would refuse in a partition's
    first two rows (a module that does not take them; an element-wise loss
    on an output of another shape than the targets, which torch broadcasts),
    as a line for the driver, or None. Run on the executor without the loss
    (a retried task must not call it twice); the driver raises it once the
    partitions' widths agree."""
    try:
        part._probe("the features", part.X[:2], part.y[:2], call_loss=False,
                    fix=SPARK_SHAPES_FIX)
    except ConfigError as exc:
        return str(exc)
    return None


def evaluate_block(block, w):
    """(rows, every reported figure) of one partition at ``w``."""
    return (block.n, block.problem.evaluate(w)) if block.n else (0, {})


class SparkTorchData(SparkHeld, TorchModel):
    """``module`` under ``loss_fn`` on data held in Spark (see the module doc)."""

    label_takes = "class numbers, or a float target"
    # not checked with the run's options: Spark's partitions, not the plan alone, cut
    # its passes (the engine checks them once it has counted the rows:
    # ``placement.check_fewest_rows``)
    fewest_rows = None

    def _dense_names(self):
        return self.features, self.label

    def __init__(self, source, module: torch.nn.Module, loss_fn, features="features",
                 label: str = "label", dtype: str | None = None, name: str = "spark-torch",
                 init: str = "module", init_fn=None, eval_batch: int = 65536,
                 fmt: str | None = None, repartition: bool = False):
        tdtype = self._setup(name, dtype, init_fn, init, loss_fn, eval_batch, module)
        self.source, self.features, self.label = source, features, label
        self.fmt, self.repartition = fmt, repartition
        self.X = self.y = self.val = None  # the data stays in Spark
        self._replica = copy.deepcopy(module).to(tdtype)  # what the executors get
        self._setup_module(module)
        self._load()

    # -- building the blocks, on the executors --------------------------------
    def _select(self, df, cols):
        from pyspark.sql import functions as F

        kind = check_columns(df, cols, self.features, self.label, self.label_takes)
        c = self.features
        if not isinstance(c, str) or kind[c] != "vector":
            return df.select(*cols, self.label)
        from pyspark.ml.functions import vector_to_array

        return df.select(vector_to_array(F.col(c)).alias(c), self.label)

    def _convert(self):
        many, names = not isinstance(self.features, str), self._dense_names()
        classes, dtype = class_index_loss(self.loss_fn), self.dtype
        module, loss_fn, eval_batch = self._replica, self.loss_fn, self.eval_batch

        def convert(rows):
            arrays = partition_arrays(rows, many, names, classes, dtype)
            if isinstance(arrays, str):
                return None, {"rows": 0, "error": arrays}
            X, y = arrays
            if not len(X):
                return None, {"rows": 0, "error": None}
            try:
                part = TorchModel(module, loss_fn, torch.from_numpy(X), torch.from_numpy(y),
                                  dtype=dtype, name="spark-partition", eval_batch=eval_batch)
            except (ConfigError, ValueError) as exc:  # NaN or Inf; a module that does not fit
                return None, {"rows": 0, "error": str(exc)}
            bad = misfit(part)  # its probe also counts the BatchNorms' values per channel
            return part, {"rows": len(X), "width": X.shape[1], "error": None,
                          "classification": part.classification, "misfit": bad,
                          "norm_values": part._norm_values}

        return convert

    def _builder(self, stats):
        for k, s in enumerate(stats):
            if s["error"]:
                raise ConfigError(f"partition {k}: {s['error']}")
        widths = {k: s["width"] for k, s in enumerate(stats) if s["rows"]}
        if not widths:
            raise ConfigError("the Spark data set is empty (no rows)")
        if len(set(widths.values())) > 1:
            by_width = sorted(widths.items(), key=lambda kv: kv[1])
            (a, wa), (b, wb) = by_width[0], by_width[-1]
            raise ConfigError(f"the features hold rows of {wa} numbers in partition {a} and "
                              f"{wb} in partition {b}: every row needs the same number of "
                              "features")
        for k, s in enumerate(stats):  # the rows fit one another: now the module
            if s.get("misfit"):
                raise ConfigError(f"partition {k}: {s['misfit']}")
        self.n_features = next(iter(widths.values()))
        self.classification = all(s["classification"] for s in stats if s["rows"])
        self._norm_values = dict(self._norm_values)  # the class's default is shared
        for s in stats:  # what the partitions' probes saw (``fewest_rows``, on the engine)
            self._norm_values.update(s.get("norm_values", {}))
        return lambda part: part

    # -- the Problem protocol, on the driver ----------------------------------
    def gradient(self, w, indices, out=None, accumulate=False):
        raise ConfigError(f"{self.name} lives in Spark: train it with engine='spark'")

    def shared_data(self):
        raise ConfigError(f"{self.name} lives in Spark: train it with engine='spark'")

    def evaluate(self, w) -> dict:
        """Every reported figure at ``w``: each partition's, weighed by its rows.
        Each partition is evaluated on its own rows: a BatchNorm without
        running statistics normalises them by the partition's statistics, and
        a partition of one row by that row's (``TorchModel._forward_eval``)."""
        w = np.asarray(w, dtype=self.dtype)
        self._check(w)
        parts = [p for p in self._sums(w, evaluate_block) if p[0]]
        keys = set.intersection(*(set(f) for _, f in parts))
        n = sum(rows for rows, _ in parts)
        return {key: sum(rows * f[key] for rows, f in parts) / n for key in sorted(keys)}

    def loss(self, w) -> float:
        return self.evaluate(w)["loss"]

    def describe(self) -> dict:
        return {**super().describe(), "partitions": self.partitions,
                "features": self.n_features}

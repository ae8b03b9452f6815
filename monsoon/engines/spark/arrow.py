"""A DataFrame's partitions as SciPy CSR chunks, through Arrow: the fast
path of ``SparkData``'s conversion.

Read as an RDD, a DataFrame reaches a Python task one ``Row`` at a time,
each Vector deserialized on its own: most of the conversion's time.
``df.mapInArrow`` hands the task column batches
instead (``spark.sql.execution.arrow.maxRecordsPerBatch`` rows each), a
``pyspark.ml`` Vector column arriving as its SQL struct (``type`` 0:
sparse, ``size``, ``indices``, ``values``; 1: dense, ``values`` only).
Each batch becomes one ``(CSR X, y)`` chunk with NumPy alone, pickled into
one binary cell; ``problems/spark_data._rows_to_arrays`` stacks a
partition's chunks, as it does for an RDD of array blocks.

The chunk equals what the row path builds from the same rows: a sparse
Vector keeps its indices and values, and a dense Vector, an array or
numeric columns keep their non-zeros, the width being the widest row.
A torch model's data (``problems/spark_torch_data.py``) comes as
``DenseChunk``s: a dense array a batch, or what is wrong with its rows.
Used where the driver has pyarrow and the DataFrame ``mapInArrow``; the
preflight then checks the executors' pyarrow too (``preflight.py``).
"""
from __future__ import annotations

import pickle

import numpy as np

from ...problems.spark_data import DenseChunk, NullCell, holds_null


def usable(df) -> bool:
    """Can ``df``'s rows come through Arrow here?"""
    if not hasattr(df, "mapInArrow"):
        return False
    try:
        import pyarrow  # noqa: F401
    except ImportError:
        return False
    return True


def chunks(df, n_feature_columns: int, dense_names: tuple | None = None):
    """An RDD of ``(CSR X, y)`` chunks of ``df`` (its feature column(s),
    then its label), partition by partition as ``df``'s; with
    ``dense_names`` (the features' and the label's names, for messages),
    of ``DenseChunk``s instead. A batch with a null where a number is
    needed comes as the ``NullCell`` naming the column, for the conversion
    to report (``SparkData._builder``)."""
    def run(batches, many=n_feature_columns > 1, names=dense_names):
        import pyarrow as pa

        for batch in batches:
            if not batch.num_rows:
                continue
            try:
                chunk = batch_arrays(batch, many) if names is None else \
                    dense_chunk(batch, many, names)
            except NullCell as exc:  # sent as the chunk: the conversion reports it
                chunk = exc
            blob = pickle.dumps(chunk, protocol=pickle.HIGHEST_PROTOCOL)
            yield pa.RecordBatch.from_arrays([pa.array([blob], pa.binary())], ["chunk"])

    return df.mapInArrow(run, "chunk binary").rdd.map(lambda row: pickle.loads(row[0]))


def dense_chunk(batch, many: bool, names: tuple) -> DenseChunk:
    features, label = names
    columns = batch.columns
    nulls = [n for n, c in zip(batch.schema.names, columns) if c.null_count]
    if nulls:  # the label's named first, else the first feature column's
        return DenseChunk(error=holds_null(label if columns[-1].null_count else nulls[0]))
    y = np.asarray(columns[-1].to_numpy(zero_copy_only=False), dtype=float)
    if many or not _is_list(columns[0].type):
        X = np.column_stack([np.asarray(c.to_numpy(zero_copy_only=False), dtype=float)
                             for c in columns[:-1]])
        return DenseChunk(X, y)
    lists = columns[0]
    error = _null_inside(lists, features)
    if error:
        return DenseChunk(error=error)
    values, lengths = _flat(lists)
    if len(lengths) and lengths.min() != lengths.max():
        return DenseChunk(error=f"the features column {features!r} holds rows of "
                                f"{lengths.min()} and {lengths.max()} numbers: every row "
                                "needs the same number of features")
    return DenseChunk(np.array(values, dtype=float).reshape(len(y), -1), y)


def batch_arrays(batch, many: bool):
    """One Arrow batch (features..., label) -> ``(CSR X, y)`` float64."""
    import pyarrow as pa
    import scipy.sparse as sp

    n = batch.num_rows
    columns = batch.columns
    y = _numbers(columns[-1], batch.schema.names[-1])
    features = columns[:-1]
    name = batch.schema.names[0]
    if many or not (pa.types.is_struct(features[0].type) or _is_list(features[0].type)):
        X = np.column_stack([_numbers(c, batch.schema.names[i]) for i, c in enumerate(features)])
        return sp.csr_matrix(X), y
    col = features[0]
    if col.null_count:
        raise NullCell(holds_null(name))
    if _is_list(col.type):  # an array of numbers a row: dense
        error = _null_inside(col, name)
        if error:
            raise NullCell(error)
        values, lengths = _flat(col)
        return _csr(values, None, lengths, np.ones(n, dtype=bool), int(lengths.max(initial=0)),
                    n), y
    kinds = np.asarray(col.field("type").to_numpy(zero_copy_only=False))
    values, lengths = _flat(col.field("values"))
    dense = kinds == 1
    sparse_rows = ~dense
    indices = None
    width = int(lengths[dense].max(initial=0))
    if sparse_rows.any():
        indices, _ = _flat(col.field("indices"))
        sizes = np.asarray(col.field("size").fill_null(0).to_numpy(zero_copy_only=False))
        width = max(width, int(sizes[sparse_rows].max(initial=0)))
    return _csr(values, indices, lengths, dense, width, n), y


def _is_list(t) -> bool:
    import pyarrow as pa

    return pa.types.is_list(t) or pa.types.is_large_list(t)


def _numbers(col, name) -> np.ndarray:
    if col.null_count:
        raise NullCell(holds_null(name))
    return np.asarray(col.to_numpy(zero_copy_only=False), dtype=float)


def _null_inside(lists, name) -> str | None:
    """What is wrong with the array column ``name`` where a row holds a
    null inside its array (an Arrow list of numbers holds nothing else
    that is not a number), or None; one line for both conversions."""
    if lists.flatten().null_count:
        return (f"the features {name!r} hold a null inside a row: drop or fill those rows "
                "first")
    return None


def _flat(lists):
    """(every row's values in order, each row's length; a null list: 0)."""
    lengths = np.asarray(lists.value_lengths().fill_null(0).to_numpy(zero_copy_only=False),
                         dtype=np.int64)
    return np.asarray(lists.flatten().to_numpy(zero_copy_only=False)), lengths


def _csr(values, sparse_indices, lengths, dense, width, n):
    """CSR from row-major values: sparse rows take ``sparse_indices`` (their
    rows' indices, in order), dense rows the positions 0..len-1; dense
    rows' zeros are dropped, as the row path drops them."""
    import scipy.sparse as sp

    indptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(lengths, out=indptr[1:])
    if dense.all():
        indices = np.arange(len(values), dtype=np.int64) - np.repeat(indptr[:-1], lengths)
    elif not dense.any():
        indices = np.asarray(sparse_indices, dtype=np.int64)
    else:
        indices = np.arange(len(values), dtype=np.int64) - np.repeat(indptr[:-1], lengths)
        indices[np.repeat(~dense, lengths)] = sparse_indices
    # a copy: Arrow's buffers are read-only, and eliminate_zeros writes
    X = sp.csr_matrix((np.array(values, dtype=float), indices, indptr), shape=(n, width))
    if dense.any():
        X.eliminate_zeros()
    return X

"""SparkData's conversion through Arrow (``engines/spark/arrow.py``) builds
the same partition as the row path, for every kind of feature column."""
import numpy as np
import pytest

from monsoon.engines.spark.data import _rows_to_arrays

pa = pytest.importorskip("pyarrow")


class _Sparse:  # what a pyspark.ml SparseVector offers the row path
    def __init__(self, size, indices, values):
        self.size, self.indices, self.values = size, indices, values


def _vector_batch(rows):
    """An Arrow batch shaped as Spark sends a Vector column: (type, size,
    indices, values), type 0 sparse, 1 dense (size and indices null)."""
    vec = pa.StructArray.from_arrays(
        [pa.array([0 if s else 1 for s, *_ in rows], pa.int8()),
         pa.array([s[0] if s else None for s, *_ in rows], pa.int32()),
         pa.array([list(s[1]) if s else None for s, *_ in rows], pa.list_(pa.int32())),
         pa.array([list(v) for _, v, _ in rows], pa.list_(pa.float64()))],
        ["type", "size", "indices", "values"])
    return pa.RecordBatch.from_arrays([vec, pa.array([y for *_, y in rows])],
                                      ["features", "label"])


def _row_path(rows):
    return _rows_to_arrays([(_Sparse(s[0], np.array(s[1]), np.array(v)) if s else np.array(v),
                             y) for s, v, y in rows], "features", "label", None)


def _same(a, b):
    (Xa, ya), (Xb, yb) = a, b
    assert Xa.shape == Xb.shape
    np.testing.assert_array_equal(Xa.toarray(), Xb.toarray())
    np.testing.assert_array_equal(ya, yb)
    assert Xa.nnz == Xb.nnz  # the same stored entries: dense rows lose their zeros in both


@pytest.mark.parametrize("rows", [
    # sparse rows only (libsvm)
    [((6, [0, 4], None), [1.5, -2.0], 1.0), ((6, [5], None), [3.0], 0.0),
     ((6, [], None), [], 1.0)],
    # dense rows only, with zeros
    [(None, [0.0, 1.0, 2.0], 0.0), (None, [4.0, 0.0, 0.5], 1.0)],
    # both in one column: the widest row sets the width
    [((8, [7], None), [2.0], 1.0), (None, [1.0, 0.0, 3.0], 0.0),
     ((8, [0, 2], None), [5.0, 6.0], 1.0)],
])
def test_a_vector_column_gives_the_row_paths_partition(rows):
    from monsoon.engines.spark.arrow import batch_arrays

    rows = [((s[0], s[1]) if s else None, v, y) for s, v, y in rows]
    _same(batch_arrays(_vector_batch(rows), many=False), _row_path(rows))


def test_an_array_column_and_numeric_columns_give_the_row_paths_partition():
    from monsoon.engines.spark.arrow import batch_arrays

    arrays = [[0.0, 1.5, 2.0], [3.0, 0.0, 0.0]]
    batch = pa.RecordBatch.from_arrays([pa.array(arrays), pa.array([1.0, 0.0])],
                                       ["x", "label"])
    _same(batch_arrays(batch, many=False),
          _rows_to_arrays([(np.array(a), y) for a, y in zip(arrays, [1.0, 0.0])], "x",
                          "label", None))
    columns = pa.RecordBatch.from_arrays([pa.array([1.0, 0.0]), pa.array([0.0, 2.0]),
                                          pa.array([1.0, 0.0])], ["a", "b", "label"])
    X, y = batch_arrays(columns, many=True)
    np.testing.assert_array_equal(X.toarray(), [[1.0, 0.0], [0.0, 2.0]])
    np.testing.assert_array_equal(y, [1.0, 0.0])


def test_a_null_feature_is_named():
    from monsoon.engines.spark.arrow import batch_arrays

    batch = pa.RecordBatch.from_arrays([pa.array([[1.0], None]), pa.array([1.0, 0.0])],
                                       ["x", "label"])
    with pytest.raises(ValueError, match="column 'x' holds a null"):
        batch_arrays(batch, many=False)


def test_a_null_inside_an_array_or_a_row_is_named():
    """A null inside an array of features came through Arrow as NaN, and a
    null Vector or numeric feature through the row path too: the run
    failed building the blocks (exit 1). Each is named as a null now."""
    from pyspark.sql import Row

    from monsoon.engines.spark.arrow import batch_arrays, dense_chunk

    batch = pa.RecordBatch.from_arrays([pa.array([[1.0, None], [2.0, 3.0]]),
                                        pa.array([1.0, 0.0])], ["x", "label"])
    with pytest.raises(ValueError, match="the features 'x' hold a null inside a row"):
        batch_arrays(batch, many=False)
    # a torch model's conversion says it in the same words (it added "or a non-number")
    assert dense_chunk(batch, False, ("x", "label")).error == \
        "the features 'x' hold a null inside a row: drop or fill those rows first"
    with pytest.raises(ValueError, match="column 'b' holds a null"):
        _rows_to_arrays([Row(a=1.0, b=None, label=1.0)], ["a", "b"], "label", None)
    with pytest.raises(ValueError, match="column 'x' holds a null"):
        _rows_to_arrays([Row(x=None, label=1.0)], "x", "label", None)


@pytest.fixture(scope="module")
def spark():
    """One local[2] session for both Spark tests (a start costs seconds)."""
    from spark_env import spark_session

    with spark_session("local[2]") as session:
        yield session


@pytest.mark.spark
def test_sparkdata_through_arrow_equals_the_row_path(spark, tmp_path, monkeypatch):
    """A libsvm file (sparse Vectors) read by Spark: the Arrow path is taken
    and builds the problem the row path builds (rows, degrees, loss)."""
    from monsoon.engines.spark import SparkData, arrow

    rng = np.random.default_rng(3)
    path = tmp_path / "d.libsvm"
    with open(path, "w") as f:
        for _ in range(3000):
            cols = np.unique(rng.integers(1, 400, size=rng.integers(1, 12)))
            f.write(f"{rng.integers(0, 2)} " +
                    " ".join(f"{c}:{rng.standard_normal():.5g}" for c in cols) + "\n")
    fast = SparkData(str(path), fmt="libsvm", dtype="float64")
    assert fast._via_arrow
    monkeypatch.setattr(arrow, "usable", lambda df: False)
    slow = SparkData(str(path), fmt="libsvm", dtype="float64")
    assert not slow._via_arrow
    w = rng.standard_normal(fast.n_params)
    assert (fast.n_examples, fast.n_params) == (slow.n_examples, slow.n_params) == (3000, 400)
    np.testing.assert_array_equal(fast.inv_degree, slow.inv_degree)
    assert fast.loss(w) == pytest.approx(slow.loss(w), rel=1e-12)
    fast.unpersist()
    slow.unpersist()


@pytest.mark.spark
def test_a_torch_models_dataframe_through_arrow_equals_the_row_path(spark, monkeypatch):
    """A Vector column, an array column and numeric columns: the Arrow path
    is taken and gives the row path's problem (loss and accuracy)."""
    torch = pytest.importorskip("torch")
    from pyspark.ml.linalg import Vectors

    from monsoon.engines.spark import arrow
    from monsoon.problems.torch_problem import TorchProblem

    rng = np.random.default_rng(5)
    X = rng.standard_normal((400, 3))
    c = (X[:, 0] + X[:, 1] > 0).astype(float)
    rows = [(Vectors.dense(x), x.tolist(), *x.tolist(), float(y)) for x, y in zip(X, c)]
    df = spark.createDataFrame(rows, ["v", "a", "f0", "f1", "f2", "c"]).repartition(2)
    for features in ("v", "a", ["f0", "f1", "f2"]):
        made = {}
        for way in ("arrow", "rows"):
            if way == "rows":
                monkeypatch.setattr(arrow, "usable", lambda df: False)
            torch.manual_seed(0)
            made[way] = TorchProblem.from_spark(
                df, torch.nn.Linear(3, 2), torch.nn.CrossEntropyLoss(), features=features,
                label="c", dtype="float64")
            monkeypatch.undo()
        assert made["arrow"]._via_arrow and not made["rows"]._via_arrow
        w = made["arrow"].initial_params(0)
        assert made["arrow"].evaluate(w) == pytest.approx(made["rows"].evaluate(w), rel=1e-12)
        assert made["arrow"].n_examples == made["rows"].n_examples == 400
        for problem in made.values():
            problem.unpersist()

"""Sparse linear problems and the data files users bring (written here)."""
import json

import numpy as np
import pytest

import monsoon
from monsoon.cli import main as cli_main
from monsoon.problems import make_problem
from monsoon.problems.files import DataFileError, load_ratings, load_svmlight
from monsoon.problems.sparse_linear import SparseLinear, rcv1_like


def write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_svmlight_one_based_with_comments_and_qid(tmp_path):
    path = write(tmp_path, "a.svm", "# a header comment\n"
                 "1 qid:3 1:0.5 4:2 # first\n"
                 "\n"
                 "-1 qid:3 2:1.5\n"
                 "1 qid:7 4:-1 5:3e-1\n")
    X, y, qid = load_svmlight(path)
    assert X.shape == (3, 5)
    np.testing.assert_array_equal(y, [1, -1, 1])
    np.testing.assert_array_equal(qid, [3, 3, 7])
    np.testing.assert_allclose(X.toarray(), [[0.5, 0, 0, 2, 0], [0, 1.5, 0, 0, 0],
                                             [0, 0, 0, -1, 0.3]])


def test_svmlight_zero_based_is_detected(tmp_path):
    path = write(tmp_path, "z.svm", "0 0:1 2:2\n1 1:3\n")
    X, y, qid = load_svmlight(path)
    assert qid is None and X.shape == (2, 3)
    np.testing.assert_allclose(X.toarray(), [[1, 0, 2], [0, 3, 0]])
    X1, _, _ = load_svmlight(write(tmp_path, "o.svm", "0 1:1 3:2\n"), zero_based=False,
                             n_features=10)
    assert X1.shape == (1, 10) and X1[0, 2] == 2


@pytest.mark.parametrize("text,line,message", [
    ("1 1:1\nspam 2:1\n", 2, "label 'spam' is not a number"),
    ("1 1:1\n1 2:1 3\n", 2, "expected index:value, got '3'"),
    ("1 1:1 2:x\n", 1, "expected index:value, got '2:x'"),
    ("1 3:1 2:1\n", 1, "feature indices must increase"),
    ("1 qid:x 1:1\n", 1, "bad query id"),
])
def test_svmlight_malformed_line_names_file_and_line(tmp_path, text, line, message):
    path = write(tmp_path, "bad.svm", text)
    with pytest.raises(DataFileError, match=message) as info:
        load_svmlight(path)
    assert f"{path}:{line}:" in str(info.value)


@pytest.mark.parametrize("load,text,line,what", [
    (load_svmlight, "1 1:1\n-1 2:1\n1 1:1e39\n", 3, "the value of feature 1 is 1e\\+39"),
    (load_svmlight, "1 1:1\n-1e39 2:1\n", 2, "the label is -1e\\+39"),
    (load_ratings, "1,2,3\n1,3,1e39\n", 2, "the rating is 1e\\+39"),
])
def test_a_value_float32_cannot_hold_is_named_by_its_line(tmp_path, load, text, line, what):
    """As NaN is, and without numpy's overflow warning; float64 holds it."""
    import warnings

    path = write(tmp_path, "big.txt", text)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(DataFileError, match=f"{what}, beyond float32's largest") as info:
            load(path, dtype="float32")
    assert str(info.value).startswith(f"{path}:{line}: ")
    load(path, dtype="float64")


def test_svmlight_missing_and_empty_files(tmp_path):
    with pytest.raises(DataFileError, match="no such file"):
        load_svmlight(tmp_path / "nope.svm")
    with pytest.raises(DataFileError, match="no examples"):
        load_svmlight(write(tmp_path, "empty.svm", "# nothing\n"))


@pytest.mark.parametrize("module", ["gzip", "bz2", "lzma"])
def test_a_compressed_data_file_reads_as_the_plain_one(tmp_path, module):
    """The LIBSVM site ships .bz2 and .xz files, others .gz: each is read as
    its plain text is, told by its first bytes whatever its name (a .gz
    read as text failed: "the label '\\x1f\\x8b...' is not a number"); one
    cut short is refused in one line, naming it."""
    import importlib

    text = "1 1:0.5 3:1\n-1 2:1.5\n1 1:1 2:0.25 3:2 # a comment\n"
    plain = load_svmlight(write(tmp_path, "a.svm", text))
    packed = importlib.import_module(module).compress(text.encode())
    (tmp_path / "a.data").write_bytes(packed)
    X, y, _ = load_svmlight(tmp_path / "a.data")
    assert (X != plain[0]).nnz == 0 and list(y) == list(plain[1])
    ratings = importlib.import_module(module).compress(b"u1,m9,4.0\nu2,m9,3.5\n")
    (tmp_path / "r.data").write_bytes(ratings)
    np.testing.assert_allclose(load_ratings(tmp_path / "r.data")["ratings"], [4.0, 3.5])
    (tmp_path / "cut.data").write_bytes(packed[:len(packed) // 2])
    with pytest.raises(DataFileError, match="cut.data: cannot be decompressed"):
        load_svmlight(tmp_path / "cut.data")


@pytest.mark.parametrize("module", [None, "gzip"])
def test_a_utf8_byte_order_mark_is_skipped(tmp_path, module):
    """A file saved with a BOM (Windows editors, Excel's "CSV UTF-8") was
    refused: "the label '\\ufeff1' is not a number"; a ratings file's first
    user became a user of its own, '\\ufeffu1'. Read as without it, plain or
    compressed."""
    import importlib

    def bom(name, text):
        data = b"\xef\xbb\xbf" + text.encode()
        (tmp_path / name).write_bytes(importlib.import_module(module).compress(data)
                                      if module else data)
        return tmp_path / name

    text = "1 1:0.5 3:1\n-1 2:1.5\n"
    X, y, _ = load_svmlight(bom("a.svm", text))
    plain = load_svmlight(write(tmp_path, "plain.svm", text))
    assert (X != plain[0]).nnz == 0 and list(y) == list(plain[1]) == [1, -1]
    data = load_ratings(bom("r.csv", "u1,m9,4.0\nu2,m9,3.5\nu1,m3,5\n"))
    assert list(data["user_ids"][data["users"]]) == ["u1", "u2", "u1"]


@pytest.mark.parametrize("sep", [",", "\t", "::"])
def test_ratings_separators_and_header(tmp_path, sep):
    header = sep.join(["userId", "movieId", "rating", "timestamp"]) + "\n" if sep == "," else ""
    rows = [("u1", "m9", "4.0"), ("u2", "m9", "3.5"), ("u1", "m3", "5")]
    path = write(tmp_path, "r.dat", header + "".join(sep.join(r + ("881250949",)) + "\n"
                                                     for r in rows))
    data = load_ratings(path)
    np.testing.assert_allclose(data["ratings"], [4.0, 3.5, 5.0])
    assert list(data["user_ids"][data["users"]]) == ["u1", "u2", "u1"]
    assert list(data["item_ids"][data["items"]]) == ["m9", "m9", "m3"]


def test_ratings_malformed_line_names_file_and_line(tmp_path):
    path = write(tmp_path, "r.csv", "1,2,3.0\n1,3,high\n")
    with pytest.raises(DataFileError, match=rf"{path}:2: the rating 'high' is not a number"):
        load_ratings(path)
    with pytest.raises(DataFileError, match=r":1: expected user, item, rating"):
        load_ratings(write(tmp_path, "short.csv", "1,2\n"))


def test_a_ratings_header_after_leading_comments_is_a_header(tmp_path):
    """The header is the first line that is not blank or a comment (after
    '# my ratings' it was refused: "the rating 'rating' is not a number");
    a second such line is still refused, naming it."""
    path = write(tmp_path, "c.csv", "# my ratings\n\nuser,item,rating\n1,2,3\n1,3,4\n")
    np.testing.assert_allclose(load_ratings(path)["ratings"], [3.0, 4.0])
    twice = write(tmp_path, "twice.csv", "# my ratings\nuser,item,rating\nuser,item,rating\n")
    with pytest.raises(DataFileError, match=rf"{twice}:3: the rating 'rating' is not a number"):
        load_ratings(twice)


def test_rating_ids_in_order_of_first_appearance_none_empty_saved_beside_the_factors(tmp_path):
    """Users and items are numbered in order of first appearance, as the
    loader says (users 7, 10, 2 were sorted as strings: 10, 2, 7); an empty
    id is refused naming its line (it became an entity); and a run writes
    each factor row's id beside params.npy (the ids were dropped: the
    trained factors could not be mapped back). A next run in the folder
    leaves none of them behind."""
    path = write(tmp_path, "r.csv", "userId,movieId,rating\n7,b,4\n10,a,3\n2,b,5\n7,c,1\n")
    data = load_ratings(path)
    assert list(data["user_ids"]) == ["7", "10", "2"] and list(data["users"]) == [0, 1, 2, 0]
    assert list(data["item_ids"]) == ["b", "a", "c"] and list(data["items"]) == [0, 1, 0, 2]
    for text, what in (("userId,movieId,rating\n1,10,4\n,10,5\n2,11,2\n", "user"),
                       ("1,10,4\n2,11,2\n2,,3\n", "item")):
        bad = write(tmp_path, "missing_ids.csv", text)
        with pytest.raises(DataFileError) as info:
            load_ratings(bad)
        assert str(info.value).startswith(f"{bad}:3: the {what} id is empty")
        assert len(str(info.value).splitlines()) == 1
    out = tmp_path / "run"
    assert cli_main(["train", "--problem", f"ratings:{path}", "--strategy", "serial",
                     "--epochs", "1", "--out", str(out), "--quiet"]) == 0
    assert (out / "user_ids.txt").read_text() == "7\n10\n2\n"
    assert (out / "item_ids.txt").read_text() == "b\na\nc\n"
    L, R = make_problem(f"ratings:{path}").factors(np.load(out / "params.npy"))
    assert L.shape == (3, 10) and R.shape == (3, 10)
    assert cli_main(["train", "--problem", "mf-synthetic:users=5,items=4,ratings=40",
                     "--strategy", "serial", "--epochs", "1", "--out", str(out), "--quiet"]) == 0
    assert not (out / "user_ids.txt").exists() and not (out / "item_ids.txt").exists()


@pytest.mark.parametrize("loss", ["logistic", "hinge", "squared"])
def test_sparse_gradient_is_the_objectives_derivative(loss):
    p = rcv1_like(rows=500, features=200, nnz=10, loss=loss, lam=0.1)
    w = np.random.default_rng(0).standard_normal(p.n_params) * 0.3
    batch_loss, g = p.gradient(w, np.arange(p.n_examples))
    assert batch_loss == pytest.approx(p.loss(w), rel=1e-12)
    for j in [0, 1, 2, p.n_params - 1]:
        e = np.zeros_like(w)
        e[j] = 1e-6
        assert g[j] == pytest.approx((p.loss(w + e) - p.loss(w - e)) / 2e-6, abs=1e-7)


def test_sparse_labels_are_checked():
    import scipy.sparse as sp

    with pytest.raises(ValueError, match="labels 0 and 1"):
        SparseLinear(sp.eye(3), [0, 2, 1], loss="logistic")


def test_libsvm_problem_trains_from_the_cli(tmp_path):
    rng = np.random.default_rng(0)
    lines = []
    for i in range(300):
        cols = np.sort(rng.choice(40, 5, replace=False))
        label = 1 if cols[0] < 8 else -1
        lines.append(f"{label} " + " ".join(f"{c + 1}:{rng.random():.3f}" for c in cols))
    path = write(tmp_path, "train.svm", "\n".join(lines) + "\n")
    code = cli_main(["train", "--problem", f"libsvm:{path}", "--strategy", "hogwild",
                     "--workers", "2", "--epochs", "3", "--out", str(tmp_path / "run"), "--quiet"])
    assert code == 0
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    start = make_problem(f"libsvm:{path}", "float64")
    assert summary["final_loss"] < start.loss(start.initial_params(0))
    assert summary["n_examples"] == 300


def test_rcv1_like_hogwild_matches_serial():
    name = "rcv1-like:rows=4000,features=2000,nnz=20"
    serial = monsoon.train(name, "serial", epochs=3, seed=0)
    hog = monsoon.train(name, "hogwild", 2, epochs=3, seed=0)
    assert hog.summary["final_loss"] <= 1.05 * serial.summary["final_loss"]
    assert serial.summary["final_loss"] < np.log(2)


def test_problem_name_errors():
    with pytest.raises(monsoon.ConfigError, match="libsvm:PATH"):
        make_problem("nope")
    with pytest.raises(monsoon.ConfigError, match="unknown rcv1-like option"):
        make_problem("rcv1-like:size=3")
    with pytest.raises(monsoon.ConfigError, match="needs a file"):
        make_problem("libsvm:")


def reference_hogwild_one_thread(p, lr, beta, epochs, seed):
    """Per-example SGD written out in NumPy: for each epoch, the blocks of 512
    rows in the epoch's random order; w_u <- w_u - lr (d x_u + lam w_u / d_u)."""
    from monsoon.strategies.batches import block_permutation

    w = np.zeros(p.n_params)
    X = p.X
    for epoch in range(epochs):
        step = lr * beta ** epoch
        for i in block_permutation(p.n_examples, seed, epoch):
            cols = X.indices[X.indptr[i]:X.indptr[i + 1]]
            vals = X.data[X.indptr[i]:X.indptr[i + 1]]
            z = w[cols] @ vals + w[-1]
            y = p.y[i]
            if p.kind == "logistic":
                s = 2 * y - 1
                d = -s / (1 + np.exp(s * z))
            elif p.kind == "hinge":
                s = 2 * y - 1
                d = -s if s * z < 1 else 0.0
            else:
                d = z - y
            w[cols] -= step * (d * vals + p.lam * w[cols] * p.inv_degree[cols])
            w[-1] -= step * d
    return w


@pytest.mark.parametrize("loss", ["logistic", "hinge", "squared"])
def test_one_thread_hogwild_equals_a_numpy_per_example_reference(loss):
    p = rcv1_like(rows=1500, features=300, nnz=12, loss=loss, lam=0.5)
    run = monsoon.train(p, "hogwild", 1, epochs=3, lr=0.1, seed=4)
    expected = reference_hogwild_one_thread(p, 0.1, 0.9, 3, 4)
    np.testing.assert_allclose(run.params, expected, rtol=1e-10, atol=1e-12)
    assert run.summary["updates"] == 3 * 1500  # one update per example
    serial = monsoon.train(p, "serial", epochs=3, lr=0.1, seed=4)
    assert np.array_equal(serial.params, run.params)


def test_two_thread_hogwild_on_sparse_data_shares_one_copy():
    p = rcv1_like(rows=20000, features=3000, nnz=20)
    assert p.for_worker(0, 2).X is p.X  # threads read one copy of the data
    serial = monsoon.train(p, "serial", epochs=3, seed=0)
    hog = monsoon.train(p, "hogwild", 2, epochs=3, seed=0)
    assert hog.summary["backend"] == "threads"
    assert hog.summary["final_loss"] <= 1.05 * serial.summary["final_loss"]


def test_mf_gradient_is_the_objectives_derivative():
    from monsoon.problems.matrix_factorization import mf_synthetic

    p = mf_synthetic(users=30, items=20, ratings=400, rank=3, lam=0.3)
    w = p.initial_params(1) * 5
    loss, g = p.gradient(w, np.arange(p.n_examples))
    assert loss == pytest.approx(p.loss(w), rel=1e-12)
    for j in [0, 7, p.n_users * p.rank + 4, p.n_params - 1]:
        e = np.zeros_like(w)
        e[j] = 1e-6
        assert g[j] == pytest.approx((p.loss(w + e) - p.loss(w - e)) / 2e-6, abs=1e-7)


@pytest.mark.slow
def test_mf_hogwild_two_threads_reaches_serials_rmse():
    """Planted rank 5: Hogwild! with 2 threads within 5% of serial's RMSE."""
    # 200 ratings per user: enough that both leave the small random start
    # well within the budget (with 60 per user, Hogwild!'s timing decides
    # how soon it escapes, and the comparison is a coin toss)
    p = make_problem("mf-synthetic", "float64")
    serial = monsoon.train(p, "serial", epochs=10, seed=0)
    hog = monsoon.train(p, "hogwild", 2, epochs=10, seed=0)
    assert p.rmse(serial.params) < 0.2  # near the noise (0.1): the rank-5 model was found
    assert p.rmse(hog.params) <= 1.05 * p.rmse(serial.params)
    sync = monsoon.train(p, "sync", 2, epochs=2, batch_size=32, lr=1.0, seed=0)
    assert p.rmse(sync.params) < p.rmse(p.initial_params(0))  # mini-batch path works too


def test_mf_defaults_train_with_mini_batch_steps_too():
    """A matrix factorization's lr (0.05) is a per-example step: a batch's
    mean gradient moves a row 1/64 of it, so sync and async at the
    defaults barely moved (ratings:ml.csv: 6.397 from 6.421, the mean
    rating 0.456). They start at lr x batch size and end well below the
    constant predictor (the mean rating), from a name or a problem built in
    Python; the per-example loop keeps 0.05; a given lr is used as given,
    and a run left above the mean rating's loss is warned of."""
    from monsoon.problems.matrix_factorization import MatrixFactorization

    name = "mf-synthetic:users=60,items=40,ratings=3000,rank=3"
    planted = make_problem(name, "float64")
    p = MatrixFactorization(planted.users, planted.items, planted.ratings + 3.0, rank=4)
    assert p.constant_loss() == pytest.approx(0.5 * np.var(p.ratings), rel=1e-12)
    for problem, strategy in ((name, "sync"), (p, "async")):
        run = monsoon.train(problem, strategy, 2, seed=0, progress=False)
        assert run.summary["lr"] == pytest.approx(0.05 * 64), strategy
        assert run.summary["final_loss"] < 0.1 * p.constant_loss(), strategy
        assert "warning" not in run.summary, strategy
    hog = monsoon.train(p, "hogwild", 2, seed=0, progress=False)
    assert hog.summary["per_example_loop"] and hog.summary["lr"] == 0.05
    assert hog.summary["final_loss"] < 0.1 * p.constant_loss()
    slow = monsoon.train(p, "sync", 2, lr=0.05, seed=0, progress=False)
    assert slow.summary["lr"] == 0.05 and "a constant predictor's" in slow.summary["warning"]


def test_ratings_file_trains_from_the_cli(tmp_path):
    rng = np.random.default_rng(1)
    lines = ["userId,movieId,rating,timestamp"]
    for _ in range(2000):
        u, m = rng.integers(0, 50), rng.integers(0, 40)
        lines.append(f"{u},{m},{(u % 5 + m % 3) / 2:.1f},978300760")
    path = write(tmp_path, "ratings.csv", "\n".join(lines) + "\n")
    code = cli_main(["train", "--problem", f"ratings:{path}", "--strategy", "hogwild",
                     "--workers", "2", "--out", str(tmp_path / "run"), "--quiet"])
    assert code == 0
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["n_examples"] == 2000 and summary["backend"] == "threads"
    start = make_problem(f"ratings:{path}", "float64")
    assert summary["final_loss"] < 0.5 * start.loss(start.initial_params(0))


def test_cli_hogwild_on_default_rcv1_like_and_async_on_sparse(tmp_path):
    """The issue's command as written: 200,000 x 47,236 rows, 2 threads."""
    code = cli_main(["train", "--problem", "rcv1-like", "--strategy", "hogwild", "--workers",
                     "2", "--out", str(tmp_path / "hog"), "--quiet"])
    assert code == 0
    summary = json.loads((tmp_path / "hog" / "summary.json").read_text())
    assert summary["n_examples"] == 200_000 and summary["n_params"] == 47_237
    assert summary["final_loss"] < 0.5 and (tmp_path / "hog" / "loss.png").exists()
    run = monsoon.train("rcv1-like:rows=5000,features=1000", "async", 2, epochs=2, seed=0,
                        backend="threads")
    assert run.summary["staleness"]["max"] >= 0 and run.summary["updates"] > 0


def test_a_libsvm_file_trains_the_plain_log_loss(tmp_path):
    """libsvm:PATH has no L2 term (as MLlib at regParam 0 and VW fit): its
    objective at any w is the mean log-loss, computed here by hand."""
    path = tmp_path / "d.libsvm"
    path.write_text("1 1:0.5 3:2\n-1 2:1\n1 1:1 2:-1 3:0.25\n-1 3:1\n")
    problem = make_problem(f"libsvm:{path}", dtype="float64")
    X, y, _ = load_svmlight(str(path), dtype="float64")
    w = np.array([3.0, -2.0, 1.5, 0.5])  # large weights: an L2 term would show
    z = X @ w[:-1] + w[-1]
    by_hand = np.mean(np.logaddexp(0, z) - (y > 0) * z)
    assert problem.loss(w) == pytest.approx(by_hand, rel=1e-12)


def test_the_compiled_loop_runs_for_a_rule_that_declares_a_plain_step():
    """The local engine takes a problem's compiled per-example loop where the
    rule declares its step plain (``Rule.plain_step``), by that declaration,
    never by the rule's name: a renamed plain SGD takes it, a subclass of
    SGD that changes the step does not, nor does AdaGrad."""
    from monsoon.engines.local.engine import LocalEngine
    from monsoon.rules import make_rule
    from monsoon.rules.sgd import SGD
    from monsoon.strategies import make_strategy
    from monsoon.strategies.batches import Budget

    class Renamed(SGD):
        name = "my-sgd"

    class Clipped(SGD):
        name = "clipped"
        plain_step = False

    problem = rcv1_like(rows=200, features=50, nnz=5)
    hogwild, epochs = make_strategy("hogwild"), Budget(epochs=1)
    sgd = make_rule("sgd", 0.1)
    takes = {name: LocalEngine.uses_kernel(problem, rule, hogwild, epochs)
             for name, rule in [("sgd", sgd), ("renamed", Renamed(sgd.schedule)),
                                ("clipped", Clipped(sgd.schedule)),
                                ("adagrad", make_rule("adagrad", 0.1))]}
    assert takes == {"sgd": True, "renamed": True, "clipped": False, "adagrad": False}
    # a rate that changes with the update count, or mini-batches asked for: batches
    stepped = make_rule("sgd", 0.1, schedule="step", step_size=10)
    assert not LocalEngine.uses_kernel(problem, stepped, hogwild, epochs)
    assert not LocalEngine.uses_kernel(problem, sgd, hogwild, epochs, frozenset({"batch_size"}))


def test_the_summary_says_which_step_a_sparse_serial_run_took(tmp_path):
    """Serial on a sparse problem runs the compiled per-example loop, and its
    summary says so (one example per update); given --batch-size, it takes
    those mini-batches and ends where sync with one worker does."""
    common = dict(epochs=2, seed=3, progress=False)
    loop = monsoon.train("rcv1-like:rows=400,features=60,nnz=6", "serial",
                         out=tmp_path / "loop", **common)
    assert loop.summary["per_example_loop"] is True and loop.summary["batch_size"] == 1
    assert loop.summary["updates"] == loop.summary["examples"] == 800
    batches = monsoon.train("rcv1-like:rows=400,features=60,nnz=6", "serial", batch_size=64,
                            out=tmp_path / "batches", **common)
    sync = monsoon.train("rcv1-like:rows=400,features=60,nnz=6", "sync", workers=1,
                         out=tmp_path / "sync", **common)
    assert "per_example_loop" not in batches.summary and batches.summary["batch_size"] == 64
    assert batches.summary["updates"] == sync.summary["updates"] == 14
    np.testing.assert_array_equal(batches.params, sync.params)

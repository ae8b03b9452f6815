"""A user's own PyTorch model, trained as they built it (issue 18): its own
initial weights, its buffers trained and returned, every reported figure in
eval mode, validation and accuracy, the saved model."""
import copy
import functools
import re
import json

import numpy as np
import pytest
import torch
from torch import nn
from torch.nn import functional as F

import monsoon
from monsoon.problems import TorchProblem
from monsoon.record.plots import plot_loss

from ddp_reference import run_ddp


def _mlp():
    return nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))


def _bn():
    return nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 1))


def _regression(n=64):
    g = torch.Generator().manual_seed(1)
    X = torch.randn(n, 8, generator=g, dtype=torch.float64)
    return X, (X[:, :1] * 2 - X[:, 1:2]).sin()


def _rel(a, b):
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30)


@pytest.mark.slow
@pytest.mark.parametrize("make", [_mlp, _bn], ids=["mlp", "batchnorm"])
def test_sync_equals_ddp_from_the_users_module(make, tmp_path):
    """The same module object (built under seed 7, the run's seed is 0), the
    same halves, SGD, 10 full-batch steps: monsoon sync x2 equals DDP x2 on
    gloo; with BatchNorm, the buffers equal DDP's rank 0's
    (broadcast_buffers)."""
    torch.manual_seed(7)
    module = make().double()
    X, y = _regression()
    reference = run_ddp(copy.deepcopy(module), nn.MSELoss(), X, y, lr=0.1, steps=10, seed=0,
                        path=tmp_path / "ddp.pt")
    problem = TorchProblem(module, nn.MSELoss(), X, y, dtype="float64")
    result = monsoon.train(problem, "sync", 2, lr=0.1, steps=10, batch_size=len(X), seed=0,
                           backend="processes")
    mine = result.model.state_dict()
    assert set(mine) == set(reference)
    for name, value in reference.items():
        assert _rel(mine[name], value) < 1e-5, name
    if make is _bn:
        assert int(mine["1.num_batches_tracked"]) == 10


def _digits():
    from sklearn.datasets import load_digits

    d = load_digits()
    return torch.tensor(d.data / 16.0, dtype=torch.float32), torch.tensor(d.target)


def _bn_dropout():
    torch.manual_seed(3)
    return nn.Sequential(nn.Linear(64, 64), nn.BatchNorm1d(64), nn.ReLU(), nn.Dropout(0.5),
                         nn.Linear(64, 10))


def _recalibrated_loss(model, X, y):
    """Eval-mode loss after recomputing the BatchNorm statistics at the
    model's parameters from the training data (SWA's update_bn): what the
    buffers should be, whatever the strategy."""
    model = copy.deepcopy(model)
    for m in model.modules():
        if isinstance(m, nn.BatchNorm1d):
            m.reset_running_stats()
            m.momentum = None  # a plain average over the batches
    model.train()
    with torch.no_grad():
        for start in range(0, len(X), 32):
            model(X[start:start + 32])
        return float(nn.CrossEntropyLoss()(model.eval()(X), y))


@pytest.mark.slow
def test_batchnorm_dropout_model_is_evaluated_in_eval_mode_under_every_strategy():
    X, y = _digits()
    losses = {}
    for strategy, workers in [("serial", 1), ("sync", 2), ("async", 2), ("hogwild", 2),
                              ("local-sgd", 2), ("easgd", 2)]:
        problem = TorchProblem(_bn_dropout(), nn.CrossEntropyLoss(), X, y)
        # processes (buffers come back pickled), threads for the rest. Threads share
        # torch's one generator, so their Dropout masks depend on timing: local-sgd
        # runs in processes, where a seeded run is reproducible. hogwild too: on
        # threads, 1 CI run in ~5 returned buffers 9x worse than recalibrated ones
        # (not reproduced; see the note in problems/buffers.py).
        backend = ("processes" if strategy in ("sync", "async", "local-sgd", "hogwild")
                   else "threads")
        result = monsoon.train(problem, strategy, workers, lr=0.03, epochs=6, seed=0, evals=0,
                               backend=backend)
        model = result.model.eval()
        with torch.no_grad():
            direct = float(nn.CrossEntropyLoss()(model(X), y))
            again = float(nn.CrossEntropyLoss()(model(X), y))
        assert result.summary["final_loss"] == pytest.approx(direct, rel=1e-6), strategy
        assert direct == again
        # evaluating touched no buffer
        assert problem.evaluate(result.params)["loss"] == result.summary["final_loss"]
        # the returned buffers are the trained ones: about as good as statistics
        # recomputed at the final parameters (untrained buffers give ~7x). Averaged
        # running statistics of 16-example batches are noisy: on threads, 1 run in
        # ~10 lands at 1.3-2.9x (measured), so the bound for those is looser.
        bound = 1.15 if strategy in ("serial", "sync", "local-sgd") else 3.5
        assert direct <= bound * _recalibrated_loss(result.model, X, y), strategy
        losses[strategy] = direct
    for strategy, loss in losses.items():
        if strategy in ("easgd", "hogwild", "async"):
            continue  # EASGD's elastic pull converges slower per example (see report);
            # async and hogwild depend on timing: see the bound above
        assert losses["serial"] / 1.15 <= loss <= 1.15 * losses["serial"], losses


def test_an_untracked_batchnorm_evaluates_a_last_chunk_of_one_row():
    """BatchNorm1d(track_running_stats=False) normalises each evaluation
    chunk by its own statistics, even in eval mode; 9 rows in chunks of 4
    left a last chunk of 1 row, and the run failed evaluating ("Expected
    more than 1 value per channel"). That row now joins the chunk before."""
    from monsoon.problems.torch_model import eval_chunks

    assert eval_chunks(9, 4, 2) == [(0, 4), (4, 9)]
    assert eval_chunks(9, 4) == [(0, 4), (4, 8), (8, 9)]  # a model that takes one row
    assert eval_chunks(8, 4, 2) == [(0, 4), (4, 8)] and eval_chunks(1, 4, 2) == [(0, 1)]
    torch.manual_seed(0)
    X, y = torch.randn(9, 4), torch.randn(9, 1)
    net = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8, track_running_stats=False),
                        nn.Linear(8, 1))
    problem = TorchProblem(net, nn.MSELoss(), X, y, eval_batch=4, val=(X, y))
    result = monsoon.train(problem, "serial", steps=3, batch_size=3, progress=False)
    model = result.model.eval()
    with torch.no_grad():
        want = (4 * float(nn.MSELoss()(model(X[:4]), y[:4]))
                + 5 * float(nn.MSELoss()(model(X[4:]), y[4:]))) / 9
    assert result.summary["final_loss"] == pytest.approx(want, rel=1e-6)
    assert problem.evaluate(result.params)["val_loss"] == pytest.approx(want, rel=1e-6)


def test_an_untracked_batchnorm_evaluates_a_one_row_validation_set():
    """A validation set of one row under BatchNorm1d(track_running_stats=False):
    no chunk before it to join, and the problem's probe refused it ("Expected
    more than 1 value per channel"). The row is evaluated alone: normalised by
    its own statistics, the layer gives its bias, and val_loss is the model's
    loss on that row."""
    torch.manual_seed(0)
    X, y = torch.randn(9, 4), torch.randn(9, 1)
    vX, vy = torch.randn(1, 4), torch.randn(1, 1)
    net = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8, track_running_stats=False),
                        nn.Linear(8, 1))
    problem = TorchProblem(net, nn.MSELoss(), X, y, val=(vX, vy))
    result = monsoon.train(problem, "serial", steps=3, batch_size=3, progress=False)
    model = result.model
    with torch.no_grad():
        want = float(nn.MSELoss()(model[2](model[1].bias.reshape(1, -1)), vy))
        bias_shift = float(nn.MSELoss()(model[2](model[1].bias.reshape(1, -1) + 1), vy))
    assert want != pytest.approx(bias_shift)  # the figure depends on the layer's bias
    assert result.summary["val_loss"] == pytest.approx(want, rel=1e-6)
    assert all(np.isfinite(row["val_loss"]) for row in result.history)
    assert problem.evaluate(result.params)["val_loss"] == pytest.approx(want, rel=1e-6)



def test_a_lone_rows_output_keeps_its_containers_each_tensor_cut_to_one_row():
    """A lone row goes through as two copies (above); a module's output of
    tensors in dicts, tuples (named ones too) and lists comes back in the
    same containers, each tensor cut to the first row, anything else as it
    is: a loss reading ``out["logits"]`` gets the row's value."""
    import collections

    from monsoon.problems.torch_model import _first_rows

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.body = nn.Sequential(nn.Linear(4, 8),
                                      nn.BatchNorm1d(8, track_running_stats=False))
            self.head = nn.Linear(8, 1)

        def forward(self, x):
            h = self.body(x)
            return {"logits": self.head(h), "parts": (h, [h, "name"])}

    torch.manual_seed(0)
    X, y = torch.randn(9, 4), torch.randn(9, 1)
    vX, vy = torch.randn(1, 4), torch.randn(1, 1)
    net = Net()
    problem = TorchProblem(net, lambda out, t: F.mse_loss(out["logits"], t), X, y, val=(vX, vy))
    with torch.no_grad():
        want = float(F.mse_loss(net.head(net.body[1].bias.reshape(1, -1)), vy))
    assert problem.evaluate(problem.initial_params(0))["val_loss"] == pytest.approx(want, rel=1e-5)
    pair = collections.namedtuple("Pair", "a b")
    out = {"n": pair(torch.ones(2, 3), None),
           "d": collections.defaultdict(list, x=torch.ones(2)), "m": torch.ones(2, 3).max(1)}
    cut = _first_rows(out)
    assert type(cut["n"]) is pair and cut["n"].a.shape == (1, 3) and cut["n"].b is None
    assert cut["d"].default_factory is list and cut["d"]["x"].shape == (1,)
    assert type(cut["m"]) is type(out["m"]) and cut["m"].indices.shape == (1,)

def test_a_layer_the_user_froze_stays_frozen_through_evaluation():
    """Evaluation ended with module.train(), which set every layer training:
    a BatchNorm the user froze with .eval() then updated its statistics in
    the next run on the same problem, and the trained model came back with
    it training. Evaluation now puts back each layer's own mode."""
    torch.manual_seed(0)
    X, y = torch.randn(9, 4), torch.randn(9, 1)
    net = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Linear(8, 1))
    net[1].eval()
    frozen = net[1].running_mean.clone()
    problem = TorchProblem(net, nn.MSELoss(), X, y)
    for _ in range(2):
        result = monsoon.train(problem, "serial", steps=5, batch_size=3, evals=3,
                               progress=False)
        assert not problem.module[1].training and problem.module.training
        assert not result.model[1].training and result.model.training
        assert torch.equal(result.model[1].running_mean, frozen)


class _OwnLayer(nn.Module):
    def forward(self, x):  # noise while training, as a Dropout of its own
        return x * (1 + 0.1 * torch.rand_like(x)) if self.training else x


def _draws_dropout_frozen():
    net = nn.Sequential(nn.Linear(4, 8), nn.Dropout(0.5), nn.Linear(8, 1))
    net[1].eval()  # the user's choice: no masks in training
    return net


@pytest.mark.parametrize("make,draws", [
    (lambda: nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1)), False),
    (lambda: nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Linear(8, 1)), False),
    (lambda: nn.Sequential(nn.Linear(4, 8), nn.Dropout(0.5), nn.Linear(8, 1)), True),
    (lambda: nn.Sequential(nn.Linear(4, 8), nn.RReLU(), nn.Linear(8, 1)), True),
    # handed over in eval mode: training puts every layer in training mode
    (lambda: nn.Sequential(nn.Linear(4, 8), nn.Dropout(0.5), nn.Linear(8, 1)).eval(), True),
    (_draws_dropout_frozen, False),
    # a layer class of the user's: its forward may draw (torch.rand, F.dropout)
    (lambda: nn.Sequential(nn.Linear(4, 8), _OwnLayer(), nn.Linear(8, 1)), True),
])
def test_random_draws_are_declared_only_where_training_draws_random_numbers(make, draws):
    """Every torch problem seeds its workers' draws, and random_draws said
    true for every torch model, so the report could not tell a model with
    Dropout from one without. Its layers tell, read without running the
    module (a forward pass has the user's side effects), so its modes and
    buffers and torch's generator stay as they were."""
    torch.manual_seed(0)
    net = make()
    modes = [m.training for m in net.modules()]
    buffers = [b.clone() for b in net.buffers()]
    X, y = torch.randn(8, 4), torch.randn(8, 1)
    rng = torch.get_rng_state()
    problem = TorchProblem(net, nn.MSELoss(), X, y)
    assert problem.draws_random() is draws
    assert [m.training for m in problem.module.modules()] == modes
    assert all(torch.equal(a, b) for a, b in zip(problem.module.buffers(), buffers))
    assert torch.equal(torch.get_rng_state(), rng)


def test_the_modules_own_weights_are_the_start_and_seed_redraws_them():
    torch.manual_seed(7)
    module = _mlp().double()
    own = torch.cat([p.detach().reshape(-1) for p in module.parameters()]).numpy().copy()
    X, y = _regression()
    problem = TorchProblem(module, nn.MSELoss(), X, y, dtype="float64")
    assert np.array_equal(problem.initial_params(0), own)
    seeded = TorchProblem(copy.deepcopy(module), nn.MSELoss(), X, y, dtype="float64",
                          init="seed")
    assert not np.array_equal(seeded.initial_params(0), own)
    assert np.array_equal(seeded.initial_params(0), seeded.initial_params(0))


@pytest.mark.parametrize("name", ["parabola", "exp", "digits"])
def test_a_catalog_module_is_the_same_at_every_call_and_leaves_the_users_generator(name):
    """``--init module`` gives a catalog problem its network's own weights:
    drawn from a generator of their own, not from the user's (two calls
    differed, and each moved the user's draws)."""
    from monsoon.problems import make_problem

    torch.manual_seed(5)
    expected = torch.rand(3)
    torch.manual_seed(5)
    first = make_problem(name, init="module").initial_params(0)
    assert torch.equal(torch.rand(3), expected)
    assert np.array_equal(make_problem(name, init="module").initial_params(0), first)


@pytest.mark.parametrize("name", ["exp", "digits"])
def test_a_seed_draws_the_same_start_in_either_dtype(name):
    """``--init seed`` draws a seed's weights in float32 and casts them: a
    float64 run starts where the float32 run does (torch's draws differ by
    dtype: exp's first loss was 1.5600 in float32, 1.8262 in float64)."""
    from monsoon.problems import make_problem

    single = make_problem(name, dtype="float32").initial_params(3)
    double = make_problem(name, dtype="float64").initial_params(3)
    assert double.dtype == np.float64
    assert np.array_equal(double, single.astype(np.float64))


@pytest.mark.parametrize("strategy, options", [
    ("serial", {}), ("sync", {"workers": 2, "backend": "threads"}),
    ("async", {"workers": 2, "backend": "processes"}), ("sync", {"workers": 2, "engine": "sim"})],
    ids=["serial", "sync-threads", "async-processes", "sync-sim"])
def test_the_users_module_ends_trained_whichever_strategy_ran(strategy, options):
    """The user's module holds the run's final weights and buffers (serial and
    the sim trained it in place; the others left its starting weights beside
    trained BatchNorm statistics), it no longer shares memory with
    ``result.params``, and a second run starts from the weights the problem
    was built with."""
    torch.manual_seed(3)
    module = _bn().double()
    X, y = _regression()
    problem = TorchProblem(module, nn.MSELoss(), X, y, dtype="float64")
    start = problem.initial_params(0)
    flat = lambda: torch.cat([p.detach().reshape(-1) for p in module.parameters()]).numpy()  # noqa: E731
    first = monsoon.train(problem, strategy, epochs=2, seed=0, progress=False, **options)
    assert np.array_equal(flat(), first.params) and not np.array_equal(flat(), start)
    trained = first.model
    for name, value in trained.named_buffers():
        assert torch.equal(dict(module.named_buffers())[name], value), name
    with torch.no_grad():
        next(module.parameters()).add_(1.0)
    assert not np.array_equal(flat(), first.params)  # a copy, not the result's array
    again = monsoon.train(problem, strategy, epochs=2, seed=0, progress=False, **options)
    assert again.history[0]["loss"] == first.history[0]["loss"]


def _classes(k, n=240):
    g = torch.Generator().manual_seed(k)
    X = torch.randn(n, 6, generator=g)
    if k == 2:
        return X, (X[:, :1] > 0).float(), nn.BCEWithLogitsLoss(), nn.Linear(6, 1)
    return X, X[:, :k].argmax(1) if k <= 6 else (X @ torch.randn(6, k, generator=g)).argmax(1), \
        nn.CrossEntropyLoss(), nn.Linear(6, k)


@pytest.mark.parametrize("k", [2, 10])
def test_classification_runs_record_accuracy_and_validation(k, tmp_path):
    X, y, loss_fn, net = _classes(k)
    problem = TorchProblem(net, loss_fn, X, y, val_fraction=0.25)
    result = monsoon.train(problem, "sync", 2, lr=0.5, epochs=5, seed=0, out=tmp_path / "run",
                           backend="threads")
    s = json.loads((tmp_path / "run" / "summary.json").read_text())
    for key in ("accuracy", "val_accuracy", "val_loss"):
        assert key in s and s[key] == result.summary[key]
    assert s["accuracy"] > 0.6
    header = (tmp_path / "run" / "metrics.csv").read_text().splitlines()[0].split(",")
    assert header[:5] == ["time_s", "updates", "examples", "epoch", "loss"]
    assert {"accuracy", "val_loss", "val_accuracy"} <= set(header)
    rows = monsoon.record.read_metrics(tmp_path / "run" / "metrics.csv")
    assert rows[-1]["val_accuracy"] == pytest.approx(s["val_accuracy"])
    assert plot_loss(tmp_path / "cmp.png", {"sync": rows, "other": rows}) == 2
    plain = [{k2: v for k2, v in r.items() if not k2.startswith("val")} for r in rows]
    assert plot_loss(tmp_path / "plain.png", {"sync": plain}) == 0


def _scored(kind, n):
    """(module, loss, X, y, the share of y's entries the module's output
    gets right, as torch computes it) for an accuracy of another shape."""
    g = torch.Generator().manual_seed(n)
    if kind in ("per-position", "positions-equal-classes"):  # output (N, C, L), y (N, L)
        L = 7 if kind == "per-position" else 3
        X = torch.randn(n, 4, L, generator=g)
        return nn.Conv1d(4, 3, 1), nn.CrossEntropyLoss(), X, X[:, :3].argmax(1), \
            lambda out, y: (out.argmax(1) == y).double().mean()
    X = torch.randn(n, 6, generator=g)
    if kind == "ignore-index":  # positions the loss skips are not scored
        y = X[:, :3].argmax(1).masked_fill(X[:, 3] > 0.5, -100)
        return nn.Linear(6, 3), nn.CrossEntropyLoss(), X, y, \
            lambda out, y: (out.argmax(1) == y)[y != -100].double().mean()
    if kind == "bce-probabilities":
        return nn.Sequential(nn.Linear(6, 1), nn.Sigmoid()), nn.BCELoss(), X, \
            (X[:, :1] > 0).float(), lambda out, y: ((out > 0.5).float() == y).double().mean()
    return nn.Linear(6, 3), nn.BCEWithLogitsLoss(), X, (X[:, :3] > 0).float(), \
        lambda out, y: ((out > 0).float() == y).double().mean()  # multi-label: (N, 3)


@pytest.mark.parametrize("kind", ["per-position", "positions-equal-classes", "ignore-index",
                                  "bce-probabilities", "multi-label"])
def test_accuracy_scores_every_target_entry_by_the_losss_own_convention(kind):
    """Cross-entropy's classes are dimension 1 (per-position targets score
    each position), BCELoss thresholds probabilities at 0.5, BCEWithLogits
    logits at 0, a multi-label row scores each label: accuracy and
    val_accuracy are torch's own share of right entries, summed over
    evaluation chunks."""
    torch.manual_seed(3)
    module, loss_fn, X, y, share = _scored(kind, 50)
    _, _, vX, vy, _ = _scored(kind, 30)
    problem = TorchProblem(module, loss_fn, X, y, val=(vX, vy), eval_batch=16)
    figures = problem.evaluate(problem.initial_params(0))
    with torch.no_grad():
        expected = float(share(module(X), y)), float(share(module(vX), vy))
    assert (figures["accuracy"], figures["val_accuracy"]) == pytest.approx(expected, abs=1e-12)
    assert 0 < min(expected) and max(expected) < 1



def _class_data(n=120, ignored=-100):
    """Inputs (n, 6) and 3-class targets, some equal to ``ignored``."""
    g = torch.Generator().manual_seed(5)
    X = torch.randn(n, 6, generator=g)
    return X, X[:, :3].argmax(1).masked_fill(X[:, 3] > 0.8, ignored)


@pytest.mark.parametrize("module_loss, functional", [
    (nn.CrossEntropyLoss(), F.cross_entropy), (nn.NLLLoss(), F.nll_loss)],
    ids=["cross_entropy", "nll_loss"])
def test_a_functional_class_index_loss_reports_the_modules_accuracy(module_loss, functional,
                                                                    tmp_path):
    """``loss=F.cross_entropy`` (or ``F.nll_loss``) trained as the module
    does but reported no accuracy or val_accuracy. Same data and seed: the
    same figures, targets at the function's default ignore_index (-100)
    skipped as the module skips them. A loss wrapped in a lambda is not
    read, and reports none."""
    X, y = _class_data()
    summaries = {}
    for name, loss_fn in [("module", module_loss), ("functional", functional),
                          ("lambda", lambda out, t: functional(out, t))]:
        torch.manual_seed(0)
        net = nn.Sequential(nn.Linear(6, 3), nn.LogSoftmax(1)) \
            if isinstance(module_loss, nn.NLLLoss) else nn.Linear(6, 3)
        problem = TorchProblem(net, loss_fn, X, y, val_fraction=0.25)
        summaries[name] = monsoon.train(problem, "serial", epochs=2, lr=0.5, seed=0,
                                        progress=False, out=tmp_path / name).summary
    module, functional_s, opaque = summaries["module"], summaries["functional"], \
        summaries["lambda"]
    assert 0 < module["accuracy"] < 1 and 0 < module["val_accuracy"] < 1
    assert (functional_s["accuracy"], functional_s["val_accuracy"]) \
        == (module["accuracy"], module["val_accuracy"])
    assert functional_s["final_loss"] == module["final_loss"]
    assert "accuracy" not in opaque and "val_accuracy" not in opaque


def test_a_partials_ignore_index_is_the_one_accuracy_skips():
    """``functools.partial(F.cross_entropy, ignore_index=2)``: positions
    whose target is 2 are not scored, as the module with ignore_index=2
    and the loss itself skip them (the function's default, -100, would
    score them)."""
    torch.manual_seed(3)
    module = nn.Linear(6, 3)
    X, y = _class_data(ignored=2)
    vX, vy = X[:40], y[:40]
    with torch.no_grad():
        pred = module(X).argmax(1)
    scored = y != 2
    expected = float((pred == y)[scored].double().mean())
    for loss_fn in (functools.partial(F.cross_entropy, ignore_index=2),
                    nn.CrossEntropyLoss(ignore_index=2)):
        problem = TorchProblem(module, loss_fn, X, y, val=(vX, vy), eval_batch=16)
        figures = problem.evaluate(problem.initial_params(0))
        assert figures["accuracy"] == pytest.approx(expected, abs=1e-12)
        assert figures["val_accuracy"] == pytest.approx(
            float((pred[:40] == vy)[scored[:40]].double().mean()), abs=1e-12)
    assert 0 < expected < 1 and (~scored).sum() > 0
    assert expected != pytest.approx(float((pred == y).double().mean()))  # 2s scored

def test_saved_model_loads_weights_only_and_reproduces_the_result(tmp_path):
    X, _ = _digits()
    X, y = X[:300], _digits()[1][:300]
    problem = TorchProblem(_bn_dropout(), nn.CrossEntropyLoss(), X, y)
    result = monsoon.train(problem, "sync", 2, lr=0.05, epochs=2, seed=0, out=tmp_path,
                           backend="threads")
    state = torch.load(tmp_path / "model.pt", weights_only=True)
    assert "1.running_mean" in state
    fresh = _bn_dropout()
    fresh.load_state_dict(state)
    with torch.no_grad():
        assert torch.equal(fresh.eval()(X), result.model.eval()(X))
    other = monsoon.train("linear", "serial", steps=5, out=tmp_path / "np")
    assert np.array_equal(np.load(tmp_path / "np" / "params.npy"), other.params)


@pytest.mark.png
def test_a_run_with_no_curve_plots_without_a_warning(tmp_path):
    """A run that failed before its first row still gets its loss.png, and
    matplotlib is not asked for a legend of nothing (a warning on stderr
    beside the run's one-line error)."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert plot_loss(tmp_path / "empty.png", {"sync": []}) == 0
    assert (tmp_path / "empty.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize("module, words", [
    ("class", "pass Net(), not the class Net"),
    ("lambda", "not function"),
])
def test_a_module_that_is_not_an_instance_is_refused_in_one_line(module, words):
    from monsoon.errors import ConfigError
    from monsoon.problems import TorchProblem

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(4, 1)

    given = Net if module == "class" else (lambda: Net())
    X, y = np.zeros((8, 4), np.float32), np.zeros(8, np.float32)
    with pytest.raises(ConfigError, match=re.escape(words)):
        TorchProblem(given, torch.nn.functional.mse_loss, X, y)


UNGUARDED = """
import numpy as np, torch, monsoon
from monsoon.problems import TorchProblem

class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 1)

    def forward(self, x):
        return self.lin(x).squeeze(-1)

X = np.random.default_rng(0).normal(size=(64, 4)).astype(np.float32)
monsoon.train(TorchProblem(Net(), torch.nn.functional.mse_loss, X, X.sum(1)), "async", 2,
              epochs=1, engine="local", backend="processes", timeout=60)
"""


@pytest.mark.slow
def test_a_script_without_a_main_guard_gets_one_error_not_a_traceback_per_worker(tmp_path):
    """Each worker re-runs a script whose problem refers to its code; one
    that reaches the unguarded call to monsoon leaves quietly, and the user
    reads the parent's error alone, which says what to change."""
    import subprocess
    import sys

    script = tmp_path / "train.py"
    script.write_text(UNGUARDED)
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          cwd=tmp_path, timeout=300)
    assert proc.returncode != 0
    assert 'put the call to monsoon under `if __name__ == "__main__":`' in proc.stderr
    assert proc.stderr.count("Traceback") == 1, proc.stderr
    assert "bootstrapping phase" not in proc.stderr


class _LambdaNet(torch.nn.Module):
    """A module that holds a lambda: its problem cannot be pickled for a worker."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 1)
        self.act = lambda x: x

    def forward(self, x):
        return self.act(self.lin(x)).squeeze(-1)


def test_a_run_whose_workers_fail_to_start_leaves_nothing_in_dev_shm():
    """Worker processes that cannot start (the module holds a lambda): the
    run fails, and the block of shared memory its data was moved into is
    gone, not left in /dev/shm until this process exits (the monitor
    unlinked it only once every worker was ready)."""
    import os
    from monsoon.errors import RunFailed

    def segments():  # the files of /dev/shm this process maps that are still there
        maps = [line.split() for line in open("/proc/self/maps")]
        return {m[5] for m in maps if len(m) == 6 and m[5].startswith("/dev/shm/monsoon-")
                and os.path.exists(m[5])}

    X = np.random.default_rng(0).normal(size=(64, 4)).astype(np.float32)
    before = segments()
    for _ in range(2):
        problem = TorchProblem(_LambdaNet(), torch.nn.functional.mse_loss, X, X.sum(1))
        with pytest.raises(RunFailed, match="pickle"):
            monsoon.train(problem, "sync", 2, steps=5, engine="local", backend="processes",
                          progress=False)
        assert problem._shm is not None  # its data was moved to shared memory
        assert segments() <= before


def test_a_problems_two_argument_seed_rng_is_still_called():
    """monsoon's older ``seed_rng(seed, rank)``: called as such (never with
    None), where the three-argument form gets the gradients done too."""
    import torch

    from monsoon.problems.base import seed_worker

    calls = []

    class Old(monsoon.TorchProblem):
        def seed_rng(self, seed, rank):
            calls.append((seed, rank))

    class New(monsoon.TorchProblem):
        def seed_rng(self, seed, rank, done):
            calls.append((seed, rank, done))

    X, y = torch.randn(40, 3), torch.randn(40, 1)
    run = monsoon.train(Old(torch.nn.Linear(3, 1), torch.nn.MSELoss(), X, y), "serial",
                        epochs=1, seed=5, evals=0, progress=False)
    assert run.summary["status"] == "finished" and calls == [(5, 0)]
    new = New(torch.nn.Linear(3, 1), torch.nn.MSELoss(), X, y)
    seed_worker(new, 5, 1, 7)
    seed_worker(new, None, 1)
    assert calls[1:] == [(5, 1, 7), (None, 1, 0)]


def _bn_problem(n, module=None, X=None):
    g = torch.Generator().manual_seed(0)
    X = torch.randn(n, 8, generator=g) if X is None else X
    return TorchProblem(module or _bn(), nn.MSELoss(), X, torch.randn(n, 1, generator=g))


@pytest.mark.parametrize("n, strategy, workers, batch_size, fits", [
    (33, "serial", 1, 32, "--batch-size 33"),    # an epoch's last batch of 1
    (34, "sync", 2, 32, "--batch-size 34"),      # a last batch of 2, cut in two
    (10, "sync", 3, 4, "--batch-size 10"),       # every batch of 4 cut in three
    (66, "hogwild", 2, 32, "--batch-size 33"),   # each worker's slice of 33 ends in 1
])
def test_a_batchnorm_model_is_refused_where_a_pass_would_hold_one_example(
        tmp_path, n, strategy, workers, batch_size, fits):
    """BatchNorm cannot train on one example ("Expected more than 1 value per
    channel when training"): a worker failed with it after an epoch, the
    run folder written. Refused before, naming a batch size that works, and
    that one trains."""
    from monsoon.errors import ConfigError

    problem, out = _bn_problem(n), tmp_path / "run"
    with pytest.raises(ConfigError) as info:
        monsoon.train(problem, strategy, workers, batch_size=batch_size, epochs=1,
                      backend="threads", out=out)
    line = str(info.value)
    assert "\n" not in line and "BatchNorm layer '1'" in line and fits in line, line
    assert not out.exists()
    size = int(fits.split()[-1])
    run = monsoon.train(problem, strategy, workers, batch_size=size, epochs=2,
                        backend="threads", evals=0, progress=False)
    assert run.summary["status"] == "finished"


def test_a_model_one_example_trains_is_not_refused():
    """Only what torch refuses is: BatchNorm2d over an image of 2x2 has 4
    values per channel of one example; a step budget that ends before the
    short batch never takes it; a model without BatchNorm takes any batch."""
    conv = nn.Sequential(nn.Conv2d(1, 2, 1), nn.BatchNorm2d(2), nn.Flatten(), nn.Linear(8, 1))
    for problem, options in [
            (_bn_problem(33, conv, torch.randn(33, 1, 2, 2)), {"epochs": 1}),
            (_bn_problem(33), {"steps": 1}),
            (_bn_problem(33, _mlp()), {"epochs": 1})]:
        run = monsoon.train(problem, "serial", batch_size=32, evals=0, progress=False,
                            **options)
        assert run.summary["status"] == "finished"


def test_a_validation_dataset_is_the_same_as_its_tensors():
    """``val=Dataset``, offered by docs/your-model.md, failed when built
    ("only one element tensors can be converted to Python scalars")."""
    from torch.utils.data import Dataset, TensorDataset

    from monsoon.errors import ConfigError

    class Pairs(Dataset):
        def __init__(self, X, y):
            self.X, self.y = X, y

        def __len__(self):
            return len(self.X)

        def __getitem__(self, i):
            return self.X[i], self.y[i]

    X, y = _regression()
    Xv, yv = _regression(16)
    w = TorchProblem(_mlp().double(), nn.MSELoss(), X, y).initial_params(0)
    losses = [TorchProblem(_mlp().double(), nn.MSELoss(), X, y, val=val).evaluate(w)["val_loss"]
              for val in [(Xv, yv), TensorDataset(Xv, yv), Pairs(Xv, yv)]]
    assert losses[0] == losses[1] == losses[2]
    with pytest.raises(ConfigError, match="val must be .* not a TensorDataset whose items "
                                          "collate into list"):
        TorchProblem(_mlp().double(), nn.MSELoss(), X, y, val=TensorDataset(Xv))


def test_data_that_requires_grad_is_taken_as_data():
    """X that requires grad failed in the processes backend, mid-run ("Can't
    call numpy() on Tensor that requires grad", moving it to shared memory),
    and every threads step's backward reached it. Detached when built."""
    import pickle

    X, y = _regression()
    X, Xv = X.clone().requires_grad_(True), X[:8].clone().requires_grad_(True)
    problem = TorchProblem(_mlp().double(), nn.MSELoss(), X, y, val=(Xv, y[:8]))
    with problem.shared_data():  # what the processes backend sends its workers
        copy_ = pickle.loads(pickle.dumps(problem))
    assert torch.equal(copy_.X, X.detach()) and torch.equal(copy_.val[0], Xv.detach())
    run = monsoon.train(problem, "serial", epochs=1, evals=0, progress=False)
    assert run.summary["status"] == "finished" and X.grad is None


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_a_half_precision_module_is_refused_and_left_as_it_was(dtype):
    """It trained in float32 without a word, the user's module converted in
    place, where docs/gpu.md says a module trains in its own dtype."""
    from monsoon.errors import ConfigError

    X, y = _regression()
    module = _mlp().to(dtype)
    with pytest.raises(ConfigError, match=r"parameters are \w+16, which monsoon does not "
                                          r"train in: .*module.float\(\).*precision='bf16'"):
        TorchProblem(module, nn.MSELoss(), X.float(), y.float())
    assert all(p.dtype == dtype for p in module.parameters())
    problem = TorchProblem(module, nn.MSELoss(), X.float(), y.float(), dtype="float32")
    assert problem.dtype == np.float32  # asked for: converted


def test_a_loss_not_finite_at_the_start_says_so_not_to_lower_the_learning_rate(tmp_path):
    """Every target equal to ignore_index: the loss is nan before any
    update, and the run said "diverged ... after 10 updates; lower the
    learning rate (--lr)", which no learning rate fixes."""
    X = torch.randn(40, 3)
    problem = TorchProblem(nn.Linear(3, 2), nn.CrossEntropyLoss(), X,
                           torch.full((40,), -100))
    with pytest.raises(monsoon.TrainingDiverged) as info:
        monsoon.train(problem, "serial", epochs=1, batch_size=4, progress=False,
                      out=tmp_path / "run")
    line = str(info.value)
    assert "the loss is nan at the starting weights, before any update" in line, line
    assert "ignore_index" in line and "--lr" not in line
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["status"] == "diverged" and summary["stopped"] in line


BCE_FORMS = [(nn.BCEWithLogitsLoss(), "BCEWithLogitsLoss", True),
             (nn.BCELoss(), "BCELoss", False),
             (F.binary_cross_entropy_with_logits, "F.binary_cross_entropy_with_logits", True),
             (F.binary_cross_entropy, "F.binary_cross_entropy", False),
             (functools.partial(F.binary_cross_entropy_with_logits, pos_weight=torch.tensor(2.0)),
              "F.binary_cross_entropy_with_logits", True)]


@pytest.mark.parametrize("loss_fn, name, logits", BCE_FORMS)
def test_binary_cross_entropy_targets_outside_0_1_are_refused_when_built(loss_fn, name, logits):
    """Labels -1/+1 under BCE trained a loss that fell without bound (-54
    after 50 epochs) and the run said "finished". Refused in one line with
    the fix, for y, a validation set's y and a Dataset's targets, whether
    the loss is the module, its functional form or a partial of that (the
    functional form was not checked, and had no accuracy)."""
    from monsoon.errors import ConfigError

    X = torch.randn(20, 3)
    pm = torch.tensor([1.0, -1.0] * 10)[:, None]  # both labels among any two first rows
    module = nn.Linear(3, 1) if logits else nn.Sequential(nn.Linear(3, 1), nn.Sigmoid())
    words = re.escape(f"{name} takes targets in [0, 1]") + ".*{} holds -1 to 1" \
        + re.escape(": its loss would fall without bound; for labels -1/+1 give (y + 1) / 2")
    with pytest.raises(ConfigError, match=words.format("but y")):
        TorchProblem(module, loss_fn, X, pm)
    with pytest.raises(ConfigError, match=words.format("the validation set's y")):
        TorchProblem(module, loss_fn, X, (pm + 1) / 2, val=(X, pm))
    with pytest.raises(ConfigError, match=words.format("the dataset's first targets")):
        TorchProblem.from_dataset(torch.utils.data.TensorDataset(X, pm), module, loss_fn)
    problem = TorchProblem(module, loss_fn, X, (pm + 1) / 2)  # what the line says to give
    with torch.no_grad():  # thresholded as the module form is: logits at 0, else 0.5
        right = ((module(X) > (0.0 if logits else 0.5)).float() == (pm + 1) / 2).double().mean()
    assert problem.evaluate(problem.initial_params(0))["accuracy"] == float(right)


@pytest.mark.parametrize("loss_fn, name", [
    (nn.MSELoss(), "MSELoss"), (nn.L1Loss(), "L1Loss"), (nn.HuberLoss(), "HuberLoss"),
    (nn.BCEWithLogitsLoss(), "BCEWithLogitsLoss"),
    (torch.nn.functional.mse_loss, "F.mse_loss"),
    (functools.partial(F.huber_loss, delta=0.5), "F.huber_loss")])
def test_an_elementwise_loss_whose_targets_differ_from_the_output_in_shape_is_refused(
        loss_fn, name):
    """MSELoss on nn.Linear(5, 1)'s (N, 1) output with y of shape (N,) passed
    the build-time check and trained a wrong model (torch broadcasts to
    (N, N), a UserWarning at most): final loss 4.7 where y[:, None] gets
    0.008. Refused in one line naming both shapes and the fix."""
    from monsoon.errors import ConfigError

    X = torch.randn(20, 5)
    y = (X[:, 0] > 0).float()
    words = (f"{name} compares the module's output and the targets element by element, but "
             "on the first rows of {} the output has shape (2, 1) and the targets (2,), which "
             "torch broadcasts to (2, 2): make them one shape, y[:, None] (y.reshape(-1, 1)) "
             "for an output of one column, or squeeze the module's output")
    with pytest.raises(ConfigError, match=re.escape(words.format("X"))):
        TorchProblem(nn.Linear(5, 1), loss_fn, X, y)
    with pytest.raises(ConfigError, match=re.escape(words.format("the validation set's X"))):
        TorchProblem(nn.Linear(5, 1), loss_fn, X, y[:, None], val=(X, y))
    with pytest.raises(ConfigError, match=re.escape(words.format("the dataset's inputs"))):
        TorchProblem.from_dataset(torch.utils.data.TensorDataset(X, y), nn.Linear(5, 1), loss_fn)
    TorchProblem(nn.Linear(5, 1), loss_fn, X, y[:, None])  # as the line says

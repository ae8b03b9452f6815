"""Gradient compression (compressors/messages.py): each compressor against a
plain NumPy reference, error feedback's invariant, and compressed runs on
the local and sim engines recording fewer bytes."""
import math

import numpy as np
import pytest

import monsoon
from monsoon.compressors import messages as M
from monsoon.errors import ConfigError


def _v(n=1000, seed=0):
    return np.random.default_rng(seed).standard_normal(n).astype(np.float32)


def test_topk_keeps_the_k_largest_magnitudes():
    v = _v()
    enc = M.TopK(0.01).encode(v)
    out = M.TopK(0.01).decode(enc, v.dtype)
    ref = np.zeros_like(v)
    keep = np.argsort(-np.abs(v))[:10]
    ref[keep] = v[keep]
    np.testing.assert_array_equal(out, ref)
    assert enc.nbytes == 10 * 4 + math.ceil(10 * 10 / 8)  # values + 10-bit indices


def test_randk_sends_k_uniform_coordinates_unscaled():
    v = _v()
    c = M.RandK(0.1, seed=3)
    enc = c.encode(v)
    idx = np.sort(np.random.default_rng(enc.arrays["seed"]).choice(v.size, 100, replace=False))
    ref = np.zeros_like(v)
    ref[idx] = v[idx]
    np.testing.assert_array_equal(c.decode(enc, v.dtype), ref)
    assert enc.nbytes == 100 * 4 + 8
    assert not np.array_equal(c.encode(v).arrays["indices"], idx)  # fresh each message


def test_qsgd_matches_the_papers_stochastic_rounding_and_is_unbiased():
    v = _v(200)
    s = 4
    c = M.QSGD(s, seed=5)
    u = np.random.default_rng(5).random(v.size)  # the same draws as the compressor's
    norm = np.linalg.norm(v.astype(np.float64))
    r = np.abs(v) / norm * s
    level = np.floor(r) + (u < r - np.floor(r))
    ref = norm * np.sign(v) * level / s
    enc = c.encode(v)
    np.testing.assert_allclose(c.decode(enc, np.float64), ref, rtol=1e-6)
    assert enc.nbytes == 4 + math.ceil(200 * 4 / 8)  # 3 bits a level + 1 sign bit
    mean = np.mean([c.decode(c.encode(v), np.float64) for _ in range(4000)], axis=0)
    assert np.abs(mean - v).max() < 0.1 * np.abs(v).max()  # E[Q(v)] = v


def test_sign_is_l1_scaled_sign():
    v = _v()
    v[3] = 0.0
    c = M.Sign()
    enc = c.encode(v)
    ref = np.abs(v).sum() / v.size * np.where(v < 0, -1.0, 1.0)
    np.testing.assert_allclose(c.decode(enc, np.float32), ref, rtol=1e-6)
    assert enc.nbytes == 4 + 1000 // 8


def test_powersgd_is_one_warm_started_power_iteration_per_matrix():
    rng = np.random.default_rng(0)
    m1, bias, m2 = rng.standard_normal((6, 5)), rng.standard_normal(5), rng.standard_normal((4, 3))
    v = np.concatenate([m1.ravel(), bias, m2.ravel()])
    mats = [(0, 6, 5), (35, 4, 3)]
    c = M.PowerSGD(2, mats, seed=1)
    q0 = np.random.default_rng(1)
    qs = [q0.standard_normal((5, 2)), q0.standard_normal((3, 2))]

    def reference(m, q):
        p, _ = np.linalg.qr(m @ q)  # Vogels et al., Algorithm 1
        q = m.T @ p
        return p @ q.T, q

    for _ in range(2):  # the second message starts from the first's Q
        out = c.decode(c.encode(v), np.float64)
        r1, qs[0] = reference(m1, qs[0])
        r2, qs[1] = reference(m2, qs[1])
        np.testing.assert_allclose(out[:30], r1.ravel(), atol=1e-10)
        np.testing.assert_array_equal(out[30:35], bias)  # vectors travel whole
        np.testing.assert_allclose(out[35:], r2.ravel(), atol=1e-10)
    assert c.encode(v).nbytes == (6 + 5) * 2 * 8 + 5 * 8 + (4 + 3) * 2 * 8


@pytest.mark.parametrize("spec", ["topk:0.05", "randk:0.05", "qsgd:2", "sign", "powersgd:1"])
def test_error_feedback_sent_plus_residual_is_gradient_plus_old_residual(spec):
    name, arg = M.parse(spec)
    comp = M.Compression(name, arg, True, ((0, 20, 25),) if name == "powersgd" else ())
    sender = M.Sender(comp, rank=0)
    for seed in range(3):
        g = _v(500, seed).astype(np.float64)
        old = np.zeros_like(g) if sender.residual is None else sender.residual.copy()
        sent = sender.send(g)
        np.testing.assert_allclose(sent + sender.residual, g + old, rtol=0, atol=1e-12)
    assert np.linalg.norm(sender.residual) > 0
    assert sender.stats()["sent"] < sender.stats()["raw"]


def test_without_error_feedback_no_residual_is_kept():
    sender = M.Sender(M.Compression("topk", 0.1, False), 0)
    g = _v()
    sender.send(g)
    assert sender.residual is None
    ref = np.zeros_like(g)
    keep = np.argsort(-np.abs(g))[:100]
    ref[keep] = g[keep]
    np.testing.assert_array_equal(sender.send(g), ref)  # nothing carried over


@pytest.mark.parametrize("spec, words", [("topk", "fraction"), ("topk:2", "fraction"),
                                         ("qsgd:0", "whole number"), ("zip", "one of none, topk:FRACTION"),
                                         ("sign:3", "no argument")])
def test_bad_specs_are_refused_in_one_line(spec, words):
    with pytest.raises(ConfigError, match=words):
        M.parse(spec)


def test_qsgd_refuses_more_levels_than_a_level_carries_and_the_most_round_trip(tmp_path):
    """Issue: S >= 2**31 wrapped in the int32 levels (qsgd:4294967296 decoded
    1.0 as -0.5) and a huge S trained nothing, silently. Now S is refused past
    2**31 - 1, in one line naming that bound; that S itself travels exactly."""
    import contextlib
    import io

    from monsoon.cli import main

    most = M.QSGD(2**31 - 1)
    for v in (np.array([1.0, 0.001, -0.002]), np.array([0.0, -1.0, 0.0])):
        enc = most.encode(v)
        wire = most.pack(enc, v.dtype)
        assert wire.nbytes == enc.nbytes == 8 + math.ceil(3 * 32 / 8)
        back = most.unpack(wire, v.size, v.dtype)
        np.testing.assert_array_equal(back.arrays["levels"], enc.arrays["levels"])
        np.testing.assert_array_equal(most.decode(back, v.dtype), most.decode(enc, v.dtype))
        np.testing.assert_allclose(most.decode(enc, v.dtype), v, rtol=0, atol=1e-9)
    words = "compress must be qsgd:LEVELS with a whole number from 1 to 2147483647"
    for s in (2**31, 2**32, 10**20):
        with pytest.raises(ConfigError, match=f"{words}, e.g. qsgd:4, got 'qsgd:{s}'; fix compress="):
            monsoon.train("linear", "sync", 2, compress=f"qsgd:{s}", steps=2, evals=0)
        with pytest.raises(ConfigError, match=r"levels must be in \[1, 2147483647\]"):
            M.QSGD(s)
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = main(["train", "--problem", "linear", "--strategy", "sync", "--workers", "2",
                     "--compress", "qsgd:4294967296", "--steps", "2", "--out", str(tmp_path / "r")])
    assert (code, err.getvalue().strip()) == (2, f"monsoon: error: {words}, e.g. qsgd:4, got "
                                                 "'qsgd:4294967296'; fix --compress")
    assert not (tmp_path / "r").exists()


def test_powersgd_needs_matrices():
    with pytest.raises(ConfigError, match="matrix-shaped"):
        monsoon.train("linear", "sync", 2, compress="powersgd:2", steps=4, evals=0)


@pytest.mark.parametrize("engine", ["local", "sim"])
def test_compressed_easgd_moves_the_centre_and_the_worker_by_the_same_decoded_difference(engine):
    """One worker, one step, one exchange, topk:0.5 without error feedback,
    alpha 0.5, from x~ = x_1 = 0: after its step x_1 = s; it sends
    D = C(0.5 s), so x~ = D and x_1 = s - D. Where D is nonzero x~ = x_1
    (both moved by the same decoded difference); elsewhere x~ stayed 0."""
    extra = {"backend": "threads"} if engine == "local" else {}
    r = monsoon.train("linear", "easgd", 1, engine=engine, compress="topk:0.5",
                      no_error_feedback=True, steps=1, easgd_alpha=0.5, easgd_tau=1, evals=0,
                      **extra)
    centre, worker = r.params, r.worker_params[0]
    moved = np.flatnonzero(centre)
    k = math.ceil(0.5 * centre.size)
    assert len(moved) == k
    np.testing.assert_array_equal(centre[moved], worker[moved])
    rest = np.setdiff1d(np.arange(centre.size), moved)
    # the step s: what the worker kept where nothing was sent is s itself
    assert np.abs(worker[rest]).max() <= np.abs(2 * worker[moved]).min() + 1e-7
    assert r.summary["bytes_sent"] == k * 4 + M.index_bytes(k, centre.size)


@pytest.mark.parametrize("engine", ["local", "sim"])
def test_compressed_easgd_sends_fewer_bytes_and_still_trains(engine):
    extra = {"backend": "threads"} if engine == "local" else {}
    runs = {c: monsoon.train("linear", "easgd", 2, engine=engine, compress=c, steps=60,
                             easgd_tau=2, evals=2, seed=1, **extra)
            for c in ("none", "topk:0.2")}
    plain, comp = runs["none"].summary, runs["topk:0.2"].summary
    assert comp["bytes_sent"] * 3 < plain["bytes_sent"]
    assert comp["residual_norm"] > 0 and comp["updates"] == plain["updates"] > 0
    first = runs["topk:0.2"].history[0]["loss"]
    assert comp["final_loss"] < 0.5 * first  # the centre learned


@pytest.mark.parametrize("engine", ["local", "sim"])
@pytest.mark.parametrize("strategy", ["sync", "async", "local-sgd"])
def test_a_compressed_run_records_fewer_bytes(engine, strategy):
    extra = {"backend": "threads"} if engine == "local" else {}
    runs = {c: monsoon.train("linear", strategy, 2, engine=engine, compress=c, steps=40,
                             evals=0, seed=1, **extra).summary
            for c in ("none", "topk:0.1")}
    plain, comp = runs["none"], runs["topk:0.1"]
    assert plain["compression_ratio"] == 1.0 and plain["residual_norm"] == 0.0
    assert plain["bytes_sent"] == plain["bytes_sent_uncompressed"] > 0
    assert comp["bytes_sent_uncompressed"] == plain["bytes_sent_uncompressed"]
    assert comp["compression_ratio"] > 3
    assert comp["bytes_sent"] * 3 < plain["bytes_sent"]
    assert sum(comp["bytes_sent_per_worker"]) == comp["bytes_sent"]
    assert comp["bytes_received"] > 0 and comp["residual_norm"] > 0
    assert comp["compress"] == "topk:0.1" and comp["error_feedback"] is True
    assert comp["final_loss"] != plain["final_loss"]  # the math changed


def test_sim_charges_the_encoded_size_to_the_bandwidth():
    runs = {c: monsoon.train("linear", "sync", 4, engine="sim", compress=c, steps=40, evals=0,
                             sim_bandwidth=1e3).summary
            for c in ("none", "topk:0.01")}
    plain, comp = runs["none"], runs["topk:0.01"]
    # each step, the 4 workers send side by side (21 float32s: 84 bytes dense, 4 + 1 with one
    # 5-bit index), and the update comes back as their 4 encoded messages
    steps = plain["updates"]
    assert comp["bytes_sent"] == steps * 4 * 5 and plain["bytes_sent"] == steps * 4 * 84
    assert comp["bytes_received"] == steps * 4 * 20
    saved = steps * ((84 - 5) + (84 - 20)) / 1e3
    assert plain["wall_time_s"] - comp["wall_time_s"] == pytest.approx(saved, rel=1e-9)


def test_sync_topk_with_error_feedback_tracks_uncompressed_sync():
    runs = {c: monsoon.train("linear", "sync", 2, compress=c, epochs=5, evals=0, seed=0,
                             backend="threads").summary
            for c in ("none", "topk:0.1")}
    assert runs["topk:0.1"]["final_loss"] <= runs["none"]["final_loss"] * 1.02


@pytest.mark.parametrize("spec", ["none", "topk:0.03", "randk:0.05", "qsgd:4", "qsgd:1", "sign",
                                  "powersgd:2"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_the_wire_form_is_nbytes_long_and_decodes_as_the_sender_did(spec, dtype):
    """What ray, spark and torch move: ``Sender.pack``'s bytes, exactly the
    counted size, turned back by ``receive`` into the sender's decoded vector."""
    name, arg = M.parse(spec)
    comp = M.Compression(name, arg, True, ((0, 20, 25), (510, 7, 3)) if name == "powersgd" else ())
    packer, sender = M.Sender(comp, rank=2), M.Sender(comp, rank=2)  # the same state
    for seed in range(3):
        g = _v(531, seed).astype(dtype)
        wire = packer.pack(g)
        expected = sender.send(g)
        if comp.active:
            assert wire.dtype == np.uint8 and wire.nbytes == packer.last_nbytes
            assert packer.sent_bytes < packer.raw_bytes or name == "none"
        np.testing.assert_array_equal(M.receive(comp, wire, g.size, dtype), expected)
        np.testing.assert_array_equal(packer.residual, sender.residual)


@pytest.mark.parametrize("spec", ["topk:0.03", "randk:0.05", "qsgd:4", "sign", "powersgd:2"])
def test_a_non_finite_message_decodes_to_nan_and_keeps_the_residual(spec):
    name, arg = M.parse(spec)
    comp = M.Compression(name, arg, True, ((0, 20, 25),) if name == "powersgd" else ())
    sender = M.Sender(comp, rank=0)
    sender.send(_v(500))
    kept = sender.residual.copy()
    bad = _v(500, 1)
    bad[7] = np.nan
    assert not np.isfinite(M.receive(comp, sender.pack(bad), 500, np.float32)).all()
    np.testing.assert_array_equal(sender.residual, kept)


@pytest.mark.slow
def test_digits_powersgd_rank_2_keeps_the_validation_loss_with_a_tenth_of_the_bytes():
    """Issue 33, acceptance 2 (digits part), at the defaults of the docs'
    command: sync, 4 workers, powersgd:2 with error feedback ends within 1% of
    uncompressed sync's validation loss and sends at least 10x fewer bytes.
    (The rcv1-like part takes minutes: docs/compression.md records it.)"""
    # on threads: sync's values (the losses, the bytes) are the processes
    # backend's to the bit, without 4 worker processes on the suite's 2 cores
    runs = {c: monsoon.train("digits", "sync", 4, compress=c, progress=False,
                             backend="threads").summary
            for c in ("none", "powersgd:2")}
    plain, comp = runs["none"], runs["powersgd:2"]
    assert comp["val_loss"] <= plain["val_loss"] * 1.01
    assert plain["bytes_sent"] >= 10 * comp["bytes_sent"]


def test_compare_sets_a_compressor_per_strategy_and_reports_the_bytes(tmp_path):
    from monsoon.compare import compare

    c = compare("linear", ["sync", "local-sgd", "async"], 2, out=tmp_path, steps=20,
                compress="sync=topk:0.1,local-sgd=sign", progress=False, backend="threads")
    rows = {r["strategy"]: r for r in c.rows}
    assert rows["sync"]["compress"] == "topk:0.1" and rows["local-sgd"]["compress"] == "sign"
    assert rows["async"]["compress"] == "none" and rows["async"]["compression_ratio"] == 1.0
    assert rows["sync"]["compression_ratio"] > 3 and rows["local-sgd"]["compression_ratio"] > 3
    csv = (tmp_path / "comparison.csv").read_text().splitlines()
    assert "compress,bytes_sent,compression_ratio,residual_norm" in csv[0]
    report = (tmp_path / "report.md").read_text()
    assert "sync (topk:0.1)" in report and "sync computes the same gradient" not in report
    with pytest.raises(ConfigError, match="not in --strategies"):
        compare("linear", ["sync"], 2, out=tmp_path, steps=2, compress="async=sign")


def test_metrics_csv_carries_the_bytes_sent_at_each_row(tmp_path):
    from monsoon.record.run_folder import read_metrics

    run = monsoon.train("linear", "sync", 2, compress="topk:0.1", epochs=2, seed=0,
                        backend="threads", out=tmp_path / "run")
    rows = read_metrics(tmp_path / "run" / "metrics.csv")
    sent = [r["bytes_sent"] for r in rows]
    assert sent[0] == 0 and sent == sorted(sent)
    assert sent[-1] == run.summary["bytes_sent"] and rows[-1]["updates"] == run.summary["updates"]
    plain = monsoon.train("linear", "sync", 2, epochs=2, seed=0, backend="threads")
    assert plain.summary["bytes_sent"] > sent[-1] * 3
    assert plain.summary["compression_ratio"] == 1.0


def test_a_late_message_that_backup_workers_drop_leaves_its_senders_residual_as_before(
        monkeypatch):
    """Sync with a backup worker on the sim: each step takes the first 2 of
    3 contributions, and worker 2's arrives last every step. Its messages
    are dropped, so error feedback must not keep their residual (the
    residual of a message nobody applied would lose what it withheld): its
    sender ends as it began, no residual and its random stream unmoved,
    though its bytes stay counted."""
    from monsoon.engines.sim import engine as sim

    senders = {}

    class Kept(M.Sender):
        def __init__(self, compression, rank=0):
            super().__init__(compression, rank)
            senders[rank] = self

    monkeypatch.setattr(sim, "Sender", Kept)
    run = monsoon.train("logistic", "sync", 2, backup_workers=1, engine="sim", steps=20,
                        batch_size=30, compress="randk:0.2", lr=0.5, seed=2, dtype="float64",
                        evals=0)
    assert run.summary["late_gradients"] == 20 and senders[2].messages == 20
    late, fresh = senders[2], M.Sender(senders[2].compression, 2)
    assert late.residual is None
    for name, value in fresh.compressor.state().items():
        assert np.array_equal(late.compressor.state()[name], value), name
    assert all(np.linalg.norm(senders[k].residual) > 0 for k in (0, 1))
    assert run.summary["residual_norm"] == pytest.approx(
        math.hypot(*(np.linalg.norm(senders[k].residual) for k in (0, 1))))

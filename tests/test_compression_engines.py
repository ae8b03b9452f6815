"""Compressed runs on the engines that move bytes (ray, spark, torch): each
completes, records the bytes each worker sent and received, and sends fewer
than the uncompressed run; a compressed sync run takes the same steps as the
local engine's (the receiver decodes the worker's packed message to the
vector the local engine's worker hands over)."""
import numpy as np
import pytest

import monsoon
from spark_env import spark  # noqa: F401 - the module's Spark session (a fixture)


def _both(engine, strategy, spec="topk:0.1", workers=2, **kw):
    runs = {c: monsoon.train("linear", strategy, workers, engine=engine, compress=c, seed=1,
                             evals=0, **kw)
            for c in ("none", spec)}
    _check_pair(runs["none"].summary, runs[spec].summary, spec, workers)
    return runs


def _check_pair(plain, comp, spec, workers):
    """The summaries of an uncompressed and a compressed run of the same budget."""
    assert plain["compression_ratio"] == 1.0 and plain["residual_norm"] == 0.0
    assert plain["bytes_sent"] == plain["bytes_sent_uncompressed"] > 0
    assert comp["compress"] == spec and comp["error_feedback"] is True
    assert comp["bytes_sent_uncompressed"] == plain["bytes_sent_uncompressed"]
    assert comp["bytes_sent"] * 3 < plain["bytes_sent"]
    assert len(comp["bytes_sent_per_worker"]) == workers
    assert sum(comp["bytes_sent_per_worker"]) == comp["bytes_sent"]
    assert comp["bytes_received"] > 0 and comp["residual_norm"] > 0
    assert comp["updates"] > 0 and np.isfinite(comp["final_loss"])


def _local_twin(strategy, spec, **kw):
    return monsoon.train("linear", strategy, 2, compress=spec, seed=1, evals=0,
                         backend="threads", **kw)


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.timeout(300)  # a cluster's start and several runs, on a busy machine
@pytest.mark.usefixtures("local_ray")
@pytest.mark.parametrize("strategy", ["sync", "async", "local-sgd", "easgd"])
def test_ray_sends_the_packed_message(strategy):
    # sync: a shard a worker, each decoding its slice of the packed message, and
    # the uncompressed run on Ray too (its accounting over two shards)
    if strategy == "sync":
        runs = _both("ray", strategy, steps=40, shards=2)
        twin = _local_twin("sync", "topk:0.1", steps=40)
        np.testing.assert_allclose(runs["topk:0.1"].params, twin.params, rtol=1e-6, atol=1e-7)
        assert runs["topk:0.1"].summary["bytes_sent"] == twin.summary["bytes_sent"]
        return
    # the others: one shard (the same decoding, two actors fewer), and the uncompressed
    # run on the local engine, which counts the same messages in the same bytes
    # (messages.py) and starts no actors
    comp = monsoon.train("linear", strategy, 2, engine="ray", compress="topk:0.1", seed=1,
                         evals=0, steps=40, shards=1)
    _check_pair(_local_twin(strategy, "none", steps=40).summary, comp.summary, "topk:0.1", 2)


@pytest.mark.torchrun
@pytest.mark.slow
@pytest.mark.timeout(300)  # a cluster's start and several runs, on a busy machine
@pytest.mark.parametrize("strategy", ["sync", "local-sgd", "easgd"])
def test_torch_all_gathers_the_packed_messages(strategy):
    runs = _both("torch", strategy, steps=30, timeout=60, progress=False)
    comp = runs["topk:0.1"].summary
    assert comp["reduce_via"] == "gloo"  # compressed: the backend's all-gather, not shm
    assert comp["bytes_received"] == comp["bytes_sent"]  # 2 ranks: each gets the other's
    if strategy == "sync":
        twin = _local_twin("sync", "topk:0.1", steps=30)
        np.testing.assert_allclose(runs["topk:0.1"].params, twin.params, rtol=1e-5, atol=1e-6)
        assert comp["bytes_sent"] == twin.summary["bytes_sent"]


@pytest.mark.spark
@pytest.mark.slow
@pytest.mark.timeout(300)  # a cluster's start and several runs, on a busy machine
@pytest.mark.parametrize("strategy, kw", [("async", {"n_push": 4, "n_fetch": 4}),
                                          ("local-sgd", {}), ("easgd", {"easgd_tau": 4})])
def test_spark_tasks_return_the_packed_message(spark, strategy, kw):  # noqa: F811
    _both("spark", strategy, steps=40, **kw)


@pytest.mark.spark
def test_spark_refuses_to_compress_sync_whose_workers_send_no_message(spark):  # noqa: F811
    """The refusal said sync's workers ran on the driver; its default path is
    a barrier stage whose tasks all-reduce their partitions' sums."""
    from monsoon.errors import ConfigError

    with pytest.raises(ConfigError, match="all-reduced among their tasks in one barrier stage "
                                          r"\(or gathered on the driver"):
        monsoon.train("linear", "sync", 2, engine="spark", compress="topk:0.1", steps=2)

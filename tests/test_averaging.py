"""Tail averaging of a server's parameters (``server/averaging.py``)."""
import numpy as np
import pytest

from monsoon.server.averaging import TailAverage


def test_the_average_is_the_first_iterate_then_a_convex_combination():
    avg = TailAverage(np.zeros(3), horizon_examples=100)
    avg.update(np.array([1.0, 2.0, 3.0]), 10)
    np.testing.assert_array_equal(avg.params, [1.0, 2.0, 3.0])  # no lag behind the start
    iterates = [np.full(3, float(v)) for v in range(2, 40)]
    for w in iterates:
        avg.update(w, 10)
        assert 1.0 <= avg.params[0] <= w[0]  # within the iterates so far


def test_it_averages_the_last_half_of_a_short_run_and_the_last_horizon_of_a_long_one():
    avg = TailAverage(np.zeros(1), horizon_examples=1000)
    for t in range(1, 41):  # w_t = t, 10 examples each: 400 < 2 x 1000
        avg.update(np.array([float(t)]), 10)
    # weight 10 / (seen / 2): about the mean of the last half, 20..40
    assert 25 < avg.params[0] < 35
    for t in range(41, 2001):
        avg.update(np.array([float(t)]), 10)
    # an exponential moving average over ~1000 examples = 100 iterates: lags ~100 behind
    assert 2000 - 130 < avg.params[0] < 2000 - 70


def test_an_iterate_wandering_around_the_minimum_averages_to_it():
    rng = np.random.default_rng(0)
    avg = TailAverage(np.zeros(50), horizon_examples=2000)
    for _ in range(3000):
        w = 1.0 + 0.3 * rng.standard_normal(50)  # the last iterate: 0.3 off, each coordinate
        avg.update(w, 10)
    assert np.abs(avg.params - 1.0).max() < 0.1
    assert np.abs(w - 1.0).max() > 0.5


def test_a_horizon_of_nothing_is_refused():
    with pytest.raises(ValueError, match="horizon"):
        TailAverage(np.zeros(2), 0)

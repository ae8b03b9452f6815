"""Which examples each worker visits: the plans are pure functions of the seed."""
import numpy as np
import pytest

from monsoon.strategies.batches import (Budget, epoch_permutation, global_batches, permutation,
                                        shard_batches, slice_batches, split)


def test_permutation_is_numpys_order_in_half_the_memory():
    for n in (0, 1, 7, 100_003):
        rng_seed = [3, n]
        mine = permutation(n, np.random.default_rng(rng_seed))
        assert mine.dtype == np.int32  # 4 bytes an example a worker holds, not 8
        np.testing.assert_array_equal(mine, np.random.default_rng(rng_seed).permutation(n))
    np.testing.assert_array_equal(epoch_permutation(1000, 5, 2),
                                  np.random.default_rng([5, 2]).permutation(1000))


@pytest.mark.parametrize("n,batch_size,workers,steps", [
    (481, 32, 1, None), (482, 32, 2, None), (10, 4, 3, None), (97, 10, 4, None),
    (97, 10, 4, 3), (97, 10, 4, 40), (50, 7, 3, 5)])
def test_pass_sizes_are_the_sizes_the_plans_hand_a_gradient(n, batch_size, workers, steps):
    """``Strategy.pass_sizes`` (what ``config`` refuses a BatchNorm model
    by) is read off the plans themselves: every size a worker's Gradient
    takes, and none it never takes."""
    from monsoon.strategies import STRATEGIES

    budget = Budget(epochs=None if steps else 2, steps=steps)
    plans = {"sync": lambda k: (split(b, workers, k)
                                for b in global_batches(n, batch_size, 0, budget)),
             "hogwild": lambda k: slice_batches(n, batch_size, 0, budget, k, workers),
             "async": lambda k: shard_batches(n, batch_size, 0, budget, k, workers)}
    for name, plan in plans.items():
        seen = {len(b) for k in range(workers) for b in plan(k)} - {0}
        assert STRATEGIES.get(name)().pass_sizes(workers, batch_size, n, steps) == seen, name

"""Which examples each worker visits: the plans are pure functions of the seed."""
import numpy as np

from monsoon.strategies.batches import epoch_permutation, permutation


def test_permutation_is_numpys_order_in_half_the_memory():
    for n in (0, 1, 7, 100_003):
        rng_seed = [3, n]
        mine = permutation(n, np.random.default_rng(rng_seed))
        assert mine.dtype == np.int32  # 4 bytes an example a worker holds, not 8
        np.testing.assert_array_equal(mine, np.random.default_rng(rng_seed).permutation(n))
    np.testing.assert_array_equal(epoch_permutation(1000, 5, 2),
                                  np.random.default_rng([5, 2]).permutation(1000))

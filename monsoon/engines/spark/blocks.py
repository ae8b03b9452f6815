"""A partition's data on an executor: one ``Block`` per Spark partition.

A block holds the problem restricted to its partition's rows (so a
gradient never touches another partition's data), and ``ids``, the
global example ids of those rows, sorted, so the driver can name a global
batch and each partition finds its own members of it. The block RDD is
built once per run (``mapPartitionsWithIndex``) and persisted, so a
partition's data stays with its shard and is converted once.

Catalog problems are cut into the same shards ``shard_batches`` gives the
local and Ray engines' workers (a random part of the data drawn once from
the seed, sorted), so worker k of an async run visits exactly the batches
it visits there. A problem that ``restrict`` does not know is shipped
whole with its rows' ids (correct, but every partition then carries all
the data): ``DenseLinear``, ``SparseLinear`` and array-backed
``TorchProblem`` are restricted to their rows.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass

import numpy as np


@dataclass
class Block:
    index: int                 # the partition (= the worker's rank)
    problem: object            # gradients on this partition's rows
    ids: np.ndarray            # global example ids of the rows, sorted
    rows: np.ndarray | None = None  # the problem's row for each id (None: 0..n-1)

    @property
    def n(self) -> int:
        return len(self.ids)

    def local(self, batch: np.ndarray | None) -> np.ndarray:
        """This partition's rows among the global ids ``batch`` (None: all
        rows), in the batch's order, as the problem's row numbers."""
        if batch is None:
            found = np.arange(self.n)
        else:
            pos = np.searchsorted(self.ids, batch)
            pos[pos == self.n] = 0
            found = pos[self.ids[pos] == batch] if self.n else pos[:0]
        return found if self.rows is None else self.rows[found]

    def rows_of(self, local: np.ndarray) -> np.ndarray:
        """The problem's rows for this block's local positions 0..n-1."""
        return local if self.rows is None else self.rows[local]


def restrict(problem, rows: np.ndarray):
    """``problem`` restricted to ``rows`` (a copy holding only those
    examples, with the same model and global statistics), or None where
    monsoon does not know how to cut this kind of problem."""
    from ...problems.linear import DenseLinear
    from ...problems.sparse_linear import SparseLinear

    if type(problem) in (DenseLinear, SparseLinear):
        part = copy.copy(problem)  # inv_degree stays the full data's (the split L2)
        part.X, part.y = problem.X[rows], problem.y[rows]
        part.n_examples = len(rows)
        part._grad = np.zeros_like(problem._grad)
        part._kernel_ready = False
        return part
    if not problem.uses_torch:
        return None
    from ...problems.torch_model import TorchModel
    from ...problems.torch_problem import TorchProblem

    if type(problem) in (TorchModel, TorchProblem) and getattr(problem, "X", None) is not None:
        state = problem.__getstate__()
        index = torch_index(rows)
        state.update(X=problem.X.index_select(0, index), y=problem.y.index_select(0, index),
                     val=None, n_examples=len(rows), _shm=None, _share_pickles=False)
        part = type(problem).__new__(type(problem))
        part.__setstate__(state)
        return part
    return None


def torch_index(rows):
    import torch

    return torch.from_numpy(np.ascontiguousarray(rows, dtype=np.int64))


def shard_ids(n: int, workers: int, seed: int) -> list[np.ndarray]:
    """Worker k's examples, as ``shard_batches`` draws them (sorted)."""
    from ...strategies.batches import split

    perm = np.random.default_rng([seed, 1 << 30]).permutation(n)
    return [np.sort(split(perm, workers, k)) for k in range(workers)]


def problem_blocks(sc, problem, workers: int, seed: int):
    """An RDD of ``workers`` partitions, partition k holding the Block of
    worker k's shard of a driver-side problem (parallelized once)."""
    blocks = []
    for k, ids in enumerate(shard_ids(problem.n_examples, workers, seed)):
        part = restrict(problem, ids)
        blocks.append(Block(k, part, ids) if part is not None
                      else Block(k, problem, ids, rows=ids))
    return sc.parallelize(blocks, workers)

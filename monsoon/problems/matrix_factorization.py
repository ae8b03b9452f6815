"""MatrixFactorization: rank-k factors L (users x k) and R (items x k) from
(user, item, rating) triples, Hogwild!'s other experiment (Netflix, KDD Cup).

For a rating (u, i, r), e = r - L_u . R_i, and with the L2 term split by
degree (d_u ratings by user u, d_i ratings of item i), per-example SGD is

    L_u <- L_u + lr (e R_i - lam L_u / d_u)
    R_i <- R_i + lr (e L_u - lam R_i / d_i)        (both from the old values)

The objective is mean_r (r - L_u.R_i)^2 / 2 + (lam / 2n)(sum |L_u|^2 + sum |R_i|^2).
Parameters are L then R, flattened row by row.

The learning rate is that per-example step (``MF_DEFAULTS``: lr 0.05, the
compiled loop's). A mini-batch gradient is the batch's mean, so a row the
batch touches once moves 1/m of that step: a run of plain SGD that takes
mini-batch steps (sync, async, ...) at the default lr starts at lr x batch
size instead (``"lr_per_example"``; ``config.resolve``), and each rating
moves its rows as one per-example step does (the linear scaling rule, exact
for a row a batch touches once). A given ``--lr`` is used as given, and
another rule takes 0.05 (AdaGrad's and Adam's steps do not grow with the
gradient). ``constant_loss``: predicting the mean rating, half its variance.
"""
from __future__ import annotations

import numpy as np

from .base import SharedDataProblem

# lr: the per-example step, taken by mini-batch SGD times the batch size
MF_DEFAULTS = {"lr": 0.05, "epochs": 10, "batch_size": 64, "lr_per_example": True}


class MatrixFactorization(SharedDataProblem):
    defaults = MF_DEFAULTS  # a problem built here trains with them too
    data_fields = ("users", "items", "ratings")

    def __init__(self, users, items, ratings, rank: int = 10, lam: float = 0.05,
                 dtype="float64", name: str = "matrix-factorization", init_scale: float = 0.1,
                 user_ids=None, item_ids=None):
        users = np.asarray(users, dtype=np.int64)
        items = np.asarray(items, dtype=np.int64)
        ratings = np.asarray(ratings, dtype=dtype)
        if not (len(users) == len(items) == len(ratings)) or len(ratings) == 0:
            raise ValueError(f"users, items and ratings must be non-empty and equally long "
                             f"(got {len(users)}, {len(items)}, {len(ratings)})")
        if rank < 1:
            raise ValueError(f"rank must be at least 1, got {rank}")
        perm = np.random.default_rng(20111).permutation(len(ratings))  # stored shuffled
        self.users, self.items, self.ratings = users[perm], items[perm], ratings[perm]
        self.n_users, self.n_items = int(users.max()) + 1, int(items.max()) + 1
        self.rank, self.lam, self.name = int(rank), float(lam), name
        self.init_scale = init_scale
        self.dtype = self.ratings.dtype
        self.n_examples = len(ratings)
        self.n_params = (self.n_users + self.n_items) * self.rank
        # the data's own ids of each user's and item's row (a rating file's), or None
        self.user_ids = _ids("user", user_ids, self.n_users)
        self.item_ids = _ids("item", item_ids, self.n_items)
        self.inv_user_degree = 1.0 / np.maximum(np.bincount(self.users, minlength=self.n_users), 1)
        self.inv_item_degree = 1.0 / np.maximum(np.bincount(self.items, minlength=self.n_items), 1)
        self._grad = np.zeros(self.n_params, dtype=self.dtype)
        self._kernel_ready = False

    def row_ids(self) -> dict:
        """The data's ids of the factors' rows, by file name (``row_ids``):
        line k of user_ids.txt is the user of L's row k, of item_ids.txt
        the item of R's row k; none for data without ids (mf-synthetic)."""
        return {f"{kind}_ids.txt": ids for kind, ids in (("user", self.user_ids),
                                                          ("item", self.item_ids))
                if ids is not None}

    def factors(self, w):
        split = self.n_users * self.rank
        return (w[:split].reshape(self.n_users, self.rank),
                w[split:].reshape(self.n_items, self.rank))

    def initial_params(self, seed: int) -> np.ndarray:
        rng = np.random.default_rng([seed, 99])
        return (rng.standard_normal(self.n_params) * self.init_scale).astype(self.dtype)

    def predict(self, w, users, items):
        L, R = self.factors(w)
        return np.einsum("ij,ij->i", L[users], R[items])

    def rmse(self, w) -> float:
        err = self.ratings - self.predict(w, self.users, self.items)
        return float(np.sqrt(np.mean(err * err)))

    def constant_loss(self) -> float:
        """The loss of predicting the mean rating for every pair, half the
        ratings' variance (``constant_loss``; factors that predict it add
        their L2 term on top)."""
        return float(0.5 * np.var(self.ratings, dtype=np.float64))

    def loss(self, w) -> float:
        err = self.ratings - self.predict(w, self.users, self.items)
        L, R = self.factors(w)
        return float(0.5 * np.mean(err * err)
                     + 0.5 * self.lam * (np.sum(L * L) + np.sum(R * R)) / self.n_examples)

    def gradient(self, w, indices, out=None, accumulate=False):
        u, i, r = self.users[indices], self.items[indices], self.ratings[indices]
        L, R = self.factors(w)
        e = r - np.einsum("ij,ij->i", L[u], R[i])
        g = self._grad if out is None or accumulate else out
        g.fill(0)
        gL, gR = self.factors(g)
        np.add.at(gL, u, -e[:, None] * R[i] + self.lam * L[u] * self.inv_user_degree[u][:, None])
        np.add.at(gR, i, -e[:, None] * L[u] + self.lam * R[i] * self.inv_item_degree[i][:, None])
        m = len(indices)
        g /= m
        loss = 0.5 * float(e @ e) / m + 0.5 * self.lam * float(
            (np.sum(L[u] ** 2, axis=1) * self.inv_user_degree[u]).sum()
            + (np.sum(R[i] ** 2, axis=1) * self.inv_item_degree[i]).sum()) / m
        if out is not None and accumulate:
            out += g
            return loss, out
        return loss, g

    # -- the compiled per-rating path (Hogwild!, serial) -------------------------
    def sgd_pass(self, w, order, lr: float) -> float:
        from .kernels import mf_sgd_pass

        order = np.ascontiguousarray(order, dtype=np.int64)
        total = mf_sgd_pass(self.users, self.items, self.ratings, w, self.n_users, self.rank,
                            order, lr, self.lam, self.inv_user_degree, self.inv_item_degree)
        return total / max(len(order), 1)

    def prepare_kernel(self) -> None:
        if not self._kernel_ready:
            self.sgd_pass(self.initial_params(0), np.empty(0, dtype=np.int64), 0.0)
            self._kernel_ready = True


def _ids(kind: str, ids, count: int):
    """``ids`` as a list of strings, one a row, or None; refused unless
    there is one for each of the ``count`` rows."""
    if ids is None:
        return None
    ids = [str(i) for i in ids]
    if len(ids) != count:
        raise ValueError(f"{kind}_ids must hold one id for each of the {count} {kind}s "
                         f"(index 0..{count - 1}), not {len(ids)}")
    return ids


def mf_synthetic(users: int = 2000, items: int = 1000, ratings: int = 200_000, rank: int = 5,
                 noise: float = 0.1, seed: int = 0, dtype="float64", lam: float = 0.05,
                 model_rank: int | None = None) -> MatrixFactorization:
    """Ratings from a planted rank-``rank`` model plus Gaussian noise."""
    rng = np.random.default_rng([seed, 77])
    L = rng.standard_normal((users, rank)) / rank ** 0.25
    R = rng.standard_normal((items, rank)) / rank ** 0.25
    u = rng.integers(0, users, ratings)
    i = rng.integers(0, items, ratings)
    r = np.einsum("ij,ij->i", L[u], R[i]) + noise * rng.standard_normal(ratings)
    return MatrixFactorization(u, i, r, rank=model_rank or rank, lam=lam, dtype=dtype,
                               name="mf-synthetic")

"""Power-law sparse data for the scikit-learn estimators' tests: Zipf feature
popularity (feature ids scattered), rows L2-normalised, labels from a
planted model through a logistic link (as bench/hogwild_sweep.py's)."""
import numpy as np
import scipy.sparse as sp


def power_law(rows, features, nnz, exponent=1.1, seed=0, dtype=np.float64):
    rng = np.random.default_rng([seed, rows, features, nnz])
    popularity = np.arange(1, features + 1, dtype=float) ** -exponent
    popularity /= popularity.sum()
    ids = rng.permutation(features)
    counts = np.clip(rng.poisson(nnz, rows), 1, features)
    indptr = np.concatenate([[0], np.cumsum(counts)])
    cols = ids[rng.choice(features, size=int(indptr[-1]), p=popularity)]
    X = sp.csr_matrix((np.ones(len(cols)), cols, indptr), shape=(rows, features))
    X.sum_duplicates()
    X.data = np.log1p(X.data)
    norms = np.sqrt(np.asarray(X.multiply(X).sum(axis=1)).ravel())
    X = sp.csr_matrix(sp.diags(1.0 / np.maximum(norms, 1e-12)) @ X, dtype=dtype)
    w = rng.standard_normal(features) * rng.random(features) ** 4 * 4
    margin = X @ w
    margin = (margin - np.median(margin)) / (margin.std() + 1e-12) * 3
    y = (rng.random(rows) < 1 / (1 + np.exp(-margin))).astype(int)
    return X, y

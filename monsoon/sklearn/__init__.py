"""scikit-learn's SGDClassifier and SGDRegressor, trained by Hogwild! on all
your cores: change the class name and nothing else.

``HogwildClassifier`` and ``HogwildRegressor`` take scikit-learn's
constructor parameters under the same names, meanings and defaults (loss,
penalty/l1_ratio, alpha, fit_intercept, max_iter, tol, n_iter_no_change,
the learning_rate schedules with eta0 and power_t, class_weight,
warm_start, average, early_stopping, validation_fraction, shuffle, verbose,
random_state, n_jobs) and fit the same model: scikit-learn's per-example SGD
(``kernel``: the exact update rule, penalty by weight scaling, truncated L1,
ASGD) run by ``n_jobs`` threads that share the weights without locks (Niu,
Recht, Re and Wright, "Hogwild!", NIPS 2011), sharing
the intercept and the average weights without races (``kernel``'s module
doc says which state is raced and which is not). ``n_jobs`` is a ceiling: a
fit times an epoch on the threads against one on a single thread and runs
the faster (``plain_sgd.LayoutChooser``; ``layout_`` says which it chose;
"one-vs-rest" beyond two classes, each class on one thread),
because on power-law data threads that write the same hot weights can be
slower than one. A parameter value they cannot honour is refused with a
message saying so.

Invariants: ``n_jobs=1`` runs scikit-learn's update sequence in its
order (its shuffle, from the same seed: the fitted coefficients equal
SGDClassifier's to rounding); the data are read in place (CSR float64/float32 or C-ordered
dense), never copied, converted or re-sorted by the fit.

Needs scikit-learn 1.8 or newer; an older one is refused on import, in
one line (``require_sklearn``).
"""
import re
import sys

import sklearn

# the scikit-learn whose private methods ``estimators`` overrides
# (``_fit_binary``, ``_fit_regressor``, ``_prepare_fit_binary``) take the
# arguments they are written for
SKLEARN_NEEDED = (1, 8)
SKLEARN_PYTHON = (3, 11)  # the oldest Python scikit-learn 1.8 installs on


def require_sklearn(version: str, python: tuple = sys.version_info[:2]) -> None:
    """Refuse a scikit-learn older than ``SKLEARN_NEEDED`` in one line, on
    import: its fits would call the overrides with other arguments and fail
    mid-fit with a TypeError. The fix it names: the pip command, or on a
    Python older than scikit-learn 1.8 supports, a newer Python."""
    if tuple(int(part) for part in re.findall(r"\d+", version)[:2]) < SKLEARN_NEEDED:
        needed = ".".join(map(str, SKLEARN_NEEDED))
        fix = (f"pip install 'scikit-learn>={needed}'" if python >= SKLEARN_PYTHON else
               f"scikit-learn {needed} needs Python {'.'.join(map(str, SKLEARN_PYTHON))} or "
               f"newer, and this is Python {'.'.join(map(str, python))}")
        raise ImportError(f"monsoon.sklearn needs scikit-learn >= {needed}, and {version} is "
                          f"installed: {fix}")


require_sklearn(sklearn.__version__)

from .estimators import HogwildClassifier, HogwildRegressor  # noqa: E402

__all__ = ["HogwildClassifier", "HogwildRegressor"]

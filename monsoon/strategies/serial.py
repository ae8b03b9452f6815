"""Serial mini-batch SGD: the baseline and the oracle.

One worker, the loop every other strategy is measured against:

    for each batch of each epoch's permutation:
        loss, g = gradient(w, batch);  rule.apply(w, g)

``sync`` must reproduce it exactly; Hogwild! with one worker is it. On a
problem with a compiled per-example loop (sparse), the local engine runs
that loop instead, as for Hogwild! (one update per example, unless
``--batch-size`` is given); the summary says ``per_example_loop``.
"""
from ..errors import ConfigError
from .hogwild import Hogwild


class Serial(Hogwild):
    name = "serial"
    single_worker = True
    full_batch_steps = True
    buffers = "rank0"

    def validate(self, workers, batch_size, n_examples):
        if workers != 1:
            raise ConfigError(f"serial runs exactly 1 worker, not {workers}; "
                              "drop --workers or pick another strategy")
        super().validate(workers, batch_size, n_examples)

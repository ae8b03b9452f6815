"""How the workers' buffers become the trained model's (BatchNorm's running
statistics and counter, or any other ``register_buffer``).

Buffers are not gradients: each worker's forward passes in training mode
update its own module's buffers. At the end of a run the engine hands back
each worker's buffers (``Problem.state()``), and the strategy's ``buffers``
rule makes one set of them:

- ``"rank0"`` (``serial``, ``sync``): worker 0's, as PyTorch DDP does with
  ``broadcast_buffers=True`` (rank 0's buffers are broadcast before every
  forward, so every replica holds rank 0's: updated by rank 0's batches at
  the synchronised parameters). Exact: DDP's rank 0 ends with the same
  buffers (tests/test_user_model.py).
- ``"average"`` (``async``, ``hogwild``, ``local-sgd``, ``easgd``): the
  mean over the workers that finished, for floating-point buffers (each
  worker's running statistics describe the same data distribution near the
  same parameters); integer buffers (``num_batches_tracked``) take the
  largest. This is the parameter rule of local SGD applied to buffers.

Known weakness (async, hogwild): a worker that finishes its share early
holds statistics of older parameters, and the mean mixes them in. A CI run
of hogwild on threads once returned buffers whose eval loss was 9x that of
statistics recomputed at the final parameters. Better rules to try: the
last worker to finish, or recomputing the statistics after the run (SWA's
``update_bn``).

The ``sim`` engine computes every virtual worker's gradient on one module,
so its buffers follow every worker's batches in virtual-time order; the
serial strategy on the local engine runs on the problem itself. Both leave
the buffers in the problem, and no combining is needed.

The local engine's curve rows: each worker copies its buffers (``flat``)
into a shared slot after a gradient (at most every
``runtime.BUFFERS_EVERY_S``), and the monitor combines the slots by the
same rule when it takes a row; the recorder evaluates the row with them
(``Recorder.settled_rows``). Its checkpoints hold them combined by the
same rule too (``engines/local/checkpointing.py``).
"""
from __future__ import annotations

import numpy as np

RULES = ("rank0", "average")


def combine(states: dict, rule: str) -> dict | None:
    """One set of buffers from ``{rank: state}`` by ``rule``."""
    states = {r: s for r, s in states.items() if s}
    if not states:
        return None
    if rule == "rank0":
        return states[min(states)]
    if rule != "average":
        raise ValueError(f"unknown buffer rule {rule!r}; choose one of: {', '.join(RULES)}")
    ranks = sorted(states)
    out = {}
    for name, first in states[ranks[0]].items():
        values = [np.asarray(states[r][name]) for r in ranks]
        if np.issubdtype(first.dtype, np.floating):
            out[name] = np.mean(values, axis=0).astype(first.dtype)
        else:
            out[name] = np.max(values, axis=0)
    return out


def flat(state: dict | None) -> np.ndarray | None:
    """``state``'s buffers end to end, as float64 (exact for float32 and
    for counters below 2**53): the form a worker's shared slot holds (the
    local engine's curve rows, ``store.py``); None for no buffers."""
    if not state or not isinstance(state, dict):  # a plug-in's other form: no slots
        return None
    return np.concatenate([np.asarray(v, dtype=np.float64).ravel() for v in state.values()])


def unflat(row: np.ndarray, template: dict) -> dict:
    """The buffers ``row`` (``flat``'s form) holds, named and shaped as
    ``template``'s."""
    out, at = {}, 0
    for name, like in template.items():
        like = np.asarray(like)
        out[name] = row[at:at + like.size].reshape(like.shape).astype(like.dtype)
        at += like.size
    return out

"""TorchProblem: the public name of a torch model as a problem, and where its
data may live.

    TorchProblem(module, loss_fn, X, y)                  tensors in memory
    TorchProblem.from_dataset(dataset, module, loss_fn)  a map-style Dataset
    TorchProblem.from_spark(df, module, loss_fn)         rows held in Spark

The model side (one flat parameter vector, devices, precision, buffers,
evaluation) is ``torch_model.TorchModel``; the Dataset and Spark problems
extend it (``dataset_problem.py``, ``spark_torch_data.py``). This module
sits above all three, so that none of them imports it: the problems' imports
form no circle. ``isinstance(p, TorchModel)`` holds for every torch problem;
``isinstance(p, TorchProblem)`` for one on tensors in memory.
"""
from __future__ import annotations

from .torch_model import TorchModel


class TorchProblem(TorchModel):
    """Train ``module`` on ``(X, y)`` under ``loss_fn(output, target)``, which
    must return the mean over the batch (the default of torch's losses)."""

    def __init__(self, module, loss_fn, X, y, **options):
        super().__init__(module, loss_fn, X, y, **options)
        self._probe("X", self.X[:2], self.y[:2])  # a module that does not fit: refused now
        if self.val is not None and len(self.val[0]):
            self._probe("the validation set's X", self.val[0][:2], self.val[1][:2])

    @classmethod
    def from_spark(cls, source, module, loss_fn, features="features", label="label",
                   **options):
        """A problem on data held in Spark (a DataFrame, an RDD, a path Spark
        reads) that trains with ``engine="spark"``, each partition's rows
        tensors on its executor; see ``spark_torch_data.py``."""
        from .spark_torch_data import SparkTorchData

        return SparkTorchData(source, module, loss_fn, features=features, label=label,
                              **options)

    @classmethod
    def from_dataset(cls, dataset, module, loss_fn, collate_fn=None, **options):
        """A problem over any map-style ``torch.utils.data.Dataset`` whose
        items ``collate_fn`` (default: torch's ``default_collate``) batches
        into ``(inputs, targets)``; see ``dataset_problem.DatasetProblem``."""
        from .dataset_problem import DatasetProblem

        return DatasetProblem(module, loss_fn, dataset, collate_fn=collate_fn, **options)

"""A run on a NumPy problem never imports torch (about 2 s here), in the
parent or in its workers' fork server: ``import monsoon`` loads torch only
for torch problems, and the live series' event files are written without
tensorboardX (which imports torch); the spark engine's checks of a NumPy
problem (executors, a torch model's fewest rows, a partition's problem)
read whether it computes with torch (``uses_torch``) without importing it. Building ``digits`` never imports
scikit-learn (about a second): it reads the file scikit-learn ships, and
gets exactly what ``load_digits`` gives.

matplotlib (about 0.4 s) is imported only by the process that draws a run
folder's PNGs, and never through pyplot: ``import monsoon``, building a
NumPy problem and every worker's entry module load none of it, and a
user's pyplot backend and open figures outlive a run that draws."""
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]

SCRIPT = """
import sys
import monsoon
assert "torch" not in sys.modules, "import monsoon imported torch"
run = monsoon.train("logistic", "sync", 2, steps=20, out=sys.argv[1], progress=False,
                    backend="processes")
assert run.summary["status"] == "finished"
assert list((__import__("pathlib").Path(sys.argv[1]) / "tb").glob("events.out.tfevents.*"))
print("torch" in sys.modules)
"""


def test_a_numpy_run_never_imports_torch(tmp_path):
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path / "run")], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "False"


SPARK_CHECKS = """
import sys
import numpy as np
from monsoon.engines.spark.blocks import restrict
from monsoon.engines.spark.placement import check_fewest_rows
from monsoon.problems import make_problem
from monsoon.strategies import make_strategy
from monsoon.strategies.base import Budget
p = make_problem("logistic")
assert not p.uses_torch
assert restrict(p, np.arange(10)).n_examples == 10
assert check_fewest_rows(p, make_strategy("async"), [50, 50], 8, 0, Budget(epochs=1)) == 1
print("torch" in sys.modules)
from monsoon.problems import TorchProblem
print(TorchProblem.__new__(TorchProblem).uses_torch)
"""


def test_the_spark_engines_checks_of_a_numpy_problem_never_import_torch():
    proc = subprocess.run([sys.executable, "-c", SPARK_CHECKS], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["False", "True"]


def test_digits_reads_sklearns_file_without_importing_sklearn():
    script = ("import sys, monsoon.problems; p = monsoon.problems.make_problem('digits'); "
              "print(p.n_examples, 'sklearn' in sys.modules)")  # 80% of 1797 for training
    proc = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["1438", "False"]
    from sklearn.datasets import load_digits

    from monsoon.problems.catalog import digits_arrays

    images, labels = digits_arrays()
    want = load_digits()
    assert np.array_equal(images, want.data) and np.array_equal(labels, want.target)
    assert images.dtype == want.data.dtype and labels.dtype.kind == want.target.dtype.kind


NO_MATPLOTLIB = """
import sys
import monsoon
from monsoon.problems import make_problem
make_problem("logistic").loss(make_problem("logistic").initial_params(0))
import monsoon.engines.local.runtime, monsoon.monitor.fork_server  # local workers
import monsoon.engines.ray.worker  # Ray actors
import monsoon.engines.spark.barrier, monsoon.engines.spark.tasks  # the daemon's imports
import monsoon.engines.torchrun.rank, monsoon.engines.torchrun.child  # torchrun ranks
print(sorted(m for m in sys.modules if m.split(".")[0] == "matplotlib"))
"""


def test_import_monsoon_a_numpy_problem_and_worker_entry_modules_load_no_matplotlib():
    proc = subprocess.run([sys.executable, "-c", NO_MATPLOTLIB], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "[]"


USERS_PYPLOT = """
import sys
import matplotlib
matplotlib.use("svg")
import matplotlib.pyplot as plt
mine = plt.figure()
import monsoon
run = monsoon.train("logistic", "serial", epochs=1, out=sys.argv[1], progress=False)
assert run.summary["status"] == "finished"
print(matplotlib.get_backend(), plt.get_fignums() == [mine.number], plt.gcf() is mine)
"""


def test_a_run_that_draws_keeps_the_users_pyplot_backend_and_figures(tmp_path):
    """A notebook's backend stays its own: drawing loss.png neither switches
    it to Agg (which closed every open figure) nor registers a figure."""
    proc = subprocess.run([sys.executable, "-c", USERS_PYPLOT, str(tmp_path / "run")], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["svg", "True", "True"]
    assert (tmp_path / "run" / "loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


CLI_RUN = """
import sys
from monsoon.cli import main
code = main(["train", "--problem", "logistic", "--strategy", "async", "--workers", "2",
             "--engine", "sim", "--epochs", "1", "--quiet", "--out", sys.argv[1]])
print(code, "matplotlib.pyplot" in sys.modules)
"""


def test_a_cli_run_draws_every_png_without_pyplot(tmp_path):
    """The run folder keeps its loss and staleness plots (sim: a simulated
    async run of two workers has stale updates), drawn by Agg on its own."""
    import matplotlib.image

    proc = subprocess.run([sys.executable, "-c", CLI_RUN, str(tmp_path / "run")], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split()[-2:] == ["0", "False"]
    assert sorted(p.name for p in (tmp_path / "run").glob("*.png")) == ["loss.png",
                                                                         "staleness.png"]
    for name in ("loss.png", "staleness.png"):
        image = matplotlib.image.imread(tmp_path / "run" / name)
        assert image.shape[0] > 300 and image.shape[1] > 600, (name, image.shape)
        assert len(np.unique(image.reshape(-1, image.shape[-1]), axis=0)) > 20  # drawn, not blank

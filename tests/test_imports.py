"""A run on a NumPy problem never imports torch (about 2 s here), in the
parent or in its workers' fork server: ``import monsoon`` loads torch only
for torch problems, and the live series' event files are written without
tensorboardX (which imports torch)."""
import subprocess
import sys
from pathlib import Path

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

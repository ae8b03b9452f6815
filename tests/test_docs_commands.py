"""The docs stay true: every ``monsoon ...`` command in README.md and docs/
runs as written, and the README's Python blocks run.

Each distinct command runs through ``monsoon.cli.main`` (what the
``monsoon`` script runs) in a temporary folder holding small files for the
commands that name one (``libsvm:...``, ``ratings:...``), with its flags as
written and only its budget cut: ``--steps``/``--epochs`` replaced by
``--steps 16``. It must exit 0 and leave the run folder (or comparison
report) it prints; a run whose workers send messages has counted the bytes
they sent (docs/live.md and docs/compression.md say every engine does). A command
shown with the error it gets (``$ monsoon ...`` then a line ``monsoon:
error: ...``) must end in exactly that error. A command that ``--resume``s a
folder runs after the same command without ``--resume`` has left
checkpoints there.

Commands that need a server run under its marker, on the suite's own:
``--engine ray`` on the session's local Ray instance (the engine runs on
the instance its process is connected to, so ``--address auto`` does too;
tests/test_ray_cluster.py joins a cluster by address); ``--engine spark``
in a local Spark session; ``--engine torch`` under torchrun; ``--mlflow
http://mlflow:5000`` against an MLflow server started here, the name
``mlflow`` resolving to it; ``--device cuda`` on a machine with a GPU
(skipped elsewhere). The bare ``--mlflow`` logs to
MLflow's default store in the temporary folder, and the run is read back.

PNG rendering (matplotlib's ``savefig``, most of a short run's time) is left
out, as in every in-process run of the suite (conftest.py): the figures are
built, not drawn; tests/test_record_cli.py checks the PNGs.
"""
from __future__ import annotations

import functools
import json
import os
import re
import shlex
import socket
import subprocess
import sys
import textwrap
import time
import urllib.request
from pathlib import Path

import pytest

import monsoon
import monsoon.problems
from monsoon.cli import main
from spark_env import spark  # noqa: F401 - the Spark session, for the spark commands

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]

COMMAND = re.compile(r"(?:^|[\s/])monsoon\s+(train|compare|simulate|options)\b(.*)$")
FENCE = re.compile(r"^\s*(```|~~~)")
STEPS = 16  # each command's budget


def _code(text: str):
    """(line number, code, in a block?) for each line of a fenced or indented
    shell block, and each inline code span; a trailing backslash joins lines."""
    in_fence, lang, joined = False, "", None
    for number, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line):
            in_fence, lang = not in_fence, line.strip().strip("`~")
            continue
        if in_fence or line.startswith("    "):
            if in_fence and lang not in ("", "sh", "bash", "shell", "console"):
                continue
            code = line.strip() if joined is None else joined + " " + line.strip()
            joined = code[:-1] if code.endswith("\\") else None
            if joined is None:
                yield number, code, True
        else:
            for span in re.findall(r"`([^`\n]+)`", line):
                yield number, span, False


def commands():
    """(page:line, argv, the error line that follows it or None)."""
    found = []
    for page in PAGES:
        lines = page.read_text().splitlines()
        for number, code, block in _code(page.read_text()):
            match = COMMAND.search(code)
            if not match:
                continue
            words = shlex.split(f"{match.group(1)} {match.group(2)}", comments=True)
            if "&&" in words:
                words = words[:words.index("&&")]
            if "--help" in words or "-h" in words:
                continue
            after = lines[number].strip() if block and number < len(lines) else ""
            expected = after if after.startswith("monsoon: error:") else None
            found.append((f"{page.relative_to(ROOT)}:{number}", words, expected))
    return found


def test_the_docs_hold_commands():
    found = commands()
    pages = {where.split(":")[0] for where, _, _ in found}
    assert len(found) >= 30 and "README.md" in pages
    assert {"docs/strategies.md", "docs/engines/local.md", "docs/engines/sim.md",
            "docs/engines/ray.md", "docs/engines/spark.md", "docs/engines/torch.md"} <= pages
    assert any(expected for _, _, expected in found)  # the refusal shown in the README


def test_quick_start_command_is_found():
    quick = [w for where, w, _ in commands() if where.startswith("README.md") and
             "--repeats" in w and "runs/exp" in w]
    assert quick == [["compare", "--problem", "exp", "--strategies", "serial,sync,async,hogwild",
                      "--workers", "2", "--repeats", "3", "--out", "runs/exp"]]


@pytest.fixture(scope="module")
def make_cached():
    """Each named problem built once for the module (rcv1-like takes seconds)."""
    return functools.lru_cache(maxsize=None)(monsoon.problems.make_problem)


@pytest.fixture
def folder(monkeypatch, tmp_path, make_cached):
    """The command's working folder, with small data files for the commands
    that name one; problems built once."""
    rows = [f"{1 if i % 2 else -1} {1 + i % 7}:0.5 {9 + i % 5}:1.0" for i in range(200)]
    (tmp_path / "rcv1_train.binary").write_text("\n".join(rows) + "\n")
    (tmp_path / "ml-latest-small").mkdir()
    ratings = [f"{1 + i % 20},{1 + (i * 7) % 30},{1 + i % 5}.0,0" for i in range(400)]
    (tmp_path / "ml-latest-small" / "ratings.csv").write_text(
        "userId,movieId,rating,timestamp\n" + "\n".join(ratings) + "\n")

    def cached(name, dtype="float32", **options):
        return make_cached(name, dtype, **options)

    monkeypatch.setattr(monsoon.problems, "make_problem", cached)
    for name in ("MLFLOW_TRACKING_URI", "MLFLOW_ALLOW_FILE_STORE", "RAY_ADDRESS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def needs(argv: list[str]) -> str:
    """The server a command needs ("" for none)."""
    value = dict(zip(argv, argv[1:]))
    engine = value.get("--engine")
    if engine in ("ray", "spark", "torch"):
        return {"ray": "ray", "spark": "spark", "torch": "torchrun"}[engine]
    if value.get("--device", "").startswith("cuda"):
        return "gpu"
    if value.get("--mlflow", "").startswith("http"):
        return "mlflow server"
    return ""


ORDER = ["", "mlflow server", "gpu", "ray", "spark", "torchrun"]
BUSY = pytest.mark.timeout(300)  # a server's start and a run, on a busy machine
MARKS = {"ray": [pytest.mark.ray, BUSY], "spark": [pytest.mark.spark, BUSY],
         "torchrun": [pytest.mark.torchrun, pytest.mark.slow, BUSY],
         "gpu": [pytest.mark.gpu], "mlflow server": [BUSY]}


def distinct_commands():
    """Each distinct command once (with every place it is shown), those of
    one server together."""
    places: dict[tuple, list[str]] = {}
    for where, argv, expected in commands():
        places.setdefault((tuple(argv), expected), []).append(where)
    found = sorted(places.items(), key=lambda item: (ORDER.index(needs(list(item[0][0]))),
                                                     -_ray_workers(list(item[0][0]))))
    return [pytest.param(list(argv), expected, needs(list(argv)),
                         marks=MARKS.get(needs(list(argv)), []), id=" ".join(where))
            for (argv, expected), where in found]


def _ray_workers(argv: list[str]) -> int:
    """A Ray command's worker count (0 for others): the Ray commands run
    from the most workers to the fewest, so that runs whose workers reserve
    the same CPU share follow one another and the next reuses the actors the
    last one left (engines/ray/hosts.py), as a user's sweep would."""
    value = dict(zip(argv, argv[1:]))
    return int(value.get("--workers", 0)) if needs(argv) == "ray" else 0


def with_budget(argv: list[str], steps: int = STEPS) -> list[str]:
    """``argv`` with its ``--steps``/``--epochs`` replaced by ``--steps steps``."""
    if argv[0] == "options":
        return list(argv)
    budget = ("--steps", "--epochs")
    kept = [w for i, w in enumerate(argv)
            if w not in budget and (i == 0 or argv[i - 1] not in budget)]
    return kept + ["--steps", str(steps)]


def run(argv: list[str], capsys) -> tuple[int, str, str]:
    """``monsoon ARGV``: its exit status, stdout and stderr."""
    try:
        code = main(argv)
    except SystemExit as exc:  # the parser's refusals
        code = exc.code
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def left_checkpoints(argv: list[str], capsys) -> None:
    """Run ``argv`` without its ``--resume DIR``, writing checkpoints to DIR."""
    at = argv.index("--resume")
    first = argv[:at] + argv[at + 2:]
    if "--checkpoint-every" in first:
        at = first.index("--checkpoint-every")
        first = first[:at] + first[at + 2:]
    code, _, err = run(with_budget(first, STEPS // 2) + ["--checkpoint-every", "4"], capsys)
    assert code == 0, err


def summaries(argv: list[str], out: str) -> list[tuple[str, dict]]:
    """(run folder, summary) of each run the command printed (a comparison:
    each strategy's)."""
    if argv[0] == "compare":
        report = re.search(r"^report: (\S+)", out, re.M)
        assert report, out[-500:]
        found = sorted(Path(report.group(1)).parent.glob("*/summary.json"))
        strategies = value(argv, "--strategies") or "serial,sync,async,hogwild"
        assert len(found) == len([s for s in strategies.split(",") if s])
    else:
        folder = re.search(r"^run folder: (.+)$", out, re.M)
        assert folder, out[-500:]
        found = [Path(folder.group(1)) / "summary.json"]
    return [(str(path.parent), json.loads(path.read_text())) for path in found]


def value(argv: list[str], flag: str) -> str | None:
    """The word after ``flag`` ("" where the flag ends the command or is
    followed by another flag; None where it is absent)."""
    if flag not in argv:
        return None
    after = argv[argv.index(flag) + 1:]
    return after[0] if after and not after[0].startswith("--") else ""


# Strategies whose workers send messages (hogwild's share memory; serial has one worker)
SENDS = {"sync", "async", "ssp", "local-sgd", "easgd"}


def counted(summary: dict) -> None:
    """Every engine counts the bytes its workers send (docs/live.md,
    docs/compression.md); spark's sync counts its barrier stage's all-reduce
    and nothing where the partitions' sums are gathered on the driver
    (docs/compression.md)."""
    if summary["strategy"] not in SENDS or summary["workers"] < 2:
        return
    if (summary["engine"], summary["strategy"]) == ("spark", "sync") \
            and "spark_sync" not in summary:
        assert not summary.get("bytes_sent"), summary
    else:
        assert summary["bytes_sent"] > 0, summary


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory):
    """A real MLflow tracking server on this machine, taking requests
    addressed to ``mlflow:5000`` as the docs' server does. Its store is a
    folder (it starts sooner than a SQLite store, which migrates its tables)."""
    pytest.importorskip("mlflow")
    where = tmp_path_factory.mktemp("mlflow-server")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = open(where / "server.log", "w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port),
         "--workers", "1", "--backend-store-uri", str(where / "mlruns"),
         "--allowed-hosts", "mlflow:5000,127.0.0.1:*,localhost:*"],
        cwd=where, stdout=log, stderr=subprocess.STDOUT,
        env={**os.environ, "MLFLOW_ALLOW_FILE_STORE": "true"})
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    try:
        while True:
            try:
                urllib.request.urlopen(url + "/health", timeout=2).close()
                break
            except OSError:
                assert proc.poll() is None, (where / "server.log").read_text()[-2000:]
                assert time.monotonic() < deadline, "the MLflow server did not answer in 120 s"
                time.sleep(0.5)
        yield port
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=30)
        log.close()


def serve(kind: str, request, monkeypatch) -> None:
    """Start (or join) the server the command needs."""
    if kind == "ray":
        request.getfixturevalue("local_ray")
    elif kind == "spark":
        request.getfixturevalue("spark")
    elif kind == "gpu":
        import torch

        if not torch.cuda.is_available():
            pytest.skip("needs a CUDA device")
    elif kind == "mlflow server":
        port, real = request.getfixturevalue("mlflow_server"), socket.getaddrinfo

        def resolve(host, at, *args, **kwargs):  # the docs' server name, here
            if host == "mlflow" and str(at) == "5000":
                return real("127.0.0.1", port, *args, **kwargs)
            return real(host, at, *args, **kwargs)

        monkeypatch.setattr(socket, "getaddrinfo", resolve)


def logged_to_mlflow(argv: list[str], folder: str, summary: dict) -> None:
    """The run is in the MLflow store the flag names (bare: MLflow's
    default), tagged with its run folder."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=value(argv, "--mlflow") or None)
    experiment = client.get_experiment_by_name("monsoon")
    runs = client.search_runs([experiment.experiment_id],
                              filter_string=f"tags.`monsoon.out` = '{folder}'")
    assert len(runs) == 1 and runs[0].info.status == "FINISHED"
    assert runs[0].data.params["strategy"] == summary["strategy"]


@pytest.mark.parametrize("argv,expected,server", distinct_commands())
def test_command_in_the_docs_runs(argv, expected, server, folder, request, monkeypatch,
                                  capsys):
    """The command, as written with a small budget, runs to its end (or to
    the error the page shows)."""
    serve(server, request, monkeypatch)
    if expected is not None:
        code, _, err = run(with_budget(argv), capsys)
        assert code == 2 and err.strip().splitlines()[-1] == expected
        return
    if "--resume" in argv:
        left_checkpoints(argv, capsys)
    code, out, err = run(with_budget(argv), capsys)
    assert code == 0, f"monsoon {shlex.join(argv)}: exit {code}: {err.strip()[-1500:]}"
    if argv[0] == "options":
        assert "`--workers`" in out or "--workers" in out
        return
    for run_folder, summary in summaries(argv, out):
        assert summary["updates"] > 0
        counted(summary)
        if "--mlflow" in argv:
            logged_to_mlflow(argv, run_folder, summary)


def test_a_renamed_flag_would_fail(folder, capsys):
    for argv, error in [
            (["train", "--problem", "digits", "--strategy", "async", "--n-pushes", "4"],
             "unrecognized arguments: --n-pushes"),
            (["train", "--engine", "spark", "--strategy", "hogwild"],
             "spark engine has no shared memory"),
            (["compare", "--strategies", "serial,sync", "--local-steps", "4"],
             "--local-steps applies to --strategy local-sgd")]:
        code, _, err = run(argv, capsys)
        assert code == 2 and error in err.strip().splitlines()[-1]


# -- facts the docs state about the code -------------------------------------------

def _table(page: Path, header: str) -> list[list[str]]:
    """The rows (cells, backticks dropped) of the table whose header row starts ``header``."""
    lines = page.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header))
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip().strip("`") for cell in line.strip("|").split("|")])
    return rows


def test_the_strategy_table_names_the_engines_that_take_each():
    from monsoon.config import registries
    from monsoon.engines.base import engines_for
    from monsoon.strategies import make_strategy

    rows = _table(ROOT / "docs" / "strategies.md", "| strategy | paper | engines |")
    assert [r[0] for r in rows] == registries()["strategy"].names()
    for name, _, engines in rows:
        strategy = make_strategy(name)
        taken = engines_for(strategy, 1 if strategy.single_worker else 2)
        assert engines.split(", ") == taken, name


def test_the_per_engine_tables_name_every_engine():
    from monsoon.config import registries

    names = sorted(registries()["engine"].names())
    for page, header in [("live.md", "| engine | how the figures"),
                         ("compression.md", "| engine | what travels"),
                         ("faults.md", "| engine | a worker dies")]:
        rows = _table(ROOT / "docs" / page, header)
        assert sorted(r[0] for r in rows) == names, page


def test_the_spark_page_states_the_spark_data_defaults():
    """docs/engines/spark.md said "--tol 0.0002 with at most 20 epochs" in
    one place and 100 in another; SPARK_DEFAULTS has 100. Every "at most N
    epochs" and "--tol T" it states is the default."""
    from monsoon.problems.spark_data import SPARK_DEFAULTS

    text = (ROOT / "docs" / "engines" / "spark.md").read_text()
    epochs = re.findall(r"at most\s+(\d+)\s+epochs", text)
    tols = re.findall(r"--tol\s+([\d.]+)", text)
    assert epochs and tols
    assert {int(e) for e in epochs} == {SPARK_DEFAULTS["epochs"]}
    assert {float(t) for t in tols} == {SPARK_DEFAULTS["tol"]}


# -- the README's Python -------------------------------------------------------------

def _python_blocks(page: Path) -> list[tuple[int, str]]:
    blocks, current, start = [], None, 0
    for number, line in enumerate(page.read_text().splitlines(), 1):
        if line.strip().startswith("```"):
            if current is None and line.strip() == "```python":
                current, start = [], number
            elif current is not None:
                blocks.append((start, "\n".join(current)))
                current = None
        elif current is not None:
            current.append(line)
    return blocks


def test_every_python_block_in_the_docs_compiles():
    for page in PAGES:
        for start, code in _python_blocks(page):
            # a fragment (a method's lines) compiles as a function's body
            body = textwrap.indent(textwrap.dedent(code), "    ")
            compile(f"def _fragment():\n{body}\n", f"{page.relative_to(ROOT)}:{start}", "exec")


README_BLOCKS = _python_blocks(ROOT / "README.md")


def test_readme_has_python_blocks():
    assert len(README_BLOCKS) >= 2
    assert any(re.search(r"monsoon\.train\(\"\w+\"", code) for _, code in README_BLOCKS)


@pytest.mark.parametrize("start,code", README_BLOCKS, ids=lambda v: f"README.md:{v}"
                         if isinstance(v, int) else None)
def test_readme_python_block_runs(start, code, monkeypatch, tmp_path):
    """Each block runs as written, with its budget cut to a few steps."""
    train = monsoon.train
    calls = []

    def short(problem, *args, **options):
        options.pop("epochs", None)
        options.update(steps=8, evals=2, progress=False)
        calls.append(problem)
        return train(problem, *args, **options)

    monkeypatch.setattr(monsoon, "train", short)
    monkeypatch.chdir(tmp_path)
    namespace = {"__name__": "readme_block"}
    exec(compile(code, f"README.md:{start}", "exec"), namespace)
    assert calls, "the block trains nothing"
    if "result" in namespace:
        assert namespace["result"].summary["updates"] > 0

"""The docs stay true: every ``monsoon ...`` command in README.md and docs/
resolves, and the README's Python blocks run.

A command is parsed by the real command-line parser and resolved by
``monsoon.config.resolve`` (the problem built, every option checked, the
engine asked whether it takes the strategy), without training. A renamed or
removed flag, or an option the chosen components refuse, fails here. A
command shown with the error it gets (``$ monsoon ...`` then a line
``monsoon: error: ...``) must get exactly that error.

Runs in a temporary folder holding small files for the commands that name
one (``libsvm:...``, ``ratings:...``) and a checkpoints folder for those
that ``--resume`` one.
"""
from __future__ import annotations

import contextlib
import functools
import io
import re
import shlex
import textwrap
from pathlib import Path

import pytest

import monsoon
import monsoon.problems
from monsoon.cli import _given, build_parser
from monsoon.config import for_strategy, refuse_untaken, registries, resolve
from monsoon.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]

COMMAND = re.compile(r"(?:^|[\s/])monsoon\s+(train|compare|simulate|options)\b(.*)$")
FENCE = re.compile(r"^\s*(```|~~~)")


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
def workdir(tmp_path_factory):
    """A folder with small data files for the commands that name one."""
    folder = tmp_path_factory.mktemp("docs")
    rows = [f"{1 if i % 2 else -1} {1 + i % 7}:0.5 {9 + i % 5}:1.0" for i in range(200)]
    (folder / "rcv1_train.binary").write_text("\n".join(rows) + "\n")
    (folder / "ml-latest-small").mkdir()
    ratings = [f"{1 + i % 20},{1 + (i * 7) % 30},{1 + i % 5}.0,0" for i in range(400)]
    (folder / "ml-latest-small" / "ratings.csv").write_text(
        "userId,movieId,rating,timestamp\n" + "\n".join(ratings) + "\n")
    return folder


@pytest.fixture
def cheap(monkeypatch, workdir):
    """Build each named problem once (rcv1-like takes seconds), in workdir."""
    make = functools.lru_cache(maxsize=None)(monsoon.problems.make_problem)

    def cached(name, dtype="float32", **options):
        return make(name, dtype, **options)

    monkeypatch.setattr(monsoon.problems, "make_problem", cached)
    # The docs' GPU commands are resolved as on a machine with two GPUs
    # (resolving starts no worker, so nothing touches CUDA).
    from monsoon import devices

    monkeypatch.setattr(devices, "cuda_count", lambda: 2)
    monkeypatch.chdir(workdir)
    return workdir


def resolve_command(argv: list[str], where: Path) -> None:
    """What ``monsoon`` does with ``argv`` up to the first worker, or raise."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        try:
            args = build_parser().parse_args(argv)
        except SystemExit as exc:
            raise ConfigError(err.getvalue().strip().splitlines()[-1]) from exc
    if args.command == "options":
        return
    options = _given(args)
    resume = options.get("resume")
    if resume:
        (where / resume / "checkpoints").mkdir(parents=True, exist_ok=True)
    if args.command == "compare":
        if options.pop("repeats") < 1:
            raise ConfigError("repeats must be a whole number >= 1")
        strategies = [s for s in args.strategies.split(",") if s]
        refuse_untaken({k: v for k, v in options.items()
                        if registries()["strategy"].takers(k)}, {"strategy": strategies})
        runs = [(s, for_strategy(options, s)) for s in strategies]
    else:
        if args.command == "simulate":
            options["engine"] = "sim"
        runs = [(args.strategy, options)]
    for strategy, given in runs:
        single = registries()["strategy"].get(strategy).single_worker
        given = {**given, "out": args.out or "runs/docs"}
        # resolve also asks the engine whether it takes the strategy (Engine.check)
        resolve(args.problem, strategy, 1 if single else args.workers, given)


@pytest.mark.parametrize("where,argv,expected", commands(), ids=lambda v: v if
                         isinstance(v, str) and ":" in v else None)
def test_command_in_the_docs_resolves(where, argv, expected, cheap):
    if expected is None:
        resolve_command(argv, cheap)
    else:
        with pytest.raises(ConfigError) as info:
            resolve_command(argv, cheap)
        assert f"monsoon: error: {info.value}" == expected


def test_a_renamed_flag_would_fail(cheap):
    with pytest.raises(ConfigError, match="unrecognized arguments: --n-pushes"):
        resolve_command(["train", "--problem", "digits", "--strategy", "async", "--n-pushes",
                         "4"], cheap)
    with pytest.raises(ConfigError, match="spark engine has no shared memory"):
        resolve_command(["train", "--engine", "spark", "--strategy", "hogwild"], cheap)
    with pytest.raises(ConfigError, match="--local-steps applies to --strategy local-sgd"):
        resolve_command(["compare", "--strategies", "serial,sync", "--local-steps", "4"], cheap)


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

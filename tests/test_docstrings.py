"""Module docstrings say what the code does and why, in at most 40 lines, and
a timing in a docstring or comment names the benchmark it comes from.

Checked for the package outside OTHERS (folders whose owners are bringing
theirs under the same rule: drop a folder from OTHERS once it passes)."""
from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OTHERS = ()
TIMING = re.compile(r"\d\s?(µs|us|ms|ns)\b|\d+(\.\d+)?\s?(k|M)?\s?examples/s|\d\s?s/step")


def modules():
    for path in sorted((ROOT / "monsoon").rglob("*.py")):
        if path.relative_to(ROOT / "monsoon").parts[0] not in OTHERS:
            yield path


def test_module_docstrings_are_at_most_40_lines():
    long = {}
    for path in modules():
        doc = ast.get_docstring(ast.parse(path.read_text()), clean=False) or ""
        if len(doc.splitlines()) > 40:
            long[str(path.relative_to(ROOT))] = len(doc.splitlines())
    assert not long, long


def _prose(source: str):
    """(line, text) of every comment and string literal."""
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type in (tokenize.COMMENT, tokenize.STRING):
            for k, line in enumerate(tok.string.splitlines()):
                yield tok.start[0] + k, line


def test_a_timing_names_its_benchmark():
    bare = []
    for path in modules():
        for number, line in _prose(path.read_text()):
            if TIMING.search(line) and "bench/" not in line:
                bare.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert not bare, "\n".join(bare)


def test_the_check_finds_a_bare_timing():
    lines = [text for _, text in _prose('x = 1  # a step takes ~80 us here\n')]
    assert any(TIMING.search(t) for t in lines)

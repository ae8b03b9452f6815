"""docs/benchmarks.md and the README's benchmark lines are rendered from the
records in bench/results/, and only from them (``bench/render.py``)."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import records  # noqa: E402
import render  # noqa: E402


def test_committed_page_and_readme_are_current():
    stale = render.render(check=True)
    assert not stale, "run python bench/render.py: " + ", ".join(map(str, stale))


def test_every_benchmark_script_is_listed_and_writes_a_record():
    helpers = {"common", "records", "render", "ddp_peer", "ray_peer", "bare_sync"}
    scripts = {p.stem for p in (ROOT / "bench").glob("*.py")} - helpers
    listed = [name for name, *_ in render.BENCHMARKS]
    assert sorted(listed) == sorted(scripts)
    for name in scripts:
        source = (ROOT / "bench" / f"{name}.py").read_text()
        assert f'write_record("{name}"' in source, name


@pytest.fixture
def sandbox(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text(f"# x\n\nbefore\n\n{render.BEGIN}\nold\n{render.END}\n\nafter\n")
    return tmp_path / "results", readme, tmp_path / "benchmarks.md"


def _record(results, name, ratio, met, command=None):
    return records.write_record(
        name, {"repeats": 3},
        [records.row("a shape", [1.0, 1.2, 1.1], [1.0, 1.0, 0.9], ratio, ">= 1.0", met,
                     unit="examples/s", ratio_runs=[ratio - 0.1, ratio, ratio + 0.1])],
        {"ratio": ratio, "ratio_runs": [ratio - 0.1, ratio + 0.1], "target": ">= 1.0",
         "met": met, "line": f"the line of {name}: {ratio}"},
        command=command or f"python bench/{name}.py", directory=results)


def test_without_records_every_row_says_not_yet_recorded(sandbox):
    results, readme, page = sandbox
    render.render(results, readme, page)
    text = page.read_text()
    for name, what, command, target in render.BENCHMARKS:
        assert f"| {what} | — | {target} | not yet recorded | — | `{command}` |" in text
    lines = readme.read_text()
    assert "old" not in lines and lines.startswith("# x\n\nbefore\n") and "after" in lines
    assert lines.count("not yet recorded") == len(render.BENCHMARKS)


def test_a_new_record_updates_its_row_and_nothing_else(sandbox):
    results, readme, page = sandbox
    _record(results, "sync_vs_ddp", 1.31, False)
    render.render(results, readme, page)
    before_page, before_readme = page.read_text(), readme.read_text()
    assert "1.31 (1.21–1.41) | >= 1.0 | **not met**" in before_page
    assert "the line of sync_vs_ddp: 1.31" in before_page
    assert "| a shape | 1.1 examples/s (1–1.2) | 1 examples/s (0.9–1) |" in before_page

    path = _record(results, "sync_vs_ddp", 1.62, True)
    path.rename(path.with_name("99999999T000000Z-newest.json"))  # sorts last: the newest
    assert render.render(results, readme, page) == [page, readme]
    changed = [(a, b) for a, b in zip(before_page.splitlines(), page.read_text().splitlines())
               if a != b]
    assert changed and all("sync_vs_ddp" in a or "1.31" in a or "sync-vs-ddp" in a
                           or "a shape" in a for a, _ in changed)
    assert "1.62 (1.52–1.72) | >= 1.0 | **met**" in page.read_text()
    readme_changed = [b for a, b in zip(before_readme.splitlines(),
                                        readme.read_text().splitlines()) if a != b]
    assert len(readme_changed) == 1 and "1.62" in readme_changed[0]
    assert render.render(results, readme, page, check=True) == []


def test_a_record_holds_what_the_issue_asks(sandbox):
    results, _, _ = sandbox
    record = json.loads(_record(results, "pipeline", 0.05, True).read_text())
    for key in ("benchmark", "command", "params", "commit", "date", "machine", "rows",
                "summary"):
        assert key in record
    assert record["rows"][0]["ours"] == {"median": 1.1, "min": 1.0, "max": 1.2,
                                         "runs": [1.0, 1.2, 1.1]}
    with pytest.raises(ValueError, match="'met'"):
        records.write_record("x", {}, [], {"line": "", "ratio": 1, "target": ""},
                             directory=results)

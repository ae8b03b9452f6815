"""docs/benchmarks.md and the README's benchmark lines are rendered from the
records in bench/results/, and only from them (``bench/render.py``)."""
from __future__ import annotations

import json
import os
import subprocess
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
    helpers = {"common", "records", "render", "run_all", "ddp_peer", "ray_peer", "bare_sync"}
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
        status = (f"needs {render.NEEDS[name]}; not yet run on one" if name in render.NEEDS
                  else "not yet recorded")
        assert f"| {what} | — | {target} | {status} | — | `{command}` |" in text
    lines = readme.read_text()
    assert "old" not in lines and lines.startswith("# x\n\nbefore\n") and "after" in lines
    # the README lists the headline benchmarks only, and never the GPU's
    assert lines.count("not yet recorded") == len(render.HEADLINE)
    assert "CUDA" not in lines


def test_a_new_record_updates_its_row_and_nothing_else(sandbox):
    results, readme, page = sandbox
    _record(results, "sync_sweep", 1.31, False)
    render.render(results, readme, page)
    before_page, before_readme = page.read_text(), readme.read_text()
    assert "1.31 (1.21–1.41) | >= 1.0 | **not met**" in before_page
    assert "the line of sync_sweep: 1.31" in before_page
    assert "| a shape | 1.1 examples/s (1–1.2) | 1 examples/s (0.9–1) |" in before_page

    path = _record(results, "sync_sweep", 1.62, True)
    path.rename(path.with_name("99999999T000000Z-newest.json"))  # sorts last: the newest
    assert render.render(results, readme, page) == [page, readme]
    changed = [(a, b) for a, b in zip(before_page.splitlines(), page.read_text().splitlines())
               if a != b]
    assert changed and all("sync_sweep" in a or "1.31" in a or "sync-sweep" in a
                           or "a shape" in a or a.startswith("Commit ")  # its section's
                           for a, _ in changed)  # machine line: the load differs between writes
    assert "1.62 (1.52–1.72) | >= 1.0 | **met**" in page.read_text()
    readme_changed = [b for a, b in zip(before_readme.splitlines(),
                                        readme.read_text().splitlines()) if a != b]
    assert len(readme_changed) == 1 and "1.62" in readme_changed[0]
    assert render.render(results, readme, page, check=True) == []


def test_a_partial_record_is_kept_but_never_rendered_over_a_whole_one(sandbox):
    """A run of a subset of a benchmark's cases (``--strategies easgd``)
    writes its record, marked partial; the rows go on showing the newest
    whole record."""
    results, readme, page = sandbox
    whole = _record(results, "sync_sweep", 1.31, False)
    whole.rename(whole.with_name("00000000T000000Z-whole.json"))  # not overwritten below
    render.render(results, readme, page)
    before = page.read_text(), readme.read_text()
    path = records.write_record(
        "sync_sweep", {}, [records.row("one case", [1.0], [2.0], 0.5, ">= 1.0", False)],
        {"ratio": 0.5, "target": ">= 1.0", "met": False, "line": "a subset: 0.5"},
        directory=results, partial="--strategies easgd")
    path = path.rename(path.with_name("99999999T000000Z-partial.json"))  # sorts last
    assert json.loads(path.read_text())["partial"] == "--strategies easgd"
    assert records.newest("sync_sweep", results)["summary"]["ratio"] == 1.31
    assert render.render(results, readme, page, check=True) == []
    assert (page.read_text(), readme.read_text()) == before


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


def _readme_list(text: str) -> list[str]:
    start, stop = text.index(render.BEGIN) + len(render.BEGIN), text.index(render.END)
    return [line for line in text[start:stop].splitlines() if line.strip()]


def test_the_readme_lists_at_most_8_headline_benchmarks():
    listed = [name for name, *_ in render.BENCHMARKS]
    assert len(render.HEADLINE) <= 8 and set(render.HEADLINE) <= set(listed)
    assert not set(render.NEEDS) & set(render.HEADLINE)
    lines = _readme_list((ROOT / "README.md").read_text())
    assert 0 < len(lines) <= 8


def test_targets_parse_conservatively():
    assert render.parse_target(">= 0.9") == (">=", 0.9)
    assert render.parse_target("<= 0.05 of the run") == ("<=", 0.05)
    assert render.parse_target("< 120 s") == ("<", 120.0)
    assert render.parse_target(">= 0.98 on every shape") == (">=", 0.98)
    assert render.parse_target("<= 5%") == ("<=", 0.05)
    # an overlap clause does not make a ratio on the wrong side met
    assert render.parse_target(">= 1.0, or within the run-to-run spread") == (">=", 1.0)
    for several in (">= 0.9 vs one process, >= 1.1 vs DDP, every shape",
                    ">= 1.0x examples/s, final loss within 1%", "each row's", None):
        assert render.parse_target(several) is None
    assert render.right_side(0.663, ">= 1.0") is False
    assert render.right_side(1.09, "<= 1.1") is True
    assert render.right_side(1.2, "best of sync and async") is None


def _verdict_record(results, name, ratio, met, target, rows=None, **summary):
    return records.write_record(
        name, {}, rows or [], {"ratio": ratio, "target": target, "met": met,
                               "line": f"{name}'s line", **summary},
        command=f"python bench/{name}.py", directory=results)


def test_no_row_says_met_with_its_ratio_on_the_wrong_side(sandbox):
    results, readme, page = sandbox
    # met by overlapping ranges, ratio below the target: a tie with its spread
    _verdict_record(results, "quick_start", 0.66, True, ">= 0.9",
                    [records.row("r", ratio=0.66, target=">= 0.9", met=True,
                                 ratio_runs=[0.5, 0.66, 0.95])], ratio_runs=[0.5, 0.66, 0.95])
    # several conditions: the rows are judged instead
    _verdict_record(results, "sync_sweep", 0.8, True,
                    ">= 0.9 vs one process, >= 1.1 vs DDP, every shape",
                    [records.row("mlp vs one process", ratio=0.8, target=">= 0.9", met=True,
                                 ratio_runs=[0.7, 0.95]),
                     records.row("mlp vs DDP", ratio=1.3, target=">= 1.1", met=True)])
    # not met, with its reason; and a plain met
    _verdict_record(results, "ray_overhead", 1.5, False, "<= 1.2",
                    why="Ray's own actor calls dominate at this size.")
    _verdict_record(results, "delay_tolerance", 0.5, True, "<= 0.8")
    render.render(results, readme, page)
    listed = _readme_list(readme.read_text())
    assert len(listed) == len(render.HEADLINE) and "**met** " not in "\n".join(listed)
    lines = {name: next(line for line in listed if line.startswith(f"- {what}: "))
             for name, what, *_ in render.BENCHMARKS if name in render.HEADLINE}
    assert lines["quick_start"].endswith("**tie** (spread 0.5–0.95)")
    assert lines["sync_sweep"].endswith("**tie** (spread 0.7–0.95 on mlp vs one process)")
    assert lines["ray_overhead"].endswith(
        "**not met**: Ray's own actor calls dominate at this size.")
    assert lines["delay_tolerance"].endswith("**met**")
    text = page.read_text()
    assert "| r | — | — | 0.66 (0.5–0.95) | >= 0.9 | tie |" in text
    assert "| mlp vs one process | — | — | 0.8 (0.7–0.95) | >= 0.9 | tie |" in text
    assert "| mlp vs DDP | — | — | 1.3 | >= 1.1 | yes |" in text


def test_no_committed_record_renders_met_on_the_wrong_side():
    for name, *_ in render.BENCHMARKS:
        record = records.newest(name)
        if record is None:
            continue
        s = record["summary"]
        if render.verdict(s, record.get("rows"))[0] == "met":
            assert render.right_side(s.get("ratio"), s.get("target")) is not False, name
        for r in record.get("rows") or []:
            if render.row_verdict(r) == "yes":
                assert render.right_side(r.get("ratio"), r.get("target")) is not False, name


def test_every_committed_not_met_row_says_why():
    readme = _readme_list((ROOT / "README.md").read_text())
    page = (ROOT / "docs" / "benchmarks.md").read_text().splitlines()
    missed = []
    for name, what, *_ in render.BENCHMARKS:
        record = records.newest(name)
        if record is None:
            continue
        word, why = render.verdict(record["summary"], record.get("rows"), name)
        if word != "not met":
            assert name not in render.WHY, f"{name} is {word} now: drop its WHY sentence"
            continue
        missed.append(name)
        assert why.strip() and "\n" not in why and "|" not in why, name
        row = next(line for line in page if line.startswith(f"| [{what}]("))
        assert f"| **not met**: {why} |" in row, name
        if name in render.HEADLINE:
            line = next(line for line in readme if line.startswith(f"- {what}: "))
            assert line.endswith(f"**not met**: {why}"), name
    assert missed  # the committed records have some, so this test checks something


def test_a_records_own_why_wins_over_the_benchmarks_sentence(sandbox):
    results, readme, page = sandbox
    _verdict_record(results, "async_local_vs_ray", 0.5, False, ">= 0.9", why="Its own reason.")
    _verdict_record(results, "hogwild_sweep", 0.5, False, ">= 0.9")
    render.render(results, readme, page)
    lines = _readme_list(readme.read_text())
    assert any(line.endswith("**not met**: Its own reason.") for line in lines)
    assert render.WHY["async_local_vs_ray"] not in readme.read_text() + page.read_text()
    assert any(line.endswith(f"**not met**: {render.WHY['hogwild_sweep']}") for line in lines)
    assert f"| **not met**: {render.WHY['hogwild_sweep']} |" in page.read_text()


def test_a_record_names_the_machine_its_loads_and_the_peers(sandbox, monkeypatch):
    results, _, _ = sandbox
    record = json.loads(_record(results, "pipeline", 0.05, True).read_text())
    m = record["machine"]
    assert m["cores"] and m["cpu"] and "gpu" in m
    assert len(m["load_before"]) == 3 and len(m["load_after"]) == 3
    assert record["peers"]["numpy"] == __import__("numpy").__version__
    assert record["elapsed_s"] >= 0
    # run_all.py hands the load at launch over; the script's own children take theirs
    out = subprocess.run(
        [sys.executable, "-c", "import os, records; print(records.LOAD_BEFORE, "
                               "'MONSOON_BENCH_LOAD_BEFORE' in os.environ)"],
        cwd=ROOT / "bench", env={**os.environ, "MONSOON_BENCH_LOAD_BEFORE": "0.25,0.5,0.75"},
        capture_output=True, text=True, timeout=60)
    assert out.stdout.split() == ["[0.25,", "0.5,", "0.75]", "False"], out.stderr


import ast  # noqa: E402
import re  # noqa: E402
import shlex  # noqa: E402

import run_all  # noqa: E402


def _options(script: Path) -> dict[str, bool]:
    """A bench script's argparse options: name -> whether it takes a value."""
    options = {}
    for node in ast.walk(ast.parse(script.read_text())):
        if (isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "add_argument"
                and node.args and isinstance(node.args[0], ast.Constant)):
            action = next((k.value.value for k in node.keywords if k.arg == "action"), None)
            options[node.args[0].value] = action not in ("store_true", "store_false")
    return options


def _check_arguments(name: str, args: list[str]) -> None:
    script = ROOT / "bench" / f"{name}.py"
    assert script.exists(), name
    options, i = _options(script), 0
    while i < len(args):
        assert args[i] in options, f"{name}: no option {args[i]}"
        if options[args[i]]:
            assert i + 1 < len(args) and not args[i + 1].startswith("--"), (name, args[i])
            if name == "before_after" and args[i] == "--bench":  # a benchmark and its args
                inner, *rest = shlex.split(args[i + 1])
                _check_arguments(inner, rest)
            i += 1
        i += 1


def test_run_all_plans_every_benchmark_with_arguments_its_script_takes():
    names = [name for name, *_ in render.BENCHMARKS]
    assert sorted(run_all.PLAN) == sorted(names)
    for name, (full, _, quick, _) in run_all.PLAN.items():
        _check_arguments(name, full)
        _check_arguments(name, quick)


@pytest.mark.parametrize("quick, budget", [(False, 60), (True, 20)])
def test_run_all_dry_run_lists_every_benchmark_within_the_budget(capsys, quick, budget):
    assert run_all.main(["--dry-run"] + (["--quick"] if quick else [])) == 0
    out = capsys.readouterr().out.splitlines()
    for name, *_ in render.BENCHMARKS:
        line = next(line for line in out if line.split()[0] == name)
        if name in render.NEEDS and not run_all.cuda_here(probe_torch=False):
            assert f"skipped: needs {render.NEEDS[name]}" in line
        else:
            cmd = shlex.split(line[line.index("python bench/"):])
            assert cmd[:2] == ["python", f"bench/{name}.py"]
            assert cmd[2:] == run_all.PLAN[name][2 if quick else 0]
    total = float(re.search(r"estimated total: ([\d.]+) min", out[-1]).group(1))
    assert 0 < total < budget


def test_run_all_waits_for_a_load_below_the_threshold_held_long_enough():
    clock = [0.0]
    loads = iter([3.0, 1.4, 1.6, 1.4, 1.3, 1.2, 1.1, 1.0])

    def sleep(s):
        clock[0] += s

    quiet, load = run_all.wait_for_quiet(4, timeout=60, load=lambda: next(loads),
                                         clock=lambda: clock[0], sleep=sleep, poll=2)
    assert quiet and clock[0] == 10  # the 1.6 at t=4 restarts the hold from t=6
    quiet, load = run_all.wait_for_quiet(30, timeout=20, load=lambda: 2.5,
                                         clock=lambda: clock[0], sleep=sleep, poll=2)
    assert not quiet and load == 2.5


def test_run_all_reports_a_failure_and_kills_only_the_timed_out_group(tmp_path):
    assert run_all.run_one("no_such_bench", ["sh", "-c", "exit 3"],
                           30) == "failed (exit status 3)"
    assert run_all.run_one("no_such_bench", ["true"], 30) == "exited 0 but wrote no record"
    pid_file = tmp_path / "pid"
    hang = f"sleep 60 & echo $! > {shlex.quote(str(pid_file))}; wait"
    why = run_all.run_one("no_such_bench", ["sh", "-c", hang], 1)
    assert why.startswith("timed out")
    stat = Path(f"/proc/{int(pid_file.read_text())}/stat")
    for _ in range(50):  # the benchmark's own child is killed too (gone, or a zombie)
        if not stat.exists() or stat.read_text().rsplit(")", 1)[1].split()[0] == "Z":
            break
        __import__("time").sleep(0.1)
    else:
        raise AssertionError("the timed-out benchmark's child still runs")


def test_run_all_waits_for_the_benchmark_lock(tmp_path):
    lock = tmp_path / "lock"
    held = run_all.take_lock(1, lock)
    assert held is not None
    try:
        assert run_all.take_lock(0, lock) is None  # held by another open file
    finally:
        held.close()
    again = run_all.take_lock(0, lock)
    assert again is not None
    again.close()


def test_before_after_judges_each_row_the_way_its_target_says_is_better():
    """A time ratio (target ``<= 1.2``) that fell is a gain, not a loss; a
    speed ratio (``>= 2.0``) that fell outside the spread is a loss; a row
    with no target of its own is context, never judged."""
    import before_after

    time_ratio = before_after.judge("spark", [0.44, 0.43], [0.34, 0.33], "<= 1.2")
    assert time_ratio["better"] == "lower" and time_ratio["gain"] > 1 and time_ratio["met"]
    slower = before_after.judge("hogwild", [2.6, 2.5], [2.0, 1.9], ">= 2.0")
    assert slower["gain"] < 1 and slower["met"] is False
    within = before_after.judge("hogwild", [2.6, 2.0], [2.1, 1.9], ">= 2.0")
    assert within["gain"] < 1 and within["met"] is True  # the ranges overlap
    assert before_after.judge("ddp", [7.0], [7.5], None)["met"] is None


def test_a_ratio_near_one_keeps_the_digits_that_tell_it_from_one():
    # 3 significant digits would print 1.0049 and 0.9967 as "1" and "0.997"
    assert render._num(1.0049) == "1.0049" and render._num(0.9967) == "0.9967"
    assert render._num(1.0) == "1" and render._num(1.62) == "1.62"
    assert render._num(0.00164) == "0.00164" and render._num(15641.2) == "15,641"

"""Components declare their options; third-party ones plug in (issue 11).

The plug-in in ``tests/plugin_example`` is a real package: the fixture
installs it with pip into a folder that it puts on the path, as an
installed package would be, and its strategy, rule and problem are then
found through their entry points.
"""
import json
import re
import subprocess
from pathlib import Path

import numpy as np
import pytest

import monsoon
from monsoon.cli import build_parser, main
from monsoon.config import registries
from monsoon.docs import BEGIN, END, option_tables

ROOT = Path(__file__).resolve().parents[1]


def cli(*args):
    """``monsoon ARGS`` in this process (the ``plugin`` fixture has put the
    installed plug-in on the path): its exit code, stdout and stderr."""
    import contextlib
    import io

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(list(args))
        except SystemExit as exc:  # --help, and argparse's own refusals
            code = exc.code
    return subprocess.CompletedProcess(args, code, out.getvalue(), err.getvalue())


# -- third-party components ------------------------------------------------------

def test_plugin_components_appear_in_help(plugin):
    out = cli("train", "--help").stdout
    for text in ("clipped-sync", "--clip-norm", "signum", "--signum-beta", "noisy-line",
                 "--noise"):
        assert text in out, text
    assert "strategy: clipped-sync" in out  # grouped under the component that takes it


def test_plugin_components_run_from_the_cli_with_their_flags(plugin, tmp_path):
    out = tmp_path / "run"
    proc = cli("train", "--problem", "noisy-line", "--noise", "0.3", "--strategy",
               "clipped-sync", "--workers", "2", "--clip-norm", "0.5", "--rule", "signum",
               "--signum-beta", "0.5", "--lr", "0.01", "--epochs", "1", "--out", str(out),
               "--quiet")
    assert proc.returncode == 0, proc.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["strategy"] == "clipped-sync" and summary["rule"] == "signum"
    assert summary["clip_norm"] == 0.5 and summary["problem"] == "noisy-line"
    config = json.loads((out / "config.json").read_text())
    assert config["noise"] == 0.3 and config["signum_beta"] == 0.5 and config["clip_norm"] == 0.5
    assert config["server_rule"]["signum_beta"] == 0.5


@pytest.mark.parametrize("args,message", [
    (["--strategy", "clipped-sync", "--clip-norm", "-1"], "clip norm must be positive, got -1.0; fix --clip-norm"),
    (["--rule", "signum", "--signum-beta", "1.5"], "signum beta must be in [0, 1), got 1.5; fix --signum-beta"),
    (["--problem", "noisy-line", "--noise", "-2"], "noise must be 0 or more, got -2.0; fix --noise"),
])
def test_plugin_options_refuse_bad_values_naming_the_flag(plugin, tmp_path, args, message):
    proc = cli("train", "--workers", "2", *args, "--out", str(tmp_path / "x"))
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip() == f"monsoon: error: {message}"
    assert not (tmp_path / "x").exists()


def test_plugin_components_through_monsoon_train_and_compare(plugin, tmp_path):
    def run(strategy, backend="threads", **options):
        return monsoon.train("noisy-line", strategy, 2, dtype="float64", epochs=1, lr=0.05,
                             backend=backend, **options)

    sync = run("sync", backend="processes", noise=0.2)  # the plug-in imports in workers too
    unbound = run("clipped-sync", noise=0.2, clip_norm=1e9)
    np.testing.assert_allclose(unbound.params, sync.params, rtol=1e-12)
    clipped = run("clipped-sync", noise=0.2, clip_norm=1e-3)
    assert np.abs(clipped.params - sync.params).max() > 1e-3  # the clip bites
    other_data = run("sync", noise=2.0)
    assert other_data.summary["final_loss"] > 2 * sync.summary["final_loss"]
    with pytest.raises(monsoon.ConfigError, match="fix signum_beta="):
        run("sync", rule="signum", signum_beta=-1.0)

    comparison = monsoon.compare("noisy-line", "serial,clipped-sync", workers=2,
                                 out=tmp_path / "cmp", epochs=1, clip_norm=0.5,
                                 rule="signum", lr=0.01, backend="threads")
    assert set(comparison.results) == {"serial", "clipped-sync"}
    assert comparison.results["clipped-sync"].summary["clip_norm"] == 0.5
    assert "| clipped-sync | 2 |" in (tmp_path / "cmp" / "report.md").read_text()


def test_problem_option_is_refused_for_another_problem(plugin):
    with pytest.raises(monsoon.ConfigError,
                       match='noise= applies to problem="noisy-line" only; problem="exp" '
                             'does not take it'):
        monsoon.train("exp", "serial", noise=0.1)


# -- options the chosen components do not take -----------------------------------

@pytest.mark.parametrize("kwargs,message,python", [
    ({"strategy": "sync", "n_push": 4},
     "--n-push applies to --strategy async, ssp only; --strategy sync does not take it",
     'n_push= applies to strategy="async", "ssp" only; strategy="sync" does not take it'),
    ({"strategy": "serial", "momentum": 0.5},
     "--momentum applies to --rule momentum, nesterov only; --rule sgd does not take it",
     'momentum= applies to rule="momentum", "nesterov" only; rule="sgd" does not take it'),
    ({"strategy": "sync", "address": "auto"},
     "--address applies to --engine ray only; --engine local does not take it",
     'address= applies to engine="ray" only; engine="local" does not take it'),
    ({"strategy": "async", "engine": "sim", "timeout": 5.0},
     "does not take it", "does not take it"),
])
def test_an_option_no_chosen_component_takes_is_refused(kwargs, message, python):
    """The command line's refusal names flags (``cli``, which ``monsoon``
    sets); monsoon.train's named them too, flags its caller never typed."""
    strategy = kwargs.pop("strategy")
    for cli, said in ((True, message), (False, python)):
        with pytest.raises(monsoon.ConfigError) as info:
            monsoon.train("exp", strategy, 1 if strategy == "serial" else 2, epochs=1, cli=cli,
                          **kwargs)
        assert said in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize("kwargs,message", [
    # there is no --progress flag at all
    ({"progress": "no"}, "progress is a switch: pass True or False, not 'no' (progress=)"),
    ({"engine": "sim", "strategy": "async", "workers": 2, "sim_compute_s": -1},
     "compute time must be 0 or more, got -1; fix sim_compute_s="),
    ({"lr": "0.1"}, "learning rate must be a number, got '0.1'; fix lr="),
    ({"strategy": "sync", "workers": 2, "hogwild_beta": 0.5},
     'hogwild_beta= applies to strategy="serial", "hogwild" only; strategy="sync" does not '
     'take it'),
    # these named --resume, --no-error-feedback, --outer-momentum, --shards, --cuts,
    # --micro-batches and --stage-compute-s
    ({"resume": "/nonexistent-monsoon"},
     'resume="/nonexistent-monsoon": no checkpoints folder there'),
    ({"no_error_feedback": True},
     'no_error_feedback= applies to compressed runs only; add compress= (e.g. '
     'compress="topk:0.01"), or drop no_error_feedback='),
    ({"strategy": "local-sgd", "workers": 2, "outer_momentum": 0.5},
     "outer_momentum= is DiLoCo's outer momentum: add diloco=True, or drop outer_momentum= "
     "(plain averaging has none)"),
    ({"strategy": "async", "workers": 2, "shards": 1000},
     "shards=1000: exp has 49 parameters, and a shard holds at least one; use shards=49 or "
     "fewer"),
    ({"problem": "digits", "strategy": "pipeline", "workers": 2, "cuts": "3"},
     'cuts="3": cut points must increase and lie in 1..2 (the model has 3 layers)'),
    ({"problem": "digits", "strategy": "pipeline", "workers": 2, "micro_batches": 33,
      "batch_size": 32},
     "micro_batches=33 cannot cut a batch of 32 examples (a replica's part of "
     "batch_size=32); use micro_batches=32 or fewer, or a larger batch_size="),
    ({"problem": "digits", "strategy": "pipeline", "workers": 2, "engine": "sim",
      "sim_stage_compute_s": "1,2,3"},
     'sim_stage_compute_s="1,2,3" gives 3 stage time(s), but the pipeline has 2 stages; '
     "give 2, separated by commas"),
    ({"strategy": "serial", "engine": "sim", "shards": 2},
     "shards= splits the server's parameters; serial here has no server to split (its one "
     "worker updates the parameters itself): drop shards="),
])
def test_python_refusals_name_the_keyword_not_a_flag(tmp_path, kwargs, message):
    """monsoon.train's refusals named command-line flags its caller never
    typed (--compute-s, --beta, --strategy sync), and one that does not
    exist (--progress)."""
    kwargs = dict(kwargs)
    with pytest.raises(monsoon.ConfigError) as info:
        monsoon.train(kwargs.pop("problem", "exp"), steps=3, out=tmp_path / "r", **kwargs)
    assert str(info.value) == message
    assert not (tmp_path / "r").exists()


def test_compare_refusals_from_python_name_the_keyword(tmp_path):
    with pytest.raises(monsoon.ConfigError) as info:
        monsoon.compare("exp", "serial,sync", out=tmp_path / "c", resume=str(tmp_path / "x"),
                        steps=3)
    assert str(info.value).startswith(f'resume="{tmp_path / "x"}": give the compare\'s own '
                                      "folder, the out= it wrote")
    with pytest.raises(monsoon.ConfigError, match="fix sim_compute_s="):
        monsoon.compare("exp", "serial,async", out=tmp_path / "c", engine="sim", steps=3,
                        sim_compute_s=-1)


def test_cli_refuses_an_engine_option_in_one_line(tmp_path):
    code_and_err = _main(["train", "--problem", "digits", "--strategy", "sync", "--workers",
                          "2", "--run-name", "x", "--out", str(tmp_path / "r")])
    assert code_and_err == (2, "monsoon: error: --run-name applies to --engine ray only; "
                               "--engine local does not take it")
    assert not (tmp_path / "r").exists()


def test_compare_refuses_only_what_no_strategy_takes(tmp_path):
    result = monsoon.compare("exp", "serial,async", workers=2, out=tmp_path, epochs=1,
                             n_push=2)
    assert result.results["async"].summary["n_push"] == 2
    with pytest.raises(monsoon.ConfigError, match='n_push= applies to strategy="async", "ssp" '
                                                  'only; strategy="serial", "sync" does not'):
        monsoon.compare("exp", "serial,sync", workers=2, out=tmp_path / "b", epochs=1, n_push=2)


def _main(argv):
    import contextlib
    import io

    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = main(argv)
    return code, err.getvalue().strip()


# -- derived documentation ---------------------------------------------------------

def _readme_tables() -> str:
    text = (ROOT / "docs" / "options.md").read_text()
    return text[text.index(BEGIN) + len(BEGIN):text.index(END)].strip()


def test_readme_option_tables_are_current():
    assert _readme_tables() == option_tables(), \
        "docs/options.md's tables are stale: run python -m monsoon.docs docs/options.md"


def test_readme_option_tables_match_train_help():
    """Every flag of train's help and of compare's, and no other, is in
    the tables (compare's own, --strategies and --repeats, with its defaults)."""
    commands = build_parser()._subparsers._group_actions[0].choices

    def flags(command):
        return set(re.findall(r"(--[a-z][a-z-]*)", commands[command].format_help())) - {"--help"}

    compare_only = flags("compare") - flags("train")
    assert compare_only == {"--strategies", "--repeats"}
    in_readme = set(re.findall(r"`(--[a-z][a-z-]*)", _readme_tables()))
    assert flags("train") | compare_only == in_readme
    assert "`compare`: serial,sync,async,hogwild) |" in _readme_tables()
    assert "| `--repeats REPEATS` (`compare` only) | 1 |" in _readme_tables()
    args = commands["compare"].parse_args([])
    assert (args.strategies, args.repeats) == ("serial,sync,async,hogwild", 1)


def test_simulate_help_offers_only_what_simulate_takes(tmp_path):
    """simulate's help listed --engine ENGINE (default local), which it
    refuses, and the other engines' flags (--backend, --address, --master):
    it now offers the sim engine's only and says its own defaults, as
    docs/options.md does; the flags it does not offer are still refused in
    the run's words."""
    from monsoon.config import SIMULATE_DEFAULTS as sim

    commands = build_parser()._subparsers._group_actions[0].choices
    help_text = commands["simulate"].format_help()
    flags = set(re.findall(r"(--[a-z][a-z-]*)", help_text))
    engines = registries()["engine"]
    sims = {o.cli for o in engines.get("sim").options}
    others = {o.cli for o in engines.options().values()} - sims
    assert "--engine" not in flags and not flags & others, flags & (others | {"--engine"})
    assert sims <= flags and {"--backend", "--address", "--master"} <= others
    assert "--engine" in commands["train"].format_help()
    args = commands["simulate"].parse_args([])
    assert (args.strategy, args.problem, args.default_workers) == (
        sim["strategy"], sim["problem"], sim["workers"])
    for word in ("strategy", "problem", "workers"):
        assert f"(default {sim[word]}" in " ".join(help_text.split())
    tables = _readme_tables()
    assert f"| serial (`simulate`: {sim['strategy']}; " in tables
    assert f"| exp (`simulate`: {sim['problem']}) |" in tables
    assert f"| 2 (`simulate`: {sim['workers']}; " in tables
    assert f"| local (`simulate`: {sim['engine']}) |" in tables
    assert _main(["simulate", "--backend", "threads", "--out", str(tmp_path / "r")]) == (
        2, "monsoon: error: --backend applies to --engine local only; --engine sim does not "
           "take it")
    assert not (tmp_path / "r").exists()


def test_no_component_name_is_compared_in_config_cli_or_api():
    names = [n for r in ("strategy", "rule", "engine") for n in registries()[r].names()]
    alternatives = "|".join(re.escape(n) for n in names)
    compared = re.compile(rf"""(==|!=|\bin)\s*\(?\s*["']({alternatives})["']|"""
                          rf"""["']({alternatives})["']\s*(==|!=)""")
    for module in ("config.py", "cli.py", "api.py"):
        source = (ROOT / "monsoon" / module).read_text()
        assert not compared.search(source), (module, compared.search(source).group(0))


def test_plugin_engine_runs_strategies_with_its_own_option(plugin):
    serial = monsoon.train("exp", "serial", 1, epochs=2, dtype="float64")
    one = monsoon.train("exp", "hogwild", 1, engine="round-robin", epochs=2, dtype="float64")
    np.testing.assert_array_equal(one.params, serial.params)  # one worker: serial SGD exactly
    two = monsoon.train("exp", "hogwild", 2, engine="round-robin", quantum=3, epochs=2)
    assert two.summary["engine"] == "round-robin" and two.summary["updates"] == serial.summary["updates"]
    assert two.summary["final_loss"] < serial.history[0]["loss"]
    with pytest.raises(monsoon.ConfigError, match="round-robin engine cannot carry out AllReduce .*, which sync uses; engines that run sync: local"):
        monsoon.train("exp", "sync", 2, engine="round-robin", epochs=1)
    with pytest.raises(monsoon.ConfigError, match='quantum= applies to engine="round-robin" only'):
        monsoon.train("exp", "hogwild", 2, quantum=3, epochs=1)


def test_a_rule_that_is_not_a_Rule_is_refused_in_one_line(monkeypatch):
    """What engines ask of a rule is declared on ``Rule`` (full_batch,
    plain_step, device_arrays), so a plug-in rule must subclass it; one
    that does not is refused by name before anything runs."""
    from monsoon.rules import RULES

    class Bare:  # a rule's shape, not its class
        name = "bare"
        options = ()

    RULES._load()
    monkeypatch.setitem(RULES._plugins, "bare", Bare)
    with pytest.raises(monsoon.ConfigError, match="rule 'bare' does not follow the rule contract"):
        monsoon.train("logistic", "serial", 1, rule="bare", steps=2, progress=False)


def test_numpy_scalars_are_taken_as_the_numbers_they_are():
    """A sweep's values are often NumPy scalars (np.arange, np.float32
    arrays): they were refused ("learning rate must be a number, got
    np.float32(0.1)", "batch size must be a whole number, got np.int64(32)").
    They are the numbers they hold; what is no number, or not whole where
    a whole one is needed, is still refused."""
    run = monsoon.train("exp", "sync", np.int64(2), lr=np.float32(0.25),
                        batch_size=np.int64(32), steps=4, seed=np.uint32(3), evals=0,
                        progress=False)
    assert run.summary["workers"] == 2 and type(run.summary["workers"]) is int
    assert run.summary["lr"] == float(np.float32(0.25)) and run.summary["batch_size"] == 32
    assert run.summary["seed"] == 3
    for kwargs, message in [(dict(lr=np.True_), "must be a number"),
                            (dict(batch_size=np.float32(32.5)), "must be a whole number"),
                            (dict(lr=np.float32("inf")), "must be a finite number")]:
        with pytest.raises(monsoon.ConfigError, match=message):
            monsoon.train("exp", "serial", steps=4, progress=False, **kwargs)


# -- plug-ins that break the contract: one line each, and nothing else breaks -------

@pytest.fixture
def hand_plugin(tmp_path):
    """``hand_plugin(source, entry_points)`` installs, by hand, a package
    ``monsoon_hand_plugin`` of that source whose dist-info holds those
    entry points (entry_points.txt), on the path for this test only."""
    import importlib
    import sys
    import textwrap

    from conftest import _reload

    site = tmp_path / "site"

    def install(source: str, entry_points: str) -> Path:
        info = site / "monsoon_hand_plugin-0.1.dist-info"
        info.mkdir(parents=True)
        (info / "METADATA").write_text("Metadata-Version: 2.1\nName: monsoon-hand-plugin\n"
                                       "Version: 0.1\n")
        (info / "entry_points.txt").write_text(textwrap.dedent(entry_points))
        (site / "monsoon_hand_plugin.py").write_text(textwrap.dedent(source))
        sys.path.insert(0, str(site))
        importlib.invalidate_caches()
        _reload()
        return site

    yield install
    if str(site) in sys.path:
        sys.path.remove(str(site))
    sys.modules.pop("monsoon_hand_plugin", None)
    _reload()


MISFITS = """
    import numpy as np
    from monsoon.problems import ProblemSpec
    from monsoon.strategies.sync import Sync

    def build(dtype="float32"):
        from monsoon.problems.linear import synthetic
        return synthetic("squared", n=256, features=4, dtype=dtype)

    SPEC = ProblemSpec("its-own-name", build, "a problem named otherwise by its entry point",
                       defaults={"lr": 0.1, "epochs": 1})

    class Plain:
        pass

    class Shadow(Sync):
        name = "sync"
"""


def test_a_plugin_that_names_the_wrong_kind_is_refused_in_one_line_and_nothing_else_breaks(
        hand_plugin, tmp_path):
    """A problem entry point naming a build function, not a ProblemSpec,
    broke every command, ``monsoon --help`` and runs of built-in problems
    included ("'function' object has no attribute 'usage'"); a strategy
    naming a plain class failed with "no attribute 'single_worker'". Each
    is refused in one line naming the plug-in, when it is asked for; a
    problem is listed by its entry point's name; a plug-in named like a
    built-in is skipped with a warning."""
    hand_plugin(MISFITS, """
        [monsoon.problems]
        plain-build = monsoon_hand_plugin:build
        renamed = monsoon_hand_plugin:SPEC
        [monsoon.strategies]
        plain = monsoon_hand_plugin:Plain
        sync = monsoon_hand_plugin:Shadow
        [monsoon.rules]
        plain-rule = monsoon_hand_plugin:Plain
        [monsoon.engines]
        plain-engine = monsoon_hand_plugin:Plain
        [monsoon.compressors]
        plain-compressor = monsoon_hand_plugin:Plain
    """)
    helped = cli("train", "--help")
    assert helped.returncode == 0, helped.stderr
    listed = " ".join(helped.stdout.split())
    assert "renamed" in listed and "its-own-name" not in listed and "plain-build" not in listed
    assert helped.stderr.count("warning") == 1
    assert ("the strategy plug-in 'sync' (monsoon_hand_plugin:Shadow) is not used: sync is "
            "monsoon's own strategy") in helped.stderr
    ran = cli("train", "--problem", "exp", "--epochs", "1", "--quiet", "--out", str(tmp_path / "r"))
    assert ran.returncode == 0, ran.stderr
    renamed = cli("train", "--problem", "renamed", "--out", str(tmp_path / "n"), "--quiet")
    assert renamed.returncode == 0 and renamed.stdout.startswith("renamed serial"), renamed
    for args, kind, name, what in [
            (["--problem", "plain-build"], "problem", "plain-build",
             "monsoon_hand_plugin:build) is a function, not a monsoon.problems.ProblemSpec"),
            (["--strategy", "plain"], "strategy", "plain",
             "is the class Plain, not a subclass of monsoon.strategies.Strategy"),
            (["--rule", "plain-rule"], "rule", "plain-rule", "not a subclass of monsoon.rules.Rule"),
            (["--engine", "plain-engine"], "engine", "plain-engine",
             "not a subclass of monsoon.engines.Engine"),
            (["--compress", "plain-compressor"], "compressor", "plain-compressor",
             "not a subclass of monsoon.compressors.Compressor")]:
        out = tmp_path / name
        refused = cli("train", *args, "--epochs", "1", "--out", str(out))
        line = refused.stderr.splitlines()[-1]
        assert refused.returncode != 0 and "Traceback" not in refused.stderr, refused.stderr
        assert line.startswith(f"monsoon: error: the {kind} plug-in {name!r} ("), line
        assert what in line and "docs/extending.md" in line, line
        assert not out.exists()


def test_a_plugin_that_fails_to_load_says_what_to_fix(hand_plugin, tmp_path):
    """An entry point that failed to load ended "reinstall the package that
    provides it", wrong advice for a typo in the entry point itself. A typo
    in the module or the attribute is named as such; a module the plug-in
    imports that is not installed is named to install; any other import
    error names the plug-in's package as the place to fix it."""
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "monsoon_hand_plugin_dep.py").write_text("import no_such_dependency_xyz\n")
    (tmp_path / "site" / "monsoon_hand_plugin_bug.py").write_text(
        "raise RuntimeError('a bug on import')\n")
    hand_plugin("""
        from monsoon.strategies.sync import Sync

        class Real(Sync):
            name = "real"
    """, """
        [monsoon.strategies]
        module-typo = monsoon_hand_plugn:Real
        attr-typo = monsoon_hand_plugin:Reall
        dotted-typo = monsoon_hand_plugin:Real.Inner [extra]
        needs-dep = monsoon_hand_plugin_dep:Real
        raises = monsoon_hand_plugin_bug:Real
    """)
    for name, what in [
            ("module-typo", "names the module 'monsoon_hand_plugn', which is not installed: "
                            "fix the module in its entry point"),
            ("attr-typo", "names 'Reall', which the module 'monsoon_hand_plugin' does not "
                          "define: fix the name in its entry point"),
            ("dotted-typo", "names 'Real.Inner', which the module 'monsoon_hand_plugin' does "
                            "not define: fix the name in its entry point"),
            ("needs-dep", "needs the module 'no_such_dependency_xyz', which is not installed: "
                          "install it"),
            ("raises", "importing 'monsoon_hand_plugin_bug' raised RuntimeError: a bug on import; "
                       "fix it in the package that provides the plug-in")]:
        out = tmp_path / name
        refused = cli("train", "--strategy", name, "--epochs", "1", "--out", str(out))
        line = refused.stderr.splitlines()[-1]
        assert refused.returncode != 0 and "Traceback" not in refused.stderr, refused.stderr
        assert line.startswith(f"monsoon: error: the strategy plug-in {name!r} ("), line
        assert what in line and "reinstall" not in line, line
        assert not out.exists()
    helped = cli("train", "--help")
    assert helped.returncode == 0, helped.stderr


def test_a_plugin_rule_without_apply_is_refused_before_any_worker_starts(hand_plugin, tmp_path):
    """A Rule subclass without ``apply`` ran its workers into Rule.apply's
    bare NotImplementedError: "worker 1 failed, and this strategy needs
    every worker: NotImplementedError:" and a failed run folder. It is
    refused in one line before any worker or folder, and Rule.apply's own
    error, where a rule is called otherwise, says what is missing."""
    hand_plugin("""
        from monsoon.rules import Rule

        class NoApply(Rule):
            name = "no-apply"
    """, """
        [monsoon.rules]
        no-apply = monsoon_hand_plugin:NoApply
    """)
    for strategy in ("sync", "serial"):
        out = tmp_path / strategy
        refused = cli("train", "--strategy", strategy, "--rule", "no-apply", "--epochs", "1",
                      "--backend", "threads", "--out", str(out))
        assert refused.returncode != 0 and refused.stderr.count("\n") == 1, refused.stderr
        assert refused.stderr.startswith(
            "monsoon: error: rule 'no-apply' does not follow the rule contract: its class NoApply "
            "must define apply(w, g, state, info)"), refused.stderr
        assert not out.exists()
    from monsoon_hand_plugin import NoApply

    with pytest.raises(NotImplementedError, match="the rule 'no-apply' .NoApply. does not define apply"):
        NoApply.from_options(0.1).apply(np.zeros(2), np.ones(2), None, None)


def test_a_plugins_build_or_rule_init_mistake_is_one_line_naming_it(hand_plugin, tmp_path):
    """Contract mistakes that printed tracebacks: a problem build without
    ``dtype`` (TypeError), one returning a torch module (AttributeError
    'sgd_pass'), one raising its own error (a data file missing: the
    user's RuntimeError traceback), a rule whose __init__ lacks **common
    (TypeError 'staleness_lr' from Rule.from_options). Each is one line
    that names the plug-in and what to change; a well-formed one runs."""
    hand_plugin("""
        from monsoon.options import Option
        from monsoon.problems import ProblemSpec
        from monsoon.problems.linear import synthetic
        from monsoon.rules import Rule

        def no_dtype(size=64):
            return synthetic("squared", n=size, features=3)

        def module(dtype="float32"):
            import torch
            return torch.nn.Linear(3, 1)

        def raises(dtype="float32"):
            raise RuntimeError("cannot open my data file /nope/data.npy\\nsecond line")

        NO_DTYPE = ProblemSpec("no-dtype", no_dtype, options=(Option("size", int, 64, "rows"),))
        MODULE = ProblemSpec("module", module)
        RAISES = ProblemSpec("raises", raises)

        class NoCommon(Rule):
            options = Rule.options + (Option("nc_beta", float, 0.9, "beta"),)
            def __init__(self, schedule, nc_beta=0.9):
                super().__init__(schedule)
            def apply(self, w, g, state, info):
                w -= self.learning_rate(info) * g

        class Common(NoCommon):
            def __init__(self, schedule, nc_beta=0.9, **common):
                Rule.__init__(self, schedule, **common)
    """, """
        [monsoon.problems]
        no-dtype = monsoon_hand_plugin:NO_DTYPE
        module = monsoon_hand_plugin:MODULE
        raises = monsoon_hand_plugin:RAISES
        [monsoon.rules]
        no-common = monsoon_hand_plugin:NoCommon
        common = monsoon_hand_plugin:Common
    """)
    for args, line in [
            (["--problem", "no-dtype"], "the problem plug-in 'no-dtype' cannot be built: its build "
             "function must take dtype, size (got an unexpected keyword argument 'dtype')"),
            (["--problem", "module"], "the problem plug-in 'module' cannot be built: its build "
             "function returned a Linear, not a monsoon.problems.Problem"),
            (["--problem", "raises"], "the problem plug-in 'raises' failed to build: RuntimeError: "
             "cannot open my data file /nope/data.npy"),
            (["--rule", "no-common"], "rule 'no-common' does not follow the rule contract: its "
             "__init__(schedule, ...) must take **common")]:
        out = tmp_path / "run"
        refused = cli("train", *args, "--epochs", "1", "--out", str(out))
        assert refused.returncode != 0 and refused.stderr.count("\n") == 1, refused.stderr
        assert refused.stderr.startswith(f"monsoon: error: {line}"), refused.stderr
        assert not out.exists()
    ran = cli("train", "--rule", "common", "--nc-beta", "0.5", "--epochs", "1", "--quiet",
              "--out", str(tmp_path / "common"))
    assert ran.returncode == 0, ran.stderr

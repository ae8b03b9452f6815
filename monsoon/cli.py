"""The ``monsoon`` command line: ``train`` and ``compare`` (DESIGN.md's contract).

Errors in the input print one line, ``monsoon: error: ...``, and exit with
status 2, before any worker starts. A run that fails (a worker error,
divergence, a timeout) prints one line and exits with status 1.
"""
from __future__ import annotations

import argparse
import json
import sys

from . import __version__
from .engines import BACKENDS, engine_names
from .errors import MonsoonError, TrainingDiverged
from .problems import problem_names
from .rules import rule_names
from .strategies import strategy_names


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--problem", default="exp",
                   help=f"a catalog problem: {', '.join(problem_names())} (default exp)")
    p.add_argument("--workers", type=int, default=2, help="number of workers (default 2)")
    p.add_argument("--engine", default="local", help=f"one of: {', '.join(engine_names())}")
    p.add_argument("--backend", default="auto",
                   help=f"local engine: {', '.join(BACKENDS)}, or auto (threads for problems "
                        "with a compiled loop, else processes)")
    p.add_argument("--rule", default="sgd", help=f"update rule: {', '.join(rule_names())}")
    p.add_argument("--lr", type=float, help="learning rate (default: the problem's)")
    p.add_argument("--lr-schedule", default="constant", help="constant or step")
    p.add_argument("--lr-gamma", type=float, default=0.1, help="step schedule: decay factor")
    p.add_argument("--lr-step-size", type=int, default=1000, help="step schedule: updates per decay")
    p.add_argument("--momentum", type=float, default=0.9, help="momentum rule: coefficient")
    budget = p.add_mutually_exclusive_group()
    budget.add_argument("--epochs", type=int, help="passes over the training set")
    budget.add_argument("--steps", type=int, help="gradient steps in total, over all workers")
    p.add_argument("--batch-size", type=int, help="examples per update (default: the problem's)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dtype", default="float32", help="float32 or float64")
    p.add_argument("--target-loss", type=float, help="report the time to reach this loss")
    p.add_argument("--shards", type=int, help="parameter-server shards (default: workers, at most 8)")
    p.add_argument("--n-fetch", type=int, default=1, help="async: steps between fetches")
    p.add_argument("--n-push", type=int, default=1, help="async: steps between pushes")
    p.add_argument("--beta", dest="hogwild_beta", type=float, default=0.9,
                   help="hogwild/serial on sparse problems: step size factor per epoch")
    p.add_argument("--backup-workers", type=int, default=0,
                   help="sync: extra workers; each step takes the first --workers gradients")
    p.add_argument("--staleness-lr", action="store_true",
                   help="divide the learning rate by each update's staleness (any rule)")
    p.add_argument("--dc-lambda", type=float,
                   help="dcasgd: lambda (default 0.04); dcasgd-a: lambda0 (default 2)")
    p.add_argument("--local-steps", type=int, default=8, help="local-sgd: steps between averages")
    p.add_argument("--diloco", action="store_true",
                   help="local-sgd: outer Nesterov step on the mean drift (DiLoCo)")
    p.add_argument("--outer-lr", type=float,
                   help="local-sgd: outer learning rate (default 1, or 0.7 with --diloco)")
    p.add_argument("--easgd-alpha", type=float, help="easgd: elastic force (default 0.9/workers)")
    p.add_argument("--easgd-tau", type=int, default=4, help="easgd: steps between exchanges")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds any wait may last")
    cluster = p.add_argument_group("ray engine (--engine ray)")
    cluster.add_argument("--address", help="join this Ray cluster (auto or HOST:PORT); "
                         "default: start a local Ray instance")
    cluster.add_argument("--checkpoint-every", type=int, default=0,
                         help="write shard checkpoints every K updates into OUT/checkpoints")
    cluster.add_argument("--resume", help="continue from the checkpoints of this run folder")
    cluster.add_argument("--run-name", help="names the actors monsoon-NAME-worker-K (default random)")
    sim = p.add_argument_group("sim engine (--engine sim, or monsoon simulate)")
    sim.add_argument("--compute-s", dest="sim_compute_s", type=float, default=1e-3,
                     help="seconds per gradient (default 0.001)")
    sim.add_argument("--compute-sigma", dest="sim_compute_sigma", type=float, default=0.0,
                     help="lognormal spread of compute time (0: constant)")
    sim.add_argument("--straggler-p", dest="sim_straggler_p", type=float, default=0.0,
                     help="probability that a step is --straggler-factor times slower")
    sim.add_argument("--straggler-factor", dest="sim_straggler_factor", type=float, default=10.0)
    sim.add_argument("--slow-fraction", dest="sim_slow_fraction", type=float, default=0.0,
                     help="fraction of workers always --straggler-factor times slower")
    sim.add_argument("--latency-s", dest="sim_latency_s", type=float, default=0.0,
                     help="seconds per message, before bandwidth")
    sim.add_argument("--bandwidth", dest="sim_bandwidth", type=float, default=0.0,
                     help="bytes per second per message (0: infinite)")
    sim.add_argument("--service-s", dest="sim_service_s", type=float, default=0.0,
                     help="seconds a server shard spends on each request")
    p.add_argument("--quiet", action="store_true", help="no progress bar")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="monsoon", description=(
        "Parallel and distributed SGD behind one switch: "
        f"{', '.join(strategy_names())}."))
    parser.add_argument("--version", action="version", version=f"monsoon {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    train = sub.add_parser("train", help="train one problem with one strategy")
    _common(train)
    train.add_argument("--strategy", default="serial", help=f"one of: {', '.join(strategy_names())}")
    train.add_argument("--out", default=None, help="run folder (default runs/PROBLEM-STRATEGY)")
    simulate = sub.add_parser("simulate", help="train on the sim engine: a virtual cluster "
                              "(time is simulated, the math is real)")
    _common(simulate)
    simulate.add_argument("--strategy", default="async",
                          help=f"one of: {', '.join(strategy_names())}")
    simulate.add_argument("--out", default=None, help="run folder (default runs/sim-PROBLEM-STRATEGY)")
    simulate.set_defaults(problem="logistic", workers=64)  # clusters want more examples
    compare = sub.add_parser("compare", help="the same problem under several strategies")
    _common(compare)
    compare.add_argument("--strategies", default="serial,sync,async,hogwild",
                         help="comma-separated (default serial,sync,async,hogwild)")
    compare.add_argument("--out", default=None, help="output folder (default runs/compare-PROBLEM)")
    return parser


def _options(args) -> dict:
    keys = ("engine", "backend", "rule", "lr", "lr_schedule", "lr_gamma", "lr_step_size",
            "momentum", "epochs", "steps", "batch_size", "seed", "dtype", "target_loss", "shards",
            "n_fetch", "n_push", "timeout", "hogwild_beta", "backup_workers", "staleness_lr", "local_steps",
            "diloco", "outer_lr", "easgd_alpha", "easgd_tau", "dc_lambda", "sim_compute_s",
            "sim_compute_sigma", "sim_straggler_p", "sim_straggler_factor", "sim_slow_fraction",
            "sim_latency_s", "sim_bandwidth", "sim_service_s", "address", "checkpoint_every",
            "resume", "run_name")
    options = {k: getattr(args, k) for k in keys}
    options["progress"] = False if args.quiet else None
    return options


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    from .api import train
    from .compare import compare

    try:
        if args.command in ("train", "simulate"):
            workers = 1 if args.strategy == "serial" else args.workers
            options = _options(args)
            prefix = "runs/"
            if args.command == "simulate":
                options["engine"], prefix = "sim", "runs/sim-"
            out = args.out or f"{prefix}{args.problem.replace(':', '_')}-{args.strategy}"
            result = train(args.problem, args.strategy, workers, out=out, **options)
            s = result.summary
            clock = "simulated" if s["engine"] == "sim" else "wall"
            print(f"{s['problem']} {s['strategy']} x{s['workers']}: final_loss {s['final_loss']:.6g}, "
                  f"{s['examples_per_s']:.4g} examples/s, {clock} {s['wall_time_s']:.3g} s "
                  f"(+{s['startup_s']:.2g} s start-up)")
            if "utilization" in s:
                u = s["utilization"]
                print(f"utilization: workers {u['workers']:.1%}, server shards {u['shards']:.1%}; "
                      f"simulated in {s['real_time_s']:.3g} s")
            if s["failed_workers"]:
                print("failed workers: " + json.dumps(s["failed_workers"]))
            print(f"run folder: {result.run_dir}")
        else:
            out = args.out or f"runs/compare-{args.problem.replace(':', '_')}"
            comparison = compare(args.problem, args.strategies, args.workers, out=out,
                                 **_options(args))
            print((comparison.out / "report.md").read_text())
            print(f"report: {comparison.out / 'report.md'}  plot: {comparison.out / 'comparison.png'}")
    except TrainingDiverged as exc:
        print(f"monsoon: {exc}", file=sys.stderr)
        return 1
    except MonsoonError as exc:
        code = 2 if isinstance(exc, ValueError) else 1
        print(f"monsoon: error: {exc}", file=sys.stderr)
        return code
    except KeyboardInterrupt:
        print("monsoon: interrupted", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())

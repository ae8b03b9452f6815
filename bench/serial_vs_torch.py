"""monsoon ``serial`` against the plain PyTorch loop a user would write
instead, on the sync sweep's shapes (MLPs from 64 to 2048 wide, batches from
32 to 1024, a small CNN), both in this process with torch's default thread
count (one per core), as a user runs them.

monsoon runs ``monsoon.train(problem, "serial", ...)`` at its defaults (loss
curve on); its examples/s come from the loss-curve rows after the first 3
steps. The peer is ``ddp_peer.one_process_examples_per_s``: zero_grad,
forward, backward, ``opt.step()`` on the same batches' sizes, after the same
3 steps. Interleaved, ``--repeats`` times; printed per shape: both medians
and serial/plain (target >= 0.9 on every shape).

    python bench/serial_vs_torch.py [--repeats 3] [--quick]
"""
import argparse

import numpy as np
import torch
from torch import nn

from common import interleave, median, report
from ddp_peer import one_process_examples_per_s
from records import row, write_record
from sync_sweep import LR, SHAPES, data, monsoon_rate

TARGET = 0.9


def plain(make_model, batch, steps) -> float:
    return one_process_examples_per_s(make_model, data, nn.CrossEntropyLoss(), batch, LR, steps,
                                      torch.get_num_threads())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="a quarter of the steps, 1 repeat")
    ap.add_argument("--shapes", default=",".join(SHAPES), help="comma-separated subset")
    args = ap.parse_args()
    repeats = 1 if args.quick else args.repeats
    rows, extra, records, worst = [], {}, [], (None, np.inf)
    for name in args.shapes.split(","):
        make_model, batch, steps = SHAPES[name]
        steps = max(8, steps // 4) if args.quick else steps
        print(f"{name}:", flush=True)
        times = interleave({"serial": lambda: monsoon_rate(make_model, batch, steps,
                                                           "serial", 1),
                            "plain": lambda: plain(make_model, batch, steps)}, repeats)
        m = {k: median(v) for k, v in times.items()}
        ratio = m["serial"] / m["plain"]
        rows.append((f"{name} examples/s serial / plain, ratio",
                     f"{m['serial']:.0f} / {m['plain']:.0f}, {ratio:.2f}"))
        extra[name] = {**times, "ratio": ratio}
        records.append(row(f"{name} serial / plain loop", times["serial"], times["plain"], ratio,
                           f">= {TARGET}", ratio >= TARGET, unit="examples/s",
                           ratio_runs=[v / m["plain"] for v in times["serial"]]))
        worst = min(worst, (name, ratio), key=lambda t: t[1])
    rows.append(("worst serial/plain", f"{worst[1]:.2f} ({worst[0]})   (target >= {TARGET})"))
    threads = torch.get_num_threads()
    report(f"monsoon serial vs a plain PyTorch loop ({threads} torch threads), median of "
           f"{repeats}", rows, extra)
    write_record("serial_vs_torch", vars(args), records, {
        "ratio": worst[1], "target": f">= {TARGET} every shape", "met": worst[1] >= TARGET,
        "torch_threads": threads,
        "line": f"worst shape: serial at {worst[1]:.2f}x a plain PyTorch loop's examples/s "
                f"({worst[0]}, {threads} torch threads; target >= {TARGET})"})


if __name__ == "__main__":
    main()

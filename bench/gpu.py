"""GPU workers (``--device cuda``) against a plain PyTorch training loop.

A ResNet-18-sized CNN (the CIFAR variant: 3x3 stem, no max-pool, BasicBlocks
[2, 2, 2, 2] of 64-512 channels, 11.2M parameters) on synthetic 3x32x32
images of 10 classes, batch 256, plain SGD, float32. Rows:

- ``serial``: monsoon serial on one GPU against the plain loop on the same
  GPU (data on the GPU, a random batch per step, forward, backward,
  ``torch.optim.SGD``, the loss read back every step as monsoon reports it).
  Target: >= 0.95x the plain loop's images/s.
- ``sync x2``: sync with 2 towers on that one GPU (reported against the loop).
- ``async x2``: async with 2 GPU workers (cuda:0 and cuda:1 where there are
  two GPUs, else both on one) (reported against the loop).

monsoon's figure is its summary's ``examples_per_s`` (the run without its
start-up); the loop's is timed from its first step to a synchronised end.
One warm-up run of each first (CUDA context, cuDNN's algorithm choice);
then the peers alternate and the medians are recorded (bench/records.py).
Without a CUDA device it prints one line and exits 0 with no record.

    python bench/gpu.py [--steps 60] [--repeats 3] [--images 8192]
"""
from __future__ import annotations

import argparse
import sys
import time

import numpy as np
import torch
from torch import nn

BATCH, LR, CLASSES = 256, 0.05, 10


class Block(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.short = nn.Sequential()
        if stride != 1 or cin != cout:
            self.short = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                       nn.BatchNorm2d(cout))

    def forward(self, x):
        out = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(self.bn2(self.conv2(out)) + self.short(x))


def resnet18() -> nn.Module:
    layers, cin = [nn.Conv2d(3, 64, 3, 1, 1, bias=False), nn.BatchNorm2d(64), nn.ReLU()], 64
    for cout, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
        layers += [Block(cin, cout, stride), Block(cout, cout, 1)]
        cin = cout
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(512, CLASSES)]
    return nn.Sequential(*layers)


def data(images: int):
    g = torch.Generator().manual_seed(0)
    X = torch.randn(images, 3, 32, 32, generator=g)
    y = torch.randint(0, CLASSES, (images,), generator=g)
    return X, y


def plain_loop(X, y, steps: int, device: str = "cuda:0") -> float:
    """Images/s of the loop a PyTorch user writes, on ``device``."""
    torch.manual_seed(0)
    model = resnet18().to(device)
    Xd, yd = X.to(device), y.to(device)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    loss_fn = nn.CrossEntropyLoss()
    rng = np.random.default_rng(0)
    batches = [torch.from_numpy(rng.choice(len(X), BATCH, replace=False)).to(device)
               for _ in range(steps)]
    model.train()
    torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    for idx in batches:
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(Xd.index_select(0, idx)), yd.index_select(0, idx))
        loss.backward()
        opt.step()
        float(loss)  # the loss of every step, as monsoon reads it
    torch.cuda.synchronize(device)
    return steps * BATCH / (time.perf_counter() - t0)


def monsoon_run(X, y, strategy: str, workers: int, device: str, steps: int) -> float:
    import monsoon

    torch.manual_seed(0)
    problem = monsoon.TorchProblem(resnet18(), nn.CrossEntropyLoss(), X, y, name="resnet18")
    run = monsoon.train(problem, strategy, workers, steps=steps, batch_size=BATCH, lr=LR,
                        evals=0, progress=False, device=device, seed=0)
    return run.summary["examples_per_s"]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--images", type=int, default=8192)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("bench/gpu.py: no CUDA device here (torch.cuda.is_available() is False); "
              "nothing measured, no record written")
        return 0
    sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parent))
    from common import interleave, median
    from records import figure, write_record

    X, y = data(args.images)
    gpus = torch.cuda.device_count()
    runs = {
        "plain": lambda: plain_loop(X, y, args.steps),
        "serial": lambda: monsoon_run(X, y, "serial", 1, "cuda:0", args.steps),
        "sync x2": lambda: monsoon_run(X, y, "sync", 2, "cuda:0", args.steps),
        "async x2": lambda: monsoon_run(X, y, "async", 2, "cuda", args.steps),
    }
    for fn in runs.values():  # warm-up: CUDA context, cuDNN's algorithm choice
        fn()
    results = interleave(runs, args.repeats)
    plain = results["plain"]
    rows = []
    for name in ("serial", "sync x2", "async x2"):
        ratios = [a / b for a, b in zip(results[name], plain)]
        row = {"name": name, "ours": figure(results[name]), "peer": figure(plain),
               "ratio": median(ratios), "ratio_runs": ratios, "unit": "images/s",
               "peer_name": "plain PyTorch loop on cuda:0"}
        if name == "serial":
            row.update(target=">= 0.95", met=median(ratios) >= 0.95)
        rows.append(row)
        print(f"{name:>9}: {median(results[name]):9.0f} images/s  "
              f"({median(ratios):.2f}x the plain loop's {median(plain):.0f})")
    serial = rows[0]
    write_record("gpu", {"steps": args.steps, "repeats": args.repeats, "images": args.images,
                         "batch": BATCH, "gpus": gpus,
                         "device": torch.cuda.get_device_name(0)}, rows,
                 {"ratio": serial["ratio"], "target": ">= 0.95", "met": serial["met"],
                  "line": f"serial on a GPU: {serial['ratio']:.2f}x a plain PyTorch loop's "
                          f"images/s (target >= 0.95)"})
    return 0


if __name__ == "__main__":
    sys.exit(main())

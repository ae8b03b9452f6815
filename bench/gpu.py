"""GPU workers (``--device cuda``) against a plain PyTorch training loop.

Three shapes, float32, plain SGD, synthetic data already on the GPU:

- ``resnet18-b256``: a ResNet-18 (the CIFAR variant: 3x3 stem, no max-pool,
  BasicBlocks [2, 2, 2, 2] of 64-512 channels, 11.2M parameters) on
  3x32x32 images of 10 classes, batch 256;
- ``mlp38m-b512``: an MLP 1024-4096-4096-4096-1024-10 (37.8M parameters),
  batch 512: where a host round trip of the parameters hurts most;
- ``mlp-small-b64``: an MLP 784-256-256-10, batch 64: a step dominated by
  kernel launches.

Rows per shape, each against the plain loop on the same GPU (data on the
GPU, a random batch per step, forward, backward, ``torch.optim.SGD``, the
loss read back every step as monsoon reports it):

- ``serial`` (target >= 0.95x);
- ``sync x2``: 2 towers on one GPU (target >= 0.90x);
- ``bf16``: serial under ``--precision bf16`` against the plain loop under
  ``torch.autocast(bfloat16)`` (target >= 0.95x);
- ``hogwild x2``: 2 threads updating one device tensor in place (seed 002:
  do concurrent steps use capacity one stream leaves idle? reported);
- ``torch nccl x1``: the torch engine on NCCL with 1 rank against DDP on
  NCCL with 1 rank in this process (target >= 0.95x; ``--no-nccl`` skips).

monsoon's figure is its summary's ``examples_per_s`` (the run without its
start-up); the loop's is timed from its first step to a synchronised end.
One warm-up run of each first (CUDA context, cuDNN's algorithm choice);
then the peers alternate and the medians are recorded (bench/records.py).
Without a CUDA device it prints one line and exits 0 with no record.

    python bench/gpu.py [--steps 60] [--repeats 3] [--shapes a,b] [--quick] [--no-nccl]
"""
from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time

import numpy as np
import torch
from torch import nn

LR, CLASSES = 0.05, 10


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


def mlp(widths) -> nn.Module:
    layers = []
    for a, b in zip(widths[:-1], widths[1:]):
        layers += [nn.Linear(a, b), nn.ReLU()]
    return nn.Sequential(*layers[:-1])


# name -> (model, input shape, batch, examples)
SHAPES = {
    "resnet18-b256": (resnet18, (3, 32, 32), 256, 8192),
    "mlp38m-b512": (lambda: mlp([1024, 4096, 4096, 4096, 1024, CLASSES]), (1024,), 512, 16384),
    "mlp-small-b64": (lambda: mlp([784, 256, 256, CLASSES]), (784,), 64, 8192),
}


def data(shape, examples: int):
    g = torch.Generator().manual_seed(0)
    X = torch.randn(examples, *shape, generator=g)
    y = torch.randint(0, CLASSES, (examples,), generator=g)
    return X, y


def _batches(n: int, batch: int, steps: int, device):
    rng = np.random.default_rng(0)
    return [torch.from_numpy(rng.choice(n, batch, replace=False)).to(device)
            for _ in range(steps)]


def plain_loop(make, X, y, batch, steps, bf16=False, ddp=False, device="cuda:0") -> float:
    """Examples/s of the loop a PyTorch user writes, on ``device`` (under
    bf16 autocast, or wrapped in DDP on NCCL with one rank)."""
    torch.manual_seed(0)
    model = make().to(device)
    if ddp:
        model = nn.parallel.DistributedDataParallel(model, device_ids=[torch.device(device)])
    Xd, yd = X.to(device), y.to(device)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    loss_fn = nn.CrossEntropyLoss()
    batches = _batches(len(X), batch, steps, device)
    cast = (torch.autocast("cuda", dtype=torch.bfloat16) if bf16
            else contextlib.nullcontext())
    model.train()
    torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    for idx in batches:
        opt.zero_grad(set_to_none=True)
        with cast:
            loss = loss_fn(model(Xd.index_select(0, idx)), yd.index_select(0, idx))
        loss.backward()
        opt.step()
        float(loss)  # the loss of every step, as monsoon reads it
    torch.cuda.synchronize(device)
    return steps * batch / (time.perf_counter() - t0)


@contextlib.contextmanager
def one_rank_group():
    """A one-rank NCCL process group in this process (DDP's peer)."""
    import torch.distributed as dist

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29533")
    dist.init_process_group("nccl", rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def monsoon_run(make, X, y, batch, steps, strategy="serial", workers=1, **options) -> float:
    import monsoon

    torch.manual_seed(0)
    problem = monsoon.TorchProblem(make(), nn.CrossEntropyLoss(), X, y, name="gpu-bench")
    run = monsoon.train(problem, strategy, workers, steps=steps, batch_size=batch, lr=LR,
                        evals=0, progress=False, seed=0, **options)
    return run.summary["examples_per_s"]


TARGETS = {"serial": 0.95, "sync x2": 0.90, "bf16": 0.95, "torch nccl x1": 0.95}


def shape_runs(name: str, steps: int, nccl: bool) -> dict:
    make, shape, batch, examples = SHAPES[name]
    X, y = data(shape, examples)
    gpu = dict(device="cuda:0")
    runs = {
        "plain": lambda: plain_loop(make, X, y, batch, steps),
        "serial": lambda: monsoon_run(make, X, y, batch, steps, **gpu),
        "sync x2": lambda: monsoon_run(make, X, y, batch, steps, "sync", 2, **gpu),
        "plain bf16": lambda: plain_loop(make, X, y, batch, steps, bf16=True),
        "bf16": lambda: monsoon_run(make, X, y, batch, steps, precision="bf16", **gpu),
        "hogwild x2": lambda: monsoon_run(make, X, y, batch, steps, "hogwild", 2, **gpu),
    }
    if nccl:
        def ddp():
            with one_rank_group():
                return plain_loop(make, X, y, batch, steps, ddp=True)
        runs["ddp nccl x1"] = ddp
        runs["torch nccl x1"] = lambda: monsoon_run(make, X, y, batch, steps, "sync", 1,
                                                    engine="torch", dist_backend="nccl",
                                                    device="cuda", timeout=120)
    return runs


PEERS = {"bf16": "plain bf16", "torch nccl x1": "ddp nccl x1"}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--quick", action="store_true", help="30 steps, 2 repeats")
    ap.add_argument("--no-nccl", action="store_true", help="skip the torch engine and DDP")
    args = ap.parse_args()
    if args.quick:
        args.steps, args.repeats = 30, 2
    if not torch.cuda.is_available():
        print("bench/gpu.py: no CUDA device here (torch.cuda.is_available() is False); "
              "nothing measured, no record written")
        return 0
    sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parent))
    from common import interleave, median
    from records import figure, write_record

    rows, worst = [], None
    for name in args.shapes.split(","):
        runs = shape_runs(name, args.steps, not args.no_nccl)
        for label, fn in runs.items():  # warm-up: CUDA context, cuDNN's algorithm choice
            try:
                fn()
            except Exception as exc:  # noqa: BLE001 - a row that fails is reported, not fatal
                print(f"{name} {label}: failed in its warm-up: {type(exc).__name__}: {exc}")
                runs[label] = None
        results = interleave({k: f for k, f in runs.items() if f is not None}, args.repeats)
        for label in [k for k in runs if not k.startswith(("plain", "ddp"))]:
            peer = PEERS.get(label, "plain")
            if label not in results or peer not in results:
                rows.append({"name": f"{name} {label}", "failed": True})
                continue
            ratios = [a / b for a, b in zip(results[label], results[peer])]
            ratio = median(ratios)
            row = {"name": f"{name} {label}", "ours": figure(results[label]),
                   "peer": figure(results[peer]), "ratio": ratio, "ratio_runs": ratios,
                   "unit": "examples/s", "peer_name": peer}
            if label in TARGETS:
                row.update(target=f">= {TARGETS[label]}", met=ratio >= TARGETS[label])
                if worst is None or ratio / TARGETS[label] < worst[1]:
                    worst = (row["name"], ratio / TARGETS[label], ratio, TARGETS[label])
            rows.append(row)
    print(f"\n{'row':<32} {'monsoon':>12} {'peer':>12} {'ratio':>7}  target")
    for row in rows:
        if row.get("failed"):
            print(f"{row['name']:<32} {'failed':>12}")
            continue
        print(f"{row['name']:<32} {row['ours']['median']:12.0f} {row['peer']['median']:12.0f} "
              f"{row['ratio']:7.2f}  {row.get('target', '(reported)')}")
    met = worst is not None and worst[1] >= 1 and not any(r.get("failed") for r in rows)
    line = (f"GPU ({torch.cuda.get_device_name(0)}): worst row {worst[0]} at {worst[2]:.2f}x "
            f"(target >= {worst[3]})" if worst else "GPU: no row measured")
    write_record("gpu", {"steps": args.steps, "repeats": args.repeats, "shapes": args.shapes,
                         "gpus": torch.cuda.device_count(), "torch": torch.__version__,
                         "device": torch.cuda.get_device_name(0)}, rows,
                 {"ratio": worst[2] if worst else None, "target": "each row's", "met": met,
                  "line": line})
    print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())

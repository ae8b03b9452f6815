"""A user's lazy Dataset: each item read from its own .npy file when asked
for, through a transform (importable by spawned workers and Ray actors)."""
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset


def write_files(folder, n=96, features=6, seed=0):
    """n examples of a planted regression, one .npy file per example."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    w = rng.normal(size=features)
    for i in range(n):
        x = rng.normal(size=features)
        np.save(folder / f"{i:05d}.npy", np.concatenate([x, [np.tanh(x @ w)]]))
    return folder


class Standardise:
    """The transform: scales the inputs by a constant, as a real one would."""

    def __init__(self, scale):
        self.scale = scale

    def __call__(self, x):
        return x * self.scale


class NpyFolder(Dataset):
    def __init__(self, folder, transform=None):
        self.files = sorted(str(p) for p in Path(folder).glob("*.npy"))
        self.transform = transform
        self.reads = 0

    def __len__(self):
        return len(self.files)

    def __getitem__(self, i):
        self.reads += 1
        row = np.load(self.files[i])
        x = torch.from_numpy(row[:-1])
        if self.transform is not None:
            x = self.transform(x)
        return x, torch.from_numpy(row[-1:])

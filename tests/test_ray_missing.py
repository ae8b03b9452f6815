"""Ray is optional: without it the ray engine says how to install it."""
import sys

import pytest

import monsoon


def test_missing_ray_gives_install_advice(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray now raises ImportError
    with pytest.raises(monsoon.ConfigError, match=r"pip install 'monsoon\[ray\]'"):
        monsoon.train("exp", "async", 2, engine="ray", epochs=1)

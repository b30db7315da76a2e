"""Without its library, importing an adapter is a one-line error naming the extra."""

from __future__ import annotations

import importlib
import sys

import pytest


def test_importing_without_ray_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("ray", "ray.train"):
        monkeypatch.setitem(sys.modules, name, None)
    monkeypatch.delitem(sys.modules, "adapters.ray", raising=False)
    with pytest.raises(ImportError, match=r"pip install 'train-eventbus\[ray\]'") as caught:
        importlib.import_module("adapters.ray")
    assert "\n" not in str(caught.value)


def test_importing_without_lightning_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("lightning", "lightning.pytorch", "lightning.fabric", "lightning.fabric.plugins"):
        monkeypatch.setitem(sys.modules, name, None)
    monkeypatch.delitem(sys.modules, "adapters.lightning", raising=False)
    with pytest.raises(ImportError, match=r"pip install 'train-eventbus\[lightning\]'") as caught:
        importlib.import_module("adapters.lightning")
    assert "\n" not in str(caught.value)

"""Test doubles that speak real protocols, so failure handling is tested end to end."""

from __future__ import annotations

from typing import Any

__all__ = ["MODES", "FakeLlamaServer"]


def __getattr__(name: str) -> Any:
    # Lazy, so `python -m tests.fakes.fake_llama_server` does not import the module twice.
    if name in __all__:
        from . import fake_llama_server

        return getattr(fake_llama_server, name)
    raise AttributeError(name)

"""The operator's web console at /ui: server-rendered pages over the same stores and keys as the API."""

from __future__ import annotations

from .routes import mount

__all__ = ["mount"]

"""The Python client: `MemoryClient` (sync) and `AsyncMemoryClient` (asyncio), on httpx and `contract/` only.

Importing it loads no part of the server (no FastAPI, storage, Chroma or model code); a test checks this.
Every failure is a `MemoryServiceError`; its subclasses (errors.py) say which kind.
"""

from .errors import (
    BadRequest,
    Conflict,
    Forbidden,
    MemoryServiceError,
    NotFound,
    RateLimited,
    Refused,
    Unauthorized,
    Unavailable,
)
from .memory_client import AsyncMemoryClient, MemoryClient

__all__ = [
    "AsyncMemoryClient",
    "BadRequest",
    "Conflict",
    "Forbidden",
    "MemoryClient",
    "MemoryServiceError",
    "NotFound",
    "RateLimited",
    "Refused",
    "Unauthorized",
    "Unavailable",
]

"""The Python client: `MemoryClient` (sync) and `AsyncMemoryClient` (asyncio), on httpx and `contract/` only.

Importing it loads no part of the server (no FastAPI, storage, Chroma or model code); a test checks this.
"""

from .core import MemoryServiceError
from .memory_client import AsyncMemoryClient, MemoryClient

__all__ = ["AsyncMemoryClient", "MemoryClient", "MemoryServiceError"]

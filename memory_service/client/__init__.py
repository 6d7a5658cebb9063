"""The Python client: `MemoryClient` (sync) and `AsyncMemoryClient` (asyncio), on httpx and `contract/` only.

Importing it loads no part of the server (no FastAPI, storage, Chroma or model code); a test checks this.
"""

from memory_service.client.core import MemoryServiceError
from memory_service.client.memory_client import AsyncMemoryClient, MemoryClient

__all__ = ["AsyncMemoryClient", "MemoryClient", "MemoryServiceError"]

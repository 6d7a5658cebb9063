"""The tests' name for the Chroma server helper, which lives with the benchmarks (they start one too)."""

from memory_service.bench.chroma_server import ChromaServer, chroma_command

__all__ = ["ChromaServer", "chroma_command"]

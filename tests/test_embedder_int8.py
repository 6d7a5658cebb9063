"""The default embedder (`onnx-q8`): the shipped MiniLM re-quantized on this machine for int8 arithmetic.

Real files throughout: the sha256-checked ONNX file of the installed package, onnxruntime's quantizer, and
the cache directory the service would use.
"""

from __future__ import annotations

import logging
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import pytest

from memory_service.embedding import int8_model
from memory_service.embedding.embedder import EmbedderError, OnnxEmbedder, load_embedder, shipped_onnx

SENTENCES = [
    "Melanie signed up for a pottery class last week and loved it.",
    "Deploy of checkout for Globex finished in 14 minutes on March 3.",
    "Who is on call for the payments service this weekend?",
    "Nadia asked for invoices by bank transfer within 30 days.",
]


@pytest.fixture(scope="module")
def shipped() -> OnnxEmbedder:
    return OnnxEmbedder(1)


@pytest.fixture(scope="module")
def derived_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    cache = tmp_path_factory.mktemp("cache")
    load_embedder("onnx-q8", cache_dir=cache)
    return cache


def _derived_file(cache: Path) -> Path:
    files = [p for p in (cache / "embedder").iterdir() if p.suffix == ".onnx"]
    assert len(files) == 1, files
    return files[0]


def test_the_derived_model_does_int8_arithmetic_but_keeps_the_down_projections_float(derived_dir: Path) -> None:
    graph = onnx.load(str(_derived_file(derived_dir))).graph
    ops = Counter(node.op_type for node in graph.node)
    # MiniLM-L6: 6 layers x (q, k, v, attention out, up) in int8; 6 down-projections (and the two
    # activation x activation products per layer) stay MatMul
    assert ops["MatMulInteger"] == 30
    weights = {init.name: list(init.dims) for init in graph.initializer}
    float_weight_matmuls = [n for n in graph.node if n.op_type == "MatMul" and n.input[1] in weights]
    assert len(float_weight_matmuls) == 6
    assert all(weights[n.input[1]] == [1536, 384] for n in float_weight_matmuls)


def test_its_vectors_stay_close_to_the_shipped_model(derived_dir: Path, shipped: OnnxEmbedder) -> None:
    derived = load_embedder("onnx-q8", cache_dir=derived_dir)
    a, b = derived.embed(SENTENCES), shipped.embed(SENTENCES)
    cosines = (a * b).sum(axis=1)
    assert cosines.min() >= 0.99, cosines
    assert np.allclose(np.linalg.norm(a, axis=1), 1.0, atol=1e-5)
    # and it still ranks as the shipped model does: each sentence's nearest neighbour is itself
    assert list((a @ b.T).argmax(axis=1)) == list(range(len(SENTENCES)))


@pytest.mark.parametrize("backend", ["onnx-q8", "onnx"])
def test_a_text_gets_the_same_vector_alone_or_among_others(derived_dir: Path, backend: str) -> None:
    # int8 activations are quantized with one scale per run: batching texts together used to move each
    # one's vector (cosine ~0.994), so a reindexed store ranked near-ties differently from the original
    embedder = load_embedder(backend, cache_dir=derived_dir)
    together = embedder.embed(SENTENCES)
    alone = np.stack([embedder.embed_one(text) for text in SENTENCES])
    assert np.array_equal(together, alone)
    assert np.array_equal(embedder.embed(SENTENCES[::-1])[::-1], together)


def test_the_onnx_vectors_are_the_sentence_transformers_vectors(shipped: OnnxEmbedder) -> None:
    # an independent reference (torch, the model's own pooling): catches tokenizer settings such as the
    # tokenizer file's padding to 128 tokens, which made every short text's vector mostly padding
    reference = load_embedder("torch").embed(SENTENCES + ["hi"])
    cosines = (shipped.embed(SENTENCES + ["hi"]) * reference).sum(axis=1)
    assert cosines.min() >= 0.99, cosines


def test_the_derived_model_is_made_once_and_reused(derived_dir: Path) -> None:
    path = _derived_file(derived_dir)
    before = path.stat().st_mtime_ns
    load_embedder("onnx-q8", cache_dir=derived_dir)
    assert path.stat().st_mtime_ns == before
    assert not [p for p in (derived_dir / "embedder").iterdir() if p.name.endswith(".unchecked")]


def test_a_derivation_that_strays_is_not_used_the_shipped_model_serves_and_says_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, shipped: OnnxEmbedder, caplog: pytest.LogCaptureFixture
) -> None:
    # the real derivation, held to a bar no quantized model meets: the check's refusal, with real files
    monkeypatch.setattr(int8_model, "MIN_PROBE_COSINE", 1.0001)
    with caplog.at_level(logging.WARNING, logger="memory_service"):
        embedder = load_embedder("onnx-q8", cache_dir=tmp_path)
    assert np.allclose(embedder.embed(SENTENCES), shipped.embed(SENTENCES), atol=1e-6)
    warning = " ".join(r.getMessage() for r in caplog.records if r.levelno == logging.WARNING)
    assert "cosine" in warning and "MEMORY_EMBEDDER=onnx" in warning
    assert list((tmp_path / "embedder").iterdir()) == [], "a refused model must not be left for the next start"


def test_both_weight_signs_stay_close_to_the_shipped_model(tmp_path: Path, shipped: OnnxEmbedder) -> None:
    """`u8` weights are what a CPU without VNNI gets; derived here too, so both recipes are checked."""
    for sign in ("s8", "u8"):
        path = tmp_path / f"{sign}.onnx"
        int8_model.derive(shipped_onnx(), path, sign)
        assert min(int8_model.probe_cosines(OnnxEmbedder(1, path=path), shipped)) >= int8_model.MIN_PROBE_COSINE


@pytest.mark.parametrize(
    ("flags", "sign"),
    [
        ("fpu sse avx2 fma avx512f avx512_vnni", "s8"),
        ("fpu avx2 avx_vnni", "s8"),
        ("fpu sse avx2 fma avx512f", "u8"),
        ("fpu sse avx2 fma", "u8"),
        (None, "u8"),
    ],
)
def test_signed_weights_only_where_the_cpu_multiplies_them_exactly(
    tmp_path: Path, flags: str | None, sign: str
) -> None:
    cpuinfo = tmp_path / "cpuinfo"
    if flags is not None:
        cpuinfo.write_text(f"processor\t: 0\nmodel name\t: Some CPU\nflags\t\t: {flags}\n\n")
    assert int8_model.weight_sign(cpuinfo) == sign


def test_an_unknown_backend_names_the_choices() -> None:
    with pytest.raises(EmbedderError, match="onnx-q8, onnx, torch"):
        load_embedder("onnx-fp16")


def test_a_cache_that_cannot_be_written_falls_back_to_the_shipped_model(
    tmp_path: Path, shipped: OnnxEmbedder, caplog: pytest.LogCaptureFixture
) -> None:
    blocked = tmp_path / "file-not-dir"
    blocked.write_text("")  # a file where the cache dir should be: not even root can make a dir under it
    with caplog.at_level(logging.WARNING, logger="memory_service"):
        embedder = load_embedder("onnx-q8", cache_dir=blocked)
    assert np.allclose(embedder.embed(SENTENCES[:1]), shipped.embed(SENTENCES[:1]), atol=1e-6)
    assert any("could not derive the int8 embedding model" in r.getMessage() for r in caplog.records)

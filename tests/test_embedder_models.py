"""The embedding model choice (MEMORY_EMBEDDER_MODEL) and the data dir's record of it: a new dir records its
model, an old dir without a record is the MiniLM's, an unset setting keeps the recorded model (a changed
default never mixes an old dir's vectors), a different setting warns, and `reindex` migrates the vectors and
the record. Real embedders, real SQLite and Chroma, no model server."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pytest

from memory_service.config import Settings
from memory_service.embedding.embedder import EmbedderError, load_embedder
from memory_service.embedding.models import DEFAULT_MODEL, MODELS
from memory_service.llm.runtime.server import free_port
from memory_service.ops.reindex import run_reindex
from memory_service.pipeline.passages import index_passages
from memory_service.services import Services
from memory_service.storage.datadir import EMBEDDER_FILE, DataDir

OTHER = "paraphrase-minilm-l3"
TEAM = "team-a"
TEXTS = [
    "The pilot boat Selkie berths at pier 4 every Tuesday morning.",
    "Invoice 5531 for Acme Corp was paid late, on 12 March.",
    "Melanie paints sunsets over the lake with watercolours.",
]


def settings(data_dir: Path, **more: str) -> Settings:
    return Settings(
        data_dir=data_dir, llm_url=f"http://127.0.0.1:{free_port()}", chroma_process=False, embedder="onnx", **more
    )


def old_data_dir(path: Path) -> DataDir:
    """A data dir as one made before the record existed: MiniLM passages, no embedder.json."""
    data = DataDir(path)
    data.prepare()
    journal = data.open_journal()
    vectors = data.open_vectors()
    try:
        memories = [
            journal.insert(
                team=TEAM, agent_id="a", text=text, run_id=None, tags=[], metadata={}, idempotency_key=None, budget_s=60
            )[0]
            for text in TEXTS
        ]
        index_passages(memories, load_embedder("onnx"), vectors)
        journal.mark_indexed([m.id for m in memories])
    finally:
        vectors.close()
        journal.close()
    return data


def top_similarity(data: DataDir, model: str, text: str) -> tuple[str, float]:
    """The stored passage nearest to `model`'s vector of `text`, and its similarity."""
    vectors = data.open_vectors()
    try:
        hit = vectors.query(TEAM, load_embedder("onnx", model=model).embed_one(text), 1, kind="passage")[0]
    finally:
        vectors.close()
    return hit.text, hit.similarity


def open_services(s: Settings) -> Services:
    return Services.open(s)


def test_a_new_data_dir_records_the_default_model(tmp_path: Path):
    services = open_services(settings(tmp_path / "data"))
    try:
        assert services.embedder.model_name == DEFAULT_MODEL
    finally:
        services.close()
    assert DataDir(tmp_path / "data").embedder_record() == DEFAULT_MODEL
    assert (tmp_path / "data" / EMBEDDER_FILE).stat().st_mode & 0o077 == 0


def test_a_new_data_dir_records_the_configured_model(tmp_path: Path):
    services = open_services(settings(tmp_path / "data", embedder_model=OTHER))
    try:
        assert services.embedder.model_name == OTHER
    finally:
        services.close()
    assert DataDir(tmp_path / "data").embedder_record() == OTHER


def test_an_old_data_dir_without_a_record_is_the_minilms(tmp_path: Path, caplog: pytest.LogCaptureFixture):
    data = old_data_dir(tmp_path / "data")
    assert not (data.path / EMBEDDER_FILE).exists()
    assert data.embedder_record() == "minilm"
    with caplog.at_level(logging.WARNING, logger="memory_service"):
        services = open_services(settings(data.path))
    try:
        assert services.embedder.model_name == "minilm"
    finally:
        services.close()
    assert "embedding model" not in caplog.text


def test_an_unset_model_keeps_the_one_the_vectors_were_made_with(tmp_path: Path):
    """What makes a new default safe: an existing dir whose record names another model keeps it."""
    data = DataDir(tmp_path / "data")
    data.prepare()
    data.record_embedder(OTHER)
    services = open_services(settings(data.path))
    try:
        assert services.embedder.model_name == OTHER
    finally:
        services.close()


def test_a_different_configured_model_serves_and_warns_that_vectors_are_mixed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
):
    data = old_data_dir(tmp_path / "data")
    with caplog.at_level(logging.WARNING, logger="memory_service"):
        services = open_services(settings(data.path, embedder_model=OTHER))
    try:
        assert services.embedder.model_name == OTHER
    finally:
        services.close()
    assert "'minilm'" in caplog.text and "memory-service reindex" in caplog.text
    assert data.embedder_record() == "minilm"  # only a reindex changes the record


def test_reindex_migrates_the_vectors_and_the_record(tmp_path: Path):
    data = old_data_dir(tmp_path / "data")
    question = "Which day does the Selkie come in?"
    # before: the vectors are the MiniLM's, so the other model's vector of a stored text is no exact match
    assert top_similarity(data, OTHER, TEXTS[1])[1] < 0.95
    summary = run_reindex(settings(data.path, embedder_model=OTHER))
    assert summary["embedder_model"] == OTHER and summary["passages_embedded"] == len(TEXTS)
    assert data.embedder_record() == OTHER
    for text in TEXTS:  # every stored vector is now the other model's
        assert top_similarity(data, OTHER, text) == (text, pytest.approx(1.0, abs=1e-4))
    assert top_similarity(data, OTHER, question)[0] == TEXTS[0]  # and recall finds by meaning with it


def test_a_team_reindex_leaves_the_record(tmp_path: Path):
    data = old_data_dir(tmp_path / "data")
    run_reindex(settings(data.path, embedder_model=OTHER), team=TEAM)
    assert data.embedder_record() == "minilm"  # other teams' vectors may still be the MiniLM's


def test_an_unknown_or_missing_model_is_a_clear_error():
    with pytest.raises(EmbedderError, match="choose one of: minilm"):
        load_embedder("onnx", model="bge-small")
    with pytest.raises(ValueError, match="embedder_model"):
        Settings(embedder_model="bge-small")


def test_the_registry_pins_every_model_and_only_a_verified_one_is_the_default():
    assert MODELS[DEFAULT_MODEL].verified
    for model in MODELS.values():
        assert len(model.sha256) == 64 and "==" in model.pip and model.dims == 384
        vectors = load_embedder("onnx", model=model.name).embed(TEXTS)
        assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)


def test_the_embedder_bench_measures_every_installed_model_beside_the_minilm(tmp_path: Path):
    from memory_service.bench.embedders import run

    turns = [{"speaker": "Ann", "dia_id": f"D1:{i + 1}", "text": text} for i, text in enumerate(TEXTS)]
    qa = [
        {"question": "Which day does the Selkie come in?", "answer": "Tuesday", "evidence": ["D1:1"], "category": 4},
        {"question": "What does Melanie paint?", "answer": "sunsets", "evidence": ["D1:3"], "category": 4},
    ]
    sample = {"sample_id": "s1", "conversation": {"session_1_date_time": "1:56 pm on 8 May, 2023", "session_1": turns}}
    path = tmp_path / "locomo.json"
    path.write_text(json.dumps([{**sample, "qa": qa}]))
    report = run(path, [OTHER, "minilm"], "onnx", queries=2)
    assert [r["model"] for r in report["results"]] == ["minilm", OTHER]  # the baseline first, once
    for r in report["results"]:
        assert r["questions"] == 2 and r["turns"] == len(TEXTS) and r["raw_turn_recall@10"] == 1.0  # 3 turns < 10
        assert r["query_ms_p50"] > 0 and r["index_texts_per_s"] > 0
    assert report["results"][0]["query_cost_vs_minilm"] == 1.0


def test_doctor_says_when_the_vectors_are_another_models(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
):
    import argparse

    from memory_service.ops.doctor import run_doctor
    from tests.fakes.fake_llama_server import FakeLlamaServer

    data = old_data_dir(tmp_path / "data")
    monkeypatch.setenv("MEMORY_DATA_DIR", str(data.path))
    monkeypatch.setenv("MEMORY_CACHE_DIR", str(tmp_path / "cache"))
    with FakeLlamaServer("ok", tokens_per_s=5000) as fake:
        run_doctor(argparse.Namespace(llm_url=fake.url, model=None, json=False))
        same = capsys.readouterr().out
        monkeypatch.setenv("MEMORY_EMBEDDER_MODEL", OTHER)
        run_doctor(argparse.Namespace(llm_url=fake.url, model=None, json=False))
        mixed = capsys.readouterr().out
    assert "OK    embedder: the vectors in" in same and "'minilm'" in same
    assert "WARN  embedder:" in mixed and "memory-service reindex" in mixed
    assert "RESULT: OK" not in mixed


def test_the_minilm_reference_weights_are_the_publishers_file():
    """What makes the default `verified`: the weights its ONNX vectors are checked against (test_embedder_int8)
    are byte for byte the publisher's model.safetensors."""
    import hashlib

    from memory_service.embedding.embedder import model_dir
    from memory_service.embedding.models import MINILM_WEIGHTS_SHA256

    assert hashlib.sha256((model_dir() / "model.safetensors").read_bytes()).hexdigest() == MINILM_WEIGHTS_SHA256

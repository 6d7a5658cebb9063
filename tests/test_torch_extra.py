"""torch only when asked for: the default install has no torch, and MEMORY_EMBEDDER=torch without the
[torch] extra fails at start with a message naming it (issue 34: torch and its company were ~1 GB of a
2.2 GB venv that the default embedder never imports)."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from memory_service.config import Settings
from memory_service.embedding.embedder import EmbedderError, embedder_for

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("torch", "sentence-transformers", "transformers")


def _name(requirement: str) -> str:
    return requirement.split(";")[0].split("[")[0].split("=")[0].split(">")[0].split("<")[0].strip().lower()


def test_torch_is_an_extra_not_a_dependency():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert {_name(r) for r in project["dependencies"]} & set(HEAVY) == set()
    assert {"torch", "sentence-transformers"} <= {_name(r) for r in project["optional-dependencies"]["torch"]}


def test_the_torch_embedder_without_the_extra_fails_at_start_naming_it(monkeypatch, tmp_path):
    # torch not importable, as in a default install (None in sys.modules makes `import torch` fail)
    monkeypatch.setitem(sys.modules, "torch", None)
    with pytest.raises(EmbedderError) as err:
        embedder_for(Settings(embedder="torch", cache_dir=tmp_path))
    message = str(err.value)
    assert "MEMORY_EMBEDDER=torch needs the [torch] extra" in message
    assert "pip install -e '.[torch]'" in message and "MEMORY_EMBEDDER=onnx-q8" in message


@pytest.mark.process  # a fresh interpreter: this one may have imported torch already
def test_the_default_path_never_imports_torch(tmp_path):
    code = (
        "import sys\n"
        "import memory_service.services, memory_service.api.app, memory_service.cli.main\n"
        "from pathlib import Path\n"
        "from memory_service.embedding.embedder import load_embedder\n"
        f"load_embedder('onnx-q8', cache_dir=Path({str(tmp_path)!r})).embed_one('hello')\n"
        f"print(sorted(m for m in {HEAVY + ('sentence_transformers', 'sklearn', 'scipy')!r} if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stderr[-2000:]

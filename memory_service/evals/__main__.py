"""`python -m memory_service.evals`: the same as `memory-service eval` (LoCoMo .json or PersonaExt .jsonl)."""

from __future__ import annotations

from .cli import run_eval
from .options import eval_parser

if __name__ == "__main__":
    raise SystemExit(run_eval(eval_parser("memory-service eval", prog="python -m memory_service.evals").parse_args()))

"""`python -m memory_service …` is `memory-service …`: for harness configs that name an interpreter."""

from .cli.main import main

if __name__ == "__main__":
    raise SystemExit(main())

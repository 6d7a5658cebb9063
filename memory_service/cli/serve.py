"""serve | llama-server: run the API (with the llama-server it needs), or one llama-server on its own.

The heavy imports (uvicorn, the app, the model runtime) happen inside the commands, so that the
other commands start quickly.
"""

from __future__ import annotations

import argparse
import logging
import os
import shlex
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..config import Settings
from .common import Subcommands, positive_int

if TYPE_CHECKING:
    from ..llm.runtime.server import LlamaServerProcess

SpeedPrior = tuple[float, float] | None  # (prompt, generation) tokens/s the bootstrap measured, if it did


def add_serve_parser(subcommands: Subcommands) -> None:
    parser = subcommands.add_parser("serve", help="start llama-server (unless MEMORY_LLM_URL is set) and the API")
    parser.add_argument("--host", help="env MEMORY_HOST (default 127.0.0.1)")
    parser.add_argument("--port", type=int, help="env MEMORY_PORT (default 8700)")
    parser.add_argument("--data-dir", help="env MEMORY_DATA_DIR (default ./memory-data)")
    parser.add_argument("--model", help="default | tiny | large | path to a .gguf (env MEMORY_MODEL)")
    parser.add_argument(
        "--llm-url", help="use this running llama-server, or several comma-separated (env MEMORY_LLM_URL)"
    )
    parser.add_argument(
        "--workers",
        type=positive_int,
        default=1,
        help="API processes on the port, sharing one llama-server (default 1); more than 1 needs "
        "MEMORY_DATABASE_URL and MEMORY_CHROMA_URL",
    )
    parser.set_defaults(func=run_serve)


def run_serve(args: argparse.Namespace) -> int:
    """Check what can be checked first (exposure, workers, the shared stores), then start llama-server and the API;
    llama-server stops when the API does, however it ends."""
    from ..api.app import check_exposure, keyless
    from ..api.workers import check_workers
    from ..llm.runtime.server import LlamaServerError
    from ..logs import configure as configure_logging

    settings = Settings.from_env().with_overrides(
        host=args.host,
        port=args.port,
        data_dir=Path(args.data_dir) if args.data_dir else None,
        model=args.model,
        llm_url=args.llm_url,
    )
    check_exposure(settings)
    check_workers(settings, args.workers)
    configure_logging(settings.log_format, settings.log_level)
    if not _shared_stores_answer(settings):  # before `keyless` reads the keys there: one line, not a traceback
        return 1
    if keyless(settings):
        logging.info(
            "keyless mode (no API key): every request on %s is admin of team '%s', where every save goes; the "
            "first key (`memory-service keys create`) ends it, `--team %s` keeps those memories in sight",
            settings.host,
            Settings.LOCAL_TEAM,
            Settings.LOCAL_TEAM,
        )
    from ..storage.datadir import DataDir, DataDirIncomplete, private_umask

    private_umask()  # before anything is created: the files, the Chroma child's and llama-server's log included
    try:
        DataDir(settings.data_dir).prepare()  # 0700; refuses a data dir a cut-off restore left missing
    except DataDirIncomplete as exc:
        logging.error("%s", exc)
        return 1
    llama, speed_prior = None, None
    if not settings.llm_url:
        try:
            llama, speed_prior = _start_llama_server(settings)
        except LlamaServerError as exc:
            logging.error("%s", exc)
            return 1
        settings = settings.with_overrides(llm_url=llama.url)
    # uvicorn shuts down gracefully, then re-raises the signal it caught; with this handler in place
    # that re-raise unwinds through `finally` (stopping llama-server) instead of killing us on the spot.
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    try:
        _run_api(settings, args.workers, speed_prior)
    finally:
        if llama is not None:
            llama.stop()
    return 0


def _exit_on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(0)


def _shared_stores_answer(settings: Settings) -> bool:
    """Probe MEMORY_CHROMA_URL and MEMORY_DATABASE_URL before the model loads: a missing server is one
    logged line, not a traceback from every worker."""
    from ..storage.vectors import ChromaUnreachable, probe_server

    if settings.chroma_url:
        try:
            probe_server(settings.chroma_url)
        except ChromaUnreachable as exc:
            logging.error("%s", exc)
            return False
    if settings.database_url:
        from ..storage.database import open_database

        try:
            database = open_database(settings)
            if database is not None:
                database.close()
        except ValueError as exc:
            logging.error("%s", exc)
            return False
    return True


def _start_llama_server(settings: Settings) -> tuple[LlamaServerProcess, SpeedPrior]:
    """Launch llama-server on the configured model; raises LlamaServerError when it does not come up."""
    from ..llm.runtime import proven
    from ..llm.runtime.gguf import resolve_model
    from ..llm.runtime.server import launch

    model_path = resolve_model(settings.model, settings.cache_dir)
    logging.info(
        "starting llama-server with %s (%d thread(s), ctx %d, nice +%d)",
        model_path.name,
        settings.llama_threads,
        settings.llama_ctx,
        settings.llama_nice,
    )
    llama = launch(settings, model_path, settings.data_dir / "llama-server.log")
    # the bootstrap's smoke test measured this binary on this model: the first estimates start there
    speed_prior = proven.speed_of(settings.cache_dir, llama.binary, model_path.name)
    logging.info("llama-server %s ready at %s", llama.binary, llama.url)
    return llama, speed_prior


def _run_api(settings: Settings, workers: int, speed_prior: SpeedPrior) -> None:
    """Serve the API until it is stopped: in this process, or in `workers` fresh ones on the same port."""
    import uvicorn

    from ..api.http_guard import protocol_for
    from ..api.workers import APP, HTTP_PROTOCOL, worker_environment
    from ..app import create_app

    options: dict[str, Any] = {
        "host": settings.host,
        "port": settings.port,
        "log_level": settings.log_level.lower(),
        "access_log": False,
    }
    if settings.log_format == "json":  # uvicorn's own loggers go through the root handler, not its text formatters
        options["log_config"] = None
    if workers > 1:
        # the workers are fresh interpreters: they read the settings resolved here from their environment,
        # and share the llama-server started above (one for all of them)
        os.environ.update(worker_environment(settings, speed_prior))
        logging.info("starting %d API worker processes", workers)
        uvicorn.run(APP, factory=True, workers=workers, http=HTTP_PROTOCOL, **options)
    else:
        uvicorn.run(
            create_app(settings, speed_prior=speed_prior),
            workers=1,
            http=protocol_for(settings),
            **options,
        )


def add_llama_server_parser(subcommands: Subcommands) -> None:
    parser = subcommands.add_parser(
        "llama-server",
        help="run the proven llama-server with the model in the foreground (one member of a MEMORY_LLM_URL pool)",
    )
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    parser.add_argument("--model", help="env MEMORY_MODEL (default: the default model)")
    parser.add_argument("--print", action="store_true", help="print the command instead of running it")
    parser.set_defaults(func=run_llama_server)


def run_llama_server(args: argparse.Namespace) -> int:
    """Run the proven llama-server with the configured model in the foreground: a pool member to list in
    another service's MEMORY_LLM_URL (or `--print` the command, to run it under a supervisor or elsewhere)."""
    from ..llm.runtime.gguf import resolve_model
    from ..llm.runtime.server import LlamaServerError, LlamaServerProcess

    settings = Settings.from_env().with_overrides(model=args.model)
    try:
        process = LlamaServerProcess.from_settings(
            settings, resolve_model(settings.model, settings.cache_dir), None, port=args.port
        )
    except (LlamaServerError, FileNotFoundError, ValueError) as exc:
        print(f"llama-server: {exc}", file=sys.stderr)
        return 1
    command = process.command()
    command[command.index("--host") + 1] = args.host
    if args.print:
        print(" ".join(shlex.quote(part) for part in command))
        return 0
    print(f"llama-server at http://{args.host}:{args.port} (add it to MEMORY_LLM_URL)", file=sys.stderr)
    os.execv(command[0], command)
    return 1  # not reached

"""`memory-service` command line: serve | doctor | remember | recall | get | list | forget | export | import |
limits | keys | backup | restore | reindex | migrate | llama-server | mcp | bench | eval."""

from __future__ import annotations

import argparse
import json
import logging
import os
import shlex
import signal
import sys
from collections.abc import Callable
from pathlib import Path

from memory_service.bench.options import add_bench_arguments
from memory_service.config import ConfigError, Settings
from memory_service.evals.options import add_eval_arguments
from memory_service.logs import TEXT_FORMAT


def _client_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--url", default=os.environ.get("MEMORY_URL", "http://127.0.0.1:8700"), help="service URL (env MEMORY_URL)"
    )
    parser.add_argument("--api-key", default=os.environ.get("MEMORY_API_KEY"), help="API key (env MEMORY_API_KEY)")


def _http(args: argparse.Namespace):
    from memory_service.client.service import service_client

    return service_client(args.url, args.api_key, timeout=150)


def _print_response(response) -> int:
    try:
        print(json.dumps(response.json(), indent=2))
    except ValueError:
        print(response.text)
    return 0 if response.status_code < 400 else 1


def _positive_int(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a whole number") from None
    if number < 1:
        raise argparse.ArgumentTypeError(f"{value} is not 1 or more")
    return number


def _exit_on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(0)


def cmd_serve(args: argparse.Namespace) -> int:
    import uvicorn

    from memory_service.api.app import check_exposure, create_app
    from memory_service.api.http_guard import guarded_protocol
    from memory_service.api.workers import APP, HTTP_PROTOCOL, check_workers, worker_environment
    from memory_service.llm.runtime import proven
    from memory_service.llm.runtime.models import resolve_model
    from memory_service.llm.runtime.server import LlamaServerError, launch
    from memory_service.logs import configure as configure_logging
    from memory_service.storage.vectors import ChromaUnreachable, probe_server

    settings = Settings.from_env().with_overrides(
        host=args.host,
        port=args.port,
        data_dir=Path(args.data_dir) if args.data_dir else None,
        model=args.model,
        llm_url=args.llm_url,
    )
    check_exposure(settings)
    check_workers(settings, args.workers)
    configure_logging(settings.log_format, os.environ.get("MEMORY_LOG_LEVEL", "INFO"))
    if settings.chroma_url:
        try:  # before the model loads: a missing server is one line, not a traceback from every worker
            probe_server(settings.chroma_url)
        except ChromaUnreachable as exc:
            logging.error("%s", exc)
            return 1
    if settings.database_url:
        from memory_service.storage.database import open_database

        try:  # the same: an unreachable PostgreSQL is one line before anything starts
            open_database(settings).close()  # type: ignore[union-attr]
        except ValueError as exc:
            logging.error("%s", exc)
            return 1
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    llama = None
    speed_prior = None
    if not settings.llm_url:
        model_path = resolve_model(settings.model, settings.cache_dir)
        logging.info(
            "starting llama-server with %s (%d thread(s), ctx %d, nice +%d)",
            model_path.name,
            settings.llama_threads,
            settings.llama_ctx,
            settings.llama_nice,
        )
        try:
            llama = launch(settings, model_path, settings.data_dir / "llama-server.log")
        except LlamaServerError as exc:
            logging.error("%s", exc)
            return 1
        # the bootstrap's smoke test measured this binary on this model: the first estimates start there
        speed_prior = proven.speed_of(settings.cache_dir, llama.binary, model_path.name)
        settings = settings.with_overrides(llm_url=llama.url)
        logging.info("llama-server %s ready at %s", llama.binary, llama.url)
    # uvicorn shuts down gracefully, then re-raises the signal it caught; with this handler in place
    # that re-raise unwinds through `finally` (stopping llama-server) instead of killing us on the spot.
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    # JSON logs: uvicorn's own loggers go through the root handler too, instead of its text formatters
    log_config = {"log_config": None} if settings.log_format == "json" else {}
    common = dict(
        host=settings.host,
        port=settings.port,
        log_level=os.environ.get("MEMORY_LOG_LEVEL", "info").lower(),
        access_log=False,
        **log_config,
    )
    try:
        if args.workers > 1:
            # the workers are fresh interpreters: they read the settings resolved here from their environment,
            # and share the llama-server started above (one for all of them)
            os.environ.update(worker_environment(settings, speed_prior))
            logging.info("starting %d API worker processes", args.workers)
            uvicorn.run(APP, factory=True, workers=args.workers, http=HTTP_PROTOCOL, **common)
        else:
            uvicorn.run(
                create_app(settings, speed_prior=speed_prior),
                workers=1,
                http=guarded_protocol(settings.header_timeout_s, settings.body_timeout_s),
                **common,
            )
    finally:
        if llama is not None:
            llama.stop()
    return 0


def cmd_llama_server(args: argparse.Namespace) -> int:
    """Run the proven llama-server with the configured model in the foreground: a pool member to list in
    another service's MEMORY_LLM_URL (or `--print` the command, to run it under a supervisor or elsewhere)."""
    from memory_service.llm.runtime.models import resolve_model
    from memory_service.llm.runtime.server import LlamaServerError, LlamaServerProcess

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


def cmd_remember(args: argparse.Namespace) -> int:
    text = sys.stdin.read() if args.text == "-" else args.text
    body = {"text": text, "agent_id": args.agent_id, "tags": args.tag or [], "wait_s": args.wait}
    with _http(args) as client:
        return _print_response(client.post("/v1/remember", json=body))


def cmd_recall(args: argparse.Namespace) -> int:
    body = {"query": args.query, "k": args.k}
    if args.agent_id:
        body.update(agent_id=args.agent_id, scope="agent")
    with _http(args) as client:
        return _print_response(client.post("/v1/recall", json=body))


def cmd_get(args: argparse.Namespace) -> int:
    with _http(args) as client:
        return _print_response(client.get(f"/v1/memories/{args.id}"))


def cmd_list(args: argparse.Namespace) -> int:
    params = {
        k: v
        for k, v in (
            ("agent_id", args.agent_id),
            ("run_id", args.run_id),
            ("status", args.status),
            ("tag", args.tag),
            ("limit", args.limit),
            ("cursor", args.cursor),
        )
        if v is not None
    }
    with _http(args) as client:
        return _print_response(client.get("/v1/memories", params=params))


def cmd_forget(args: argparse.Namespace) -> int:
    with _http(args) as client:
        if args.id:
            response = client.delete(f"/v1/memories/{args.id}")
            if response.status_code == 204:
                print(json.dumps({"deleted": 1}))
                return 0
            return _print_response(response)
        params = {k: v for k, v in (("agent_id", args.agent_id), ("run_id", args.run_id)) if v}
        return _print_response(client.delete("/v1/memories", params={**params, "confirm": str(args.yes).lower()}))


def cmd_export(args: argparse.Namespace) -> int:
    """Stream the export to a file or stdout as it arrives: a large team never sits in memory."""
    out = open(args.out, "wb") if args.out and args.out != "-" else sys.stdout.buffer
    try:
        with _http(args) as client, client.stream("GET", "/v1/export") as response:
            if response.status_code >= 400:
                response.read()
                return _print_response(response)
            for chunk in response.iter_bytes():
                out.write(chunk)
    finally:
        if out is not sys.stdout.buffer:
            out.close()
    return 0


def cmd_import(args: argparse.Namespace) -> int:
    source = sys.stdin.buffer if args.file == "-" else open(args.file, "rb")
    try:
        with _http(args) as client:
            return _print_response(
                client.post(
                    "/v1/import",
                    params={"re_extract": str(args.re_extract).lower()},
                    content=iter(lambda: source.read(1 << 16), b""),
                    headers={"content-type": "application/x-ndjson"},
                )
            )
    finally:
        if source is not sys.stdin.buffer:
            source.close()


def _data_settings(args: argparse.Namespace) -> Settings:
    return Settings.from_env().with_overrides(data_dir=Path(args.data_dir) if args.data_dir else None)


def _summarised(what: str, action: Callable[[], dict]) -> int:
    """Run a backup or restore: its one-line JSON summary, or `<what> failed: <why>` and exit 1."""
    from memory_service.ops.backup import BackupError

    try:
        summary = action()
    except BackupError as exc:
        print(f"{what} failed: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(summary))
    return 0


def _embedded_only(what: str, args: argparse.Namespace) -> bool:
    """Backup and restore copy the data dir's SQLite files: with MEMORY_DATABASE_URL there are none."""
    if _data_settings(args).database_url:
        print(
            f"{what} failed: MEMORY_DATABASE_URL is set, so the journal, limits and keys live in PostgreSQL, "
            "not in the data dir. Back them up with PostgreSQL's own tools (pg_dump / pg_restore), then run "
            "`memory-service reindex` after a restore to rebuild the vectors.",
            file=sys.stderr,
        )
        return False
    return True


def cmd_backup(args: argparse.Namespace) -> int:
    from memory_service.ops.backup import backup

    if not _embedded_only("backup", args):
        return 1
    return _summarised("backup", lambda: backup(_data_settings(args).data_dir, Path(args.dir)))


def cmd_restore(args: argparse.Namespace) -> int:
    from memory_service.ops.backup import restore

    if not _embedded_only("restore", args):
        return 1
    return _summarised(
        "restore",
        lambda: restore(Path(args.dir), _data_settings(args), force=args.force, rebuild_vectors=args.rebuild_vectors),
    )


def cmd_reindex(args: argparse.Namespace) -> int:
    from memory_service.cli.reindex import ReindexError, run_reindex

    try:
        summary = run_reindex(_data_settings(args), args.team)
    except ReindexError as exc:
        print(f"reindex failed: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(summary))
    return 0


def cmd_migrate(args: argparse.Namespace) -> int:
    from memory_service.ops.store_copy import MigrateError, run_migrate

    try:
        summary = run_migrate(_data_settings(args), args.to, reindex_vectors=not args.no_reindex)
    except MigrateError as exc:
        print(f"migrate failed: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(summary))
    print(f"done: start the service with MEMORY_DATABASE_URL={args.to.split('://')[0]}://… to use it", file=sys.stderr)
    return 0


def cmd_doctor(args: argparse.Namespace) -> int:
    from memory_service.ops.doctor import run_doctor

    return run_doctor(args)


def cmd_keys(args: argparse.Namespace) -> int:
    """Keys are managed in the data dir's key store: a running service sees a change at its next request."""
    from memory_service.services import KEYS_FILE
    from memory_service.storage.database import open_database
    from memory_service.storage.keys import KeyNotFound, KeyStore

    settings = Settings.from_env().with_overrides(data_dir=args.data_dir)
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    database = open_database(settings)  # MEMORY_DATABASE_URL: the keys every API process reads
    store = KeyStore(database or settings.data_dir / KEYS_FILE)
    try:
        if args.keys_command == "create":
            made = store.create(args.team, args.role, agent_id=args.agent, label=args.label)
            print(
                json.dumps(
                    {
                        "id": made.info.id,
                        "team": made.info.team,
                        "role": made.info.role,
                        "agent_id": made.info.agent_id,
                        "key": made.key,
                    }
                )
            )
            print("the key is shown this once: store it now", file=sys.stderr)
        elif args.keys_command == "list":
            for info in store.list(args.team, include_revoked=args.all):
                print(json.dumps(info.__dict__))
        else:
            try:
                info = store.revoke(args.id)
            except KeyNotFound as exc:
                print(str(exc), file=sys.stderr)
                return 1
            print(json.dumps(info.__dict__))
    finally:
        store.close()
        if database is not None:
            database.close()
    return 0


def cmd_mcp(args: argparse.Namespace) -> int:
    import anyio

    from memory_service.mcp_server.server import McpConfig, serve

    config = McpConfig(url=args.url, api_key=args.api_key, agent_id=args.agent_id, read_only=args.read_only)
    anyio.run(lambda: serve(config, args.transport, host=args.host, port=args.port))
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    from memory_service.bench.cli import run_bench

    return run_bench(args)


def cmd_eval(args: argparse.Namespace) -> int:
    from memory_service.evals.cli import run_eval

    return run_eval(args)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="memory-service", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="start llama-server (unless MEMORY_LLM_URL is set) and the API")
    serve.add_argument("--host", help="env MEMORY_HOST (default 127.0.0.1)")
    serve.add_argument("--port", type=int, help="env MEMORY_PORT (default 8700)")
    serve.add_argument("--data-dir", help="env MEMORY_DATA_DIR (default ./memory-data)")
    serve.add_argument("--model", help="default | tiny | large | path to a .gguf (env MEMORY_MODEL)")
    serve.add_argument(
        "--llm-url", help="use this running llama-server, or several comma-separated (env MEMORY_LLM_URL)"
    )
    serve.add_argument(
        "--workers",
        type=_positive_int,
        default=1,
        help="API processes on the port, sharing one llama-server (default 1); more than 1 needs "
        "MEMORY_DATABASE_URL and MEMORY_CHROMA_URL",
    )
    serve.set_defaults(func=cmd_serve)

    doctor = sub.add_parser("doctor", help="check that the model server meets the contract and the budget")
    doctor.add_argument(
        "--llm-url",
        default=os.environ.get("MEMORY_LLM_URL"),
        help="llama-server(s) to check, comma-separated; default: start one like `serve` does",
    )
    doctor.add_argument("--model", default=None, help="model for the started server (default | tiny | large | path)")
    doctor.add_argument("--json", action="store_true", help="print the report as JSON")
    doctor.set_defaults(func=cmd_doctor)

    remember = sub.add_parser("remember", help="save a text ('-' reads stdin)")
    remember.add_argument("text")
    remember.add_argument("--agent-id", required=True)
    remember.add_argument("--tag", action="append")
    remember.add_argument("--wait", type=float, default=0, help="wait up to N s for extraction")
    _client_args(remember)
    remember.set_defaults(func=cmd_remember)

    recall = sub.add_parser("recall", help="search the team's memory")
    recall.add_argument("query")
    recall.add_argument("-k", type=int, default=5)
    recall.add_argument("--agent-id", help="only this agent's memories")
    _client_args(recall)
    recall.set_defaults(func=cmd_recall)

    get = sub.add_parser("get", help="show a memory: status, facts, timings, errors")
    get.add_argument("id")
    _client_args(get)
    get.set_defaults(func=cmd_get)

    lister = sub.add_parser("list", help="list the team's memories, newest first")
    lister.add_argument("--agent-id")
    lister.add_argument("--run-id")
    lister.add_argument("--status", choices=["queued", "extracting", "done", "failed"])
    lister.add_argument("--tag")
    lister.add_argument("--limit", type=int)
    lister.add_argument("--cursor", help="next_cursor of the previous page")
    _client_args(lister)
    lister.set_defaults(func=cmd_list)

    forget = sub.add_parser("forget", help="forget one memory by id, or all of an agent or run (--yes)")
    forget.add_argument("id", nargs="?")
    forget.add_argument("--agent-id")
    forget.add_argument("--run-id")
    forget.add_argument("--yes", action="store_true", help="confirm a bulk forget (it cannot be undone)")
    _client_args(forget)
    forget.set_defaults(func=cmd_forget)

    exporter = sub.add_parser("export", help="write the team's memories as JSON Lines")
    exporter.add_argument("--out", "-o", help="file to write (default stdout)")
    _client_args(exporter)
    exporter.set_defaults(func=cmd_export)

    importer = sub.add_parser("import", help="read JSON Lines written by export ('-' reads stdin)")
    importer.add_argument("file")
    importer.add_argument("--re-extract", action="store_true", help="drop the facts and extract them again")
    _client_args(importer)
    importer.set_defaults(func=cmd_import)

    try:
        from memory_service.cli.limits import add_limits_parser

        add_limits_parser(sub)
    except ImportError:  # pragma: no cover
        pass

    keys = sub.add_parser("keys", help="create, list or revoke API keys (effective at once, no restart)")
    keys_sub = keys.add_subparsers(dest="keys_command", required=True)
    create = keys_sub.add_parser("create", help="a new key, printed once")
    create.add_argument("--team", required=True)
    create.add_argument(
        "--role",
        required=True,
        choices=["read", "write", "admin"],
        help="read: recall/get/list/check; write: +remember/consume/mark/import; admin: +forget/limit definitions/keys",
    )
    create.add_argument("--agent", help="pin the key to this agent_id: it can write only as this agent")
    create.add_argument("--label", help="a note for people")
    lister_keys = keys_sub.add_parser("list", help="keys (never their secrets)")
    lister_keys.add_argument("--team")
    lister_keys.add_argument("--all", action="store_true", help="include revoked keys")
    revoke = keys_sub.add_parser("revoke", help="revoke a key by its id")
    revoke.add_argument("id")
    for command in (create, lister_keys, revoke):
        command.add_argument("--data-dir", help="env MEMORY_DATA_DIR (default ./memory-data)")
    keys.set_defaults(func=cmd_keys)
    backup = sub.add_parser("backup", help="snapshot the data dir into a new directory (the service may keep running)")
    backup.add_argument("dir", help="directory to create; must not exist or be empty")
    backup.add_argument("--data-dir", help="env MEMORY_DATA_DIR (default ./memory-data)")
    backup.set_defaults(func=cmd_backup)

    restore = sub.add_parser("restore", help="bring a backup back into the data dir (stop the service first)")
    restore.add_argument("dir", help="a directory written by `memory-service backup`")
    restore.add_argument("--data-dir", help="env MEMORY_DATA_DIR (default ./memory-data)")
    restore.add_argument(
        "--force", action="store_true", help="restore over a data dir that holds data (it is moved aside, not deleted)"
    )
    restore.add_argument(
        "--rebuild-vectors",
        action="store_true",
        help="embed everything again even when the backup holds a copy of the vectors",
    )
    restore.set_defaults(func=cmd_restore)

    reindex = sub.add_parser("reindex", help="rebuild the vector store from the journal (stop the service first)")
    reindex.add_argument("--team", help="only this team's collections (default: every team's)")
    reindex.add_argument(
        "--data-dir",
        help="env MEMORY_DATA_DIR (default ./memory-data); the vectors go to MEMORY_CHROMA_URL when it is set",
    )
    reindex.set_defaults(func=cmd_reindex)
    migrate = sub.add_parser(
        "migrate", help="copy the data dir's SQLite stores into PostgreSQL, then reindex (stop the service first)"
    )
    migrate.add_argument("--to", required=True, help="postgresql://user@host:port/database")
    migrate.add_argument("--data-dir", help="env MEMORY_DATA_DIR (default ./memory-data)")
    migrate.add_argument(
        "--no-reindex", action="store_true", help="copy only; run `memory-service reindex` later to rebuild the vectors"
    )
    migrate.set_defaults(func=cmd_migrate)
    llama = sub.add_parser(
        "llama-server",
        help="run the proven llama-server with the model in the foreground (one member of a MEMORY_LLM_URL pool)",
    )
    llama.add_argument("--port", type=int, required=True)
    llama.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    llama.add_argument("--model", help="env MEMORY_MODEL (default: the default model)")
    llama.add_argument("--print", action="store_true", help="print the command instead of running it")
    llama.set_defaults(func=cmd_llama_server)

    mcp = sub.add_parser("mcp", help="serve the memory tools to agent harnesses over MCP (stdio or HTTP)")
    mcp.add_argument(
        "--transport",
        choices=["stdio", "http"],
        default="stdio",
        help="stdio: the harness spawns this command; http: streamable HTTP at /mcp",
    )
    mcp.add_argument("--host", default="127.0.0.1", help="HTTP: address to listen on")
    mcp.add_argument("--port", type=int, default=8701, help="HTTP: port (default 8701)")
    mcp.add_argument(
        "--agent-id",
        default=os.environ.get("MEMORY_AGENT_ID", "agent"),
        help="who saves and consumes through these tools (env MEMORY_AGENT_ID, default 'agent')",
    )
    mcp.add_argument(
        "--read-only",
        action="store_true",
        default=os.environ.get("MEMORY_MCP_READ_ONLY", "").lower() in ("1", "true", "yes"),
        help="list only the tools that read (env MEMORY_MCP_READ_ONLY=1)",
    )
    _client_args(mcp)
    mcp.set_defaults(func=cmd_mcp)

    bench = sub.add_parser("bench", help="run the benchmark suite, print JSON, write plots")
    add_bench_arguments(bench)
    bench.set_defaults(func=cmd_bench)

    ev = sub.add_parser("eval", help="retrieval/extraction eval on LoCoMo / PersonaExt-format data")
    add_eval_arguments(ev)
    ev.set_defaults(func=cmd_eval)
    return parser


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=os.environ.get("MEMORY_LOG_LEVEL", "INFO").upper(), format=TEXT_FORMAT)
    logging.getLogger("httpx").setLevel(logging.WARNING)
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except ConfigError as exc:
        print(f"configuration error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())

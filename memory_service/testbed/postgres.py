"""A throwaway PostgreSQL cluster for tests and benchmarks: `initdb` + `pg_ctl` in a directory, no service.

It uses the PostgreSQL binaries of the system's packages (`apt-get install postgresql`). initdb refuses to
run as root, so under root the cluster belongs to the `postgres` user the package creates. The server
listens on loopback only, on a free port, with trust authentication: it is for this machine's tests.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import subprocess
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path

from ..llm.runtime.server import free_port


class NoPostgres(RuntimeError):
    pass


def postgres_bin() -> Path:
    """The directory holding initdb and pg_ctl (newest installed version first)."""
    for candidate in sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=lambda p: int(p.split("/")[-2]), reverse=True):
        if os.access(Path(candidate) / "initdb", os.X_OK):
            return Path(candidate)
    initdb = shutil.which("initdb")
    if initdb:
        return Path(initdb).resolve().parent
    raise NoPostgres(
        "PostgreSQL's initdb is not installed: run scripts/bootstrap.sh --dev, or sudo apt-get install -y postgresql"
    )


@dataclass
class PostgresCluster:
    root: Path
    port: int = 0
    user: str = "memory"

    def __post_init__(self) -> None:
        self.bin = postgres_bin()
        self.port = self.port or free_port()
        self._as: list[str] = []
        self._own_root = False
        if os.geteuid() == 0:  # initdb will not run as root; root's temp dirs are closed to other users
            pwd.getpwnam("postgres")
            self._as = ["runuser", "-u", "postgres", "--"]
            self.root, self._own_root = Path(tempfile.mkdtemp(prefix="memory-pg-")), True
        self.data = self.root / "pgdata"
        self.sockets = self.root / "sockets"
        self.log = self.root / "postgres.log"

    @property
    def url(self) -> str:
        return self.url_of("postgres")

    def url_of(self, database: str) -> str:
        return f"postgresql://{self.user}@127.0.0.1:{self.port}/{database}"

    def _run(self, *args: str) -> None:
        result = subprocess.run([*self._as, *args], capture_output=True, text=True)
        if result.returncode != 0:
            raise NoPostgres(f"{' '.join(args[:2])} failed: {result.stderr.strip() or result.stdout.strip()}")

    def start(self) -> PostgresCluster:
        self.root.mkdir(parents=True, exist_ok=True)
        self.sockets.mkdir(exist_ok=True)
        if self._as:
            for path in (self.root, self.sockets):
                shutil.chown(path, "postgres", "postgres")
            self.root.chmod(0o755)
        if not (self.data / "PG_VERSION").exists():
            self._run(
                str(self.bin / "initdb"),
                "-D",
                str(self.data),
                "-U",
                self.user,
                "-A",
                "trust",
                "-E",
                "UTF8",
                "--no-instructions",
            )
        options = (
            f"-p {self.port} -k {self.sockets} -c listen_addresses=127.0.0.1 -c max_connections=200 "
            "-c shared_buffers=64MB"
        )
        self._run(
            str(self.bin / "pg_ctl"),
            "-D",
            str(self.data),
            "-o",
            options,
            "-l",
            str(self.log),
            "-w",
            "-t",
            "60",
            "start",
        )
        return self

    def create_database(self, name: str | None = None) -> str:
        """A new empty database; returns its URL."""
        import psycopg

        name = name or "t_" + uuid.uuid4().hex[:12]
        with psycopg.connect(self.url, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url_of(name)

    def stop(self) -> None:
        if (self.data / "postmaster.pid").exists():
            subprocess.run(
                [*self._as, str(self.bin / "pg_ctl"), "-D", str(self.data), "-m", "fast", "-w", "stop"],
                capture_output=True,
            )

    def remove(self) -> None:
        """Stop, and delete the cluster's files."""
        self.stop()
        if self._own_root:
            shutil.rmtree(self.root, ignore_errors=True)

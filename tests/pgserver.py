"""A throwaway PostgreSQL server for tests: its own folder, a free loopback port, trust auth.

    from tests.pgserver import PostgresServer

    with PostgresServer() as server:            # initdb + start (a second or two)
        server.url                              # postgresql://postgres@127.0.0.1:PORT/inferscale
        name = server.create_database()         # another fresh, empty database
        server.url_for(name)                    # ... and its URL
        server.drop_database(name)
    # stopped (immediate shutdown) and its folder removed

Several processes (e.g. two server replicas) can share one database: give each `server.url`.
The pytest fixtures `postgres_server` (one per session) and `postgres_url` (a fresh database
per test) in tests/conftest.py wrap this class; they skip when PostgreSQL is not installed,
and fail instead when INFERSCALE_REQUIRE_SERVICES is set (CI).

The binaries (initdb, pg_ctl, postgres) come from PATH, else from /usr/lib/postgresql/*/bin.
initdb refuses to run as root, so as root the server runs as the `postgres` OS user (the one
Debian's postgresql package creates). fsync is off: a test server trades crash safety of the
server itself for speed (a killed client still loses nothing it was told was committed).
"""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import uuid
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType

REQUIRE_ENV = "INFERSCALE_REQUIRE_SERVICES"
"""When set (CI sets it), a missing PostgreSQL fails the tests that need it instead of
skipping them."""
DEFAULT_SETTINGS = {"fsync": "off", "full_page_writes": "off", "max_connections": "200"}
"""postgresql.conf settings of a test server (on top of port, address and socket folder)."""
_OS_USER = "postgres"


def find_bin_dir() -> Path | None:
    """The folder holding initdb, pg_ctl and postgres, or None if PostgreSQL is not installed."""
    on_path = shutil.which("initdb")
    candidates = [Path(on_path).resolve().parent] if on_path else []
    candidates += sorted(Path("/usr/lib/postgresql").glob("*/bin"),
                         key=lambda p: int(p.parent.name) if p.parent.name.isdigit() else 0,
                         reverse=True)
    for folder in candidates:
        if all((folder / name).is_file() for name in ("initdb", "pg_ctl", "postgres")):
            return folder
    return None


def unavailable_reason() -> str | None:
    """Why no test server can start here (no PostgreSQL, no psycopg, ...), or None."""
    if find_bin_dir() is None:
        return ("PostgreSQL is not installed (no initdb on PATH or in /usr/lib/postgresql/*/bin)"
                "; install it, e.g. apt-get install postgresql")
    try:
        import psycopg  # noqa: F401
    except ImportError:
        return "psycopg is not installed; pip install 'inferscale-kv[postgres]'"
    if os.geteuid() == 0:
        try:
            pwd.getpwnam(_OS_USER)
        except KeyError:
            return (f"running as root needs an OS user {_OS_USER!r} to run the server as "
                    "(initdb refuses root); apt's postgresql package creates it")
    return None


class PostgresServer:
    """One PostgreSQL server in a temporary folder, listening on 127.0.0.1 and a unix socket.

    `url` names a database created at start (`database`); every client connects as the
    superuser `postgres` without a password (trust auth). Not thread-safe; start it once.
    """

    def __init__(self, database: str = "inferscale", *,
                 settings: Mapping[str, str] | None = None) -> None:
        """Args:
            database: name of the database created at start (the one `url` names).
            settings: postgresql.conf settings over DEFAULT_SETTINGS.
        """
        self.database = database
        self.settings = {**DEFAULT_SETTINGS, **(settings or {})}
        self.host = "127.0.0.1"
        self.port = 0
        self.folder: Path | None = None
        self._bin_dir: Path | None = None

    # ---- lifecycle -----------------------------------------------------------------------
    def start(self) -> PostgresServer:
        """initdb a fresh cluster, start it on a free port and create `database`.

        Raises:
            RuntimeError: PostgreSQL is missing (see unavailable_reason) or did not start; the
                message holds the server log's tail.
        """
        if self.folder is not None:
            raise RuntimeError(f"this server already runs on port {self.port}; stop() it first")
        reason = unavailable_reason()
        if reason:
            raise RuntimeError(reason)
        self._bin_dir = find_bin_dir()
        self.folder = Path(tempfile.mkdtemp(prefix="inferscale-pg-"))
        try:
            (self.folder / "socket").mkdir()
            if os.geteuid() == 0:
                account = pwd.getpwnam(_OS_USER)
                for path in (self.folder, self.folder / "socket"):
                    os.chown(path, account.pw_uid, account.pw_gid)
            self._run("initdb", "-D", str(self.data), "-U", "postgres", "-A", "trust",
                      "-E", "UTF8", "--locale=C", "--no-sync")
            for attempt in range(3):  # a free port may be taken between probing and binding
                self.port = _free_port(self.host)
                self._write_settings()
                try:
                    self._run("pg_ctl", "start", "-D", str(self.data), "-l", str(self.log),
                              "-w", "-t", "60")
                    break
                except RuntimeError:
                    if attempt == 2 or "could not bind" not in self._log_tail():
                        raise
            self._admin(f'CREATE DATABASE "{self.database}"')
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Stop the server (immediate shutdown) and remove its folder; idempotent."""
        if self.folder is None:
            return
        try:
            if (self.data / "postmaster.pid").exists():
                self._run("pg_ctl", "stop", "-D", str(self.data), "-m", "immediate", "-w")
        finally:
            shutil.rmtree(self.folder, ignore_errors=True)
            self.folder = None

    def pause(self) -> None:
        """Stop the server (immediate shutdown, as a crash), keeping its data: resume() later."""
        assert self.folder is not None, "start() the server first"
        self._run("pg_ctl", "stop", "-D", str(self.data), "-m", "immediate", "-w")

    def resume(self) -> None:
        """Start a paused server again, on the same port with the same data."""
        assert self.folder is not None, "start() the server first"
        self._run("pg_ctl", "start", "-D", str(self.data), "-l", str(self.log), "-w", "-t", "60")

    def __enter__(self) -> PostgresServer:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.stop()

    # ---- databases -----------------------------------------------------------------------
    @property
    def url(self) -> str:
        """URL of the database created at start."""
        return self.url_for(self.database)

    def url_for(self, database: str) -> str:
        """URL of one database of this server (TCP on the loopback address, no password)."""
        if self.folder is None:
            raise RuntimeError("the server is not running; call start() first")
        return f"postgresql://postgres@{self.host}:{self.port}/{database}"

    def create_database(self, name: str | None = None) -> str:
        """Create an empty database (a unique name if None); returns its name."""
        name = name or f"test_{uuid.uuid4().hex[:16]}"
        self._admin(f'CREATE DATABASE "{name}"')
        return name

    def drop_database(self, name: str) -> None:
        """Drop a database, disconnecting its clients first."""
        self._admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    # ---- internals -----------------------------------------------------------------------
    @property
    def data(self) -> Path:
        assert self.folder is not None
        return self.folder / "data"

    @property
    def log(self) -> Path:
        assert self.folder is not None
        return self.folder / "server.log"

    def _write_settings(self) -> None:
        assert self.folder is not None
        lines = {"port": str(self.port), "listen_addresses": f"'{self.host}'",
                 "unix_socket_directories": f"'{self.folder / 'socket'}'", **self.settings}
        # postgresql.auto.conf is read last: its values win over postgresql.conf's.
        path = self.data / "postgresql.auto.conf"
        path.write_text("".join(f"{key} = {value}\n" for key, value in lines.items()))
        if os.geteuid() == 0:
            shutil.chown(path, _OS_USER, _OS_USER)

    def _run(self, program: str, *args: str) -> None:
        assert self._bin_dir is not None
        as_user = ["runuser", "-u", _OS_USER, "--"] if os.geteuid() == 0 else []
        done = subprocess.run([*as_user, str(self._bin_dir / program), *args],
                              capture_output=True, text=True, timeout=120, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"{program} {' '.join(args[:2])} failed ({done.returncode}): "
                               f"{done.stderr.strip() or done.stdout.strip()}\n"
                               f"server log: {self._log_tail()}")

    def _log_tail(self) -> str:
        try:
            return self.log.read_text(errors="replace")[-2000:]
        except OSError:
            return "(none)"

    def _admin(self, sql: str) -> None:
        import psycopg

        with psycopg.connect(self.url_for("postgres"), autocommit=True,
                             connect_timeout=10) as conn:
            conn.execute(sql)


def _free_port(host: str) -> int:
    with socket.socket() as probe:
        probe.bind((host, 0))
        return int(probe.getsockname()[1])

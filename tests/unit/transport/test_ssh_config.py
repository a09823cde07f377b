"""SshRunner reads ~/.ssh/config (no connection is made here)."""

from __future__ import annotations

from pathlib import Path

import pytest

from slurmpod.errors import SshError
from slurmpod.transport.ssh import SshRunner


def write_config(tmp_path: Path, body: str) -> Path:
    cfg = tmp_path / "config"
    cfg.write_text(body)
    return cfg


def test_alias_resolves_host_user_port_identity_and_known_hosts(tmp_path: Path) -> None:
    key = tmp_path / "id_login"
    key.write_text("not really a key")
    cfg = write_config(tmp_path, f"Host login\n  HostName login1.cluster.example\n  User alice\n"
                       f"  Port 2222\n  IdentityFile {key}\n"
                       f"  UserKnownHostsFile {tmp_path}/kh\n")
    r = SshRunner("login", ssh_config=cfg)
    assert (r.hostname, r.user, r.port) == ("login1.cluster.example", "alice", 2222)
    assert r.identity_files == [str(key)] and r.known_hosts == tmp_path / "kh"
    assert r.where == "ssh alice@login1.cluster.example:2222" and r.strict_host_keys


def test_explicit_arguments_win_and_missing_key_files_are_skipped(tmp_path: Path) -> None:
    cfg = write_config(tmp_path, "Host *\n  User bob\n  IdentityFile ~/.ssh/nope-xyz\n")
    r = SshRunner("h", ssh_config=cfg, user="carol", port=2200, known_hosts=tmp_path / "k")
    assert (r.hostname, r.user, r.port, r.identity_files) == ("h", "carol", 2200, [])


def test_no_config_file_is_fine(tmp_path: Path) -> None:
    r = SshRunner("node7", ssh_config=tmp_path / "absent")
    assert (r.hostname, r.port, r.user) == ("node7", 22, None)


def test_proxyjump_is_refused_with_a_hint(tmp_path: Path) -> None:
    cfg = write_config(tmp_path, "Host inner\n  ProxyJump bastion\n")
    with pytest.raises(SshError, match="ProxyJump") as exc:
        SshRunner("inner", ssh_config=cfg)
    assert "ProxyCommand ssh -W" in exc.value.hint and exc.value.exit_code == 5


def test_proxycommand_is_expanded(tmp_path: Path) -> None:
    cfg = write_config(tmp_path, "Host inner\n  HostName 10.0.0.5\n  Port 2022\n"
                       "  ProxyCommand ssh -W %h:%p bastion\n")
    assert SshRunner("inner", ssh_config=cfg).proxy_command == "ssh -W 10.0.0.5:2022 bastion"

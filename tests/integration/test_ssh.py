"""SshRunner against a real sshd on 127.0.0.1: exec, upload, strict host keys, auth failure,
and hostile argv surviving the quoting round trip through the remote login shell."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from slurmpod.errors import CommandError, SshError
from slurmpod.transport import CommandRunner
from slurmpod.transport.base import CommandTimeoutError
from slurmpod.transport.ssh import SshRunner
from tests.integration.ssh_fixture import SshdServer, sshd  # noqa: F401

pytestmark = pytest.mark.ssh

ECHO_ARGV = [sys.executable, "-c", "import json,sys; print(json.dumps(sys.argv[1:]))"]


@pytest.fixture
def no_agent(monkeypatch: pytest.MonkeyPatch) -> None:
    # Only the keys named in each test: a developer's agent must not make auth succeed.
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)


@pytest.fixture
def runner(sshd: SshdServer, no_agent: None) -> SshRunner:  # noqa: F811
    r = SshRunner(sshd.alias, ssh_config=sshd.ssh_config, known_hosts=sshd.known_hosts)
    yield r
    r.close()


def test_exec_through_ssh_config_alias(runner: SshRunner, sshd: SshdServer) -> None:  # noqa: F811
    assert isinstance(runner, CommandRunner)
    assert runner.where == f"ssh {sshd.user}@127.0.0.1:{sshd.port}"
    res = runner.run(["echo", "hello world"])
    assert res.stdout == "hello world\n" and res.returncode == 0


def test_one_connection_is_reused(runner: SshRunner) -> None:
    runner.run(["true"])
    transport = runner._client.get_transport()
    for _ in range(5):
        runner.run(["true"])
    assert runner._client.get_transport() is transport


def test_stdin_env_cwd_and_large_output(runner: SshRunner, sshd: SshdServer) -> None:  # noqa: F811
    code = "import os,sys; d=sys.stdin.read(); print(len(d), os.environ['XV'], os.getcwd())"
    res = runner.run([sys.executable, "-c", code], input_text="x" * 100_000,
                     env={"XV": "a b;$(c)"}, cwd=str(sshd.home))
    assert res.stdout.split(" ", 1) == ["100000", f"a b;$(c) {sshd.home}\n"]
    big = runner.run([sys.executable, "-c", "import sys; sys.stdout.write('y' * 3_000_000); "
                      "sys.stderr.write('e' * 300_000)"], timeout_s=60)
    assert len(big.stdout) == 3_000_000 and len(big.stderr) == 300_000


def test_remote_failure_and_timeout(runner: SshRunner) -> None:
    with pytest.raises(CommandError) as exc:
        runner.run([sys.executable, "-c", "import sys; sys.stderr.write('nope\\n'); sys.exit(7)"])
    assert exc.value.returncode == 7 and exc.value.stderr == "nope\n"
    with pytest.raises(CommandTimeoutError, match="timed out"):
        runner.run(["sleep", "30"], timeout_s=1)
    assert runner.run(["echo", "still usable"]).stdout == "still usable\n"


def test_upload_and_write_text(runner: SshRunner, sshd: SshdServer, tmp_path: Path) -> None:  # noqa: F811
    local = tmp_path / "job.sbatch"
    local.write_text("#!/bin/bash\necho hi\n")
    local.chmod(0o750)
    target_dir = sshd.home / "runs" / "a b" / "run-1"
    remote = runner.upload(local, str(target_dir))
    assert remote == str(target_dir / "job.sbatch")
    assert runner.run(["cat", remote]).stdout == "#!/bin/bash\necho hi\n"
    assert Path(remote).stat().st_mode & 0o777 == 0o750
    path = runner.write_text(str(target_dir / "note.txt"), "über\n", mode=0o600)
    assert Path(path).read_text() == "über\n"
    assert sorted(p.name for p in target_dir.iterdir()) == ["job.sbatch", "note.txt"]


def test_changed_host_key_is_refused(sshd: SshdServer, tmp_path: Path, no_agent: None) -> None:  # noqa: F811
    other = tmp_path / "known_hosts"
    stranger_pub = " ".join(sshd.stranger_key.with_suffix(".pub").read_text().split()[:2])
    other.write_text(sshd.known_hosts_line(stranger_pub))
    r = SshRunner(sshd.alias, ssh_config=sshd.ssh_config, known_hosts=other)
    with pytest.raises(SshError, match="does not match") as exc:
        r.run(["true"])
    assert exc.value.exit_code == 5 and "ssh-keygen -R" in exc.value.hint
    assert other.read_text() == sshd.known_hosts_line(stranger_pub)  # never rewritten


def test_unknown_host_is_refused_by_default(sshd: SshdServer, tmp_path: Path,  # noqa: F811
                                            no_agent: None) -> None:
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    r = SshRunner(sshd.alias, ssh_config=sshd.ssh_config, known_hosts=empty)
    with pytest.raises(SshError, match="refusing an unknown host key") as exc:
        r.run(["true"])
    assert exc.value.exit_code == 5 and "fingerprint" in exc.value.hint
    assert empty.read_text() == ""
    # only an explicit opt-out connects to an unknown host
    lax = SshRunner(sshd.alias, ssh_config=sshd.ssh_config, known_hosts=empty,
                    strict_host_keys=False)
    with pytest.warns(UserWarning, match="Unknown ssh-ed25519 host key"):
        assert lax.run(["echo", "ok"]).stdout == "ok\n"
    lax.close()


def test_auth_failure(sshd: SshdServer, no_agent: None) -> None:  # noqa: F811
    r = SshRunner("127.0.0.1", port=sshd.port, user=sshd.user,
                  identity_file=str(sshd.stranger_key), ssh_config=None,
                  known_hosts=sshd.known_hosts)
    with pytest.raises(SshError, match=r"authentication to .* failed") as exc:
        r.run(["true"])
    assert exc.value.exit_code == 5


def test_connection_refused(sshd: SshdServer, no_agent: None) -> None:  # noqa: F811
    from tests.integration.ssh_fixture import _free_port

    r = SshRunner("127.0.0.1", port=_free_port(), ssh_config=None,
                  known_hosts=sshd.known_hosts, connect_timeout_s=3)
    with pytest.raises(SshError, match="cannot connect"):
        r.run(["true"])


HOSTILE = ["it's", 'say "hi"', "$(touch /tmp/slurmpod-pwned)", "`id`", "a;b", "a\nb", " x ",
           "", "*", "~", "$HOME", "a|b&c>d<e", "\\", "!", "#c", "-n", "é 字", "'\"'\"'"]


def test_known_hostile_strings_survive_ssh(runner: SshRunner) -> None:
    out = runner.run([*ECHO_ARGV, *HOSTILE]).stdout
    assert json.loads(out) == HOSTILE
    assert not Path("/tmp/slurmpod-pwned").exists()


hostile_text = st.text(alphabet=st.characters(blacklist_categories=("Cs",),
                                              blacklist_characters="\x00"), max_size=24)


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(args=st.lists(hostile_text, max_size=4))
def test_any_argv_round_trips_through_ssh(runner: SshRunner, args: list[str]) -> None:
    assert json.loads(runner.run([*ECHO_ARGV, *args]).stdout) == args


def test_proxycommand_from_ssh_config(sshd: SshdServer, tmp_path: Path,  # noqa: F811
                                      no_agent: None) -> None:
    # The login node reached through a jump host (here the same sshd, via `ssh -W`).
    cfg = tmp_path / "ssh_config"
    cfg.write_text(
        f"Host behind-jump\n  HostName 127.0.0.1\n  Port {sshd.port}\n  User {sshd.user}\n"
        f"  IdentityFile {sshd.identity}\n"
        f"  ProxyCommand ssh -F {sshd.ssh_config} -o BatchMode=yes "
        f"-o UserKnownHostsFile={sshd.known_hosts} -W %h:%p {sshd.alias}\n")
    r = SshRunner("behind-jump", ssh_config=cfg, known_hosts=sshd.known_hosts)
    assert r.run(["echo", "through the jump"]).stdout == "through the jump\n"
    r.close()

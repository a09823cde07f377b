"""remote_command_line: argv -> one POSIX shell line that a login shell splits back exactly.

Checked here through a real /bin/sh (what sshd runs the command with); the same property is
checked end to end through a real sshd in tests/integration/test_ssh.py.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slurmpod.transport.base import remote_command_line

ECHO_ARGV = [sys.executable, "-c", "import json,sys; print(json.dumps(sys.argv[1:]))"]
HOSTILE = ["it's", 'say "hi"', "$(touch /tmp/x)", "`id`", "a;b", "a\nb", " lead", "trail ",
           "", "*", "~", "$HOME", "a|b&c>d<e", "\\", "!", "#comment", "-n", "é ü 字"]

# Arguments cannot carry NUL; everything else is fair game.
hostile_text = st.text(alphabet=st.characters(blacklist_categories=("Cs",),
                                              blacklist_characters="\x00"), max_size=30)


def through_sh(line: str) -> list[str]:
    out = subprocess.run(["/bin/sh", "-c", line], capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def test_known_hostile_strings_survive() -> None:
    assert through_sh(remote_command_line([*ECHO_ARGV, *HOSTILE])) == HOSTILE


@settings(max_examples=60, deadline=None)
@given(args=st.lists(hostile_text, max_size=4))
def test_any_argv_round_trips_through_sh(args: list[str]) -> None:
    assert through_sh(remote_command_line([*ECHO_ARGV, *args])) == args


def test_env_and_cwd(tmp_path) -> None:
    code = "import os; print(os.environ['X_VAR'] + '|' + os.getcwd())"
    line = remote_command_line([sys.executable, "-c", code], env={"X_VAR": "a b'$(c)"},
                               cwd=str(tmp_path / "we ird"))
    (tmp_path / "we ird").mkdir()
    out = subprocess.run(["/bin/sh", "-c", line], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == f"a b'$(c)|{tmp_path / 'we ird'}"


@pytest.mark.parametrize("bad", ["A B", "1X", "X;rm", "X=Y", ""])
def test_bad_env_names_are_refused(bad: str) -> None:
    with pytest.raises(ValueError, match="invalid environment variable name"):
        remote_command_line(["true"], env={bad: "v"})


def test_empty_argv_refused() -> None:
    with pytest.raises(ValueError):
        remote_command_line([])

"""Prometheus text exposition (format 0.0.4) of hostile label values: a strict reader written
from the format's description (prometheus.io/docs/instrumenting/exposition_formats: label values
escape `\\`, `"` and line feed as `\\\\`, `\\"`, `\\n` and nothing else; HELP escapes `\\` and line
feed; one TYPE per family, before its samples, families not interleaved), plus
`promtool check metrics` (Debian's prometheus package; CI must have it)."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slurmpod.report.prom import Exposition, escape_label
from tests.helpers import promtool_check

_NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
_VALUE = re.compile(r"[-+]?(?:\d+\.?\d*(?:[eE][-+]?\d+)?|\.\d+(?:[eE][-+]?\d+)?|Inf|NaN)")
_TYPES = {"counter", "gauge", "histogram", "summary", "untyped"}
_ESCAPES = {"\\": "\\", '"': '"', "n": "\n"}


def _label_value(line: str, i: int) -> tuple[str, int]:
    """The unescaped value of the quoted label value starting at line[i] == '"'."""
    assert line[i] == '"', line
    out: list[str] = []
    i += 1
    while True:
        assert i < len(line), f"unterminated label value: {line!r}"
        c = line[i]
        if c == '"':
            return "".join(out), i + 1
        if c == "\\":
            assert i + 1 < len(line) and line[i + 1] in _ESCAPES, f"bad escape: {line!r}"
            out.append(_ESCAPES[line[i + 1]])
            i += 2
            continue
        out.append(c)
        i += 1


def parse_sample(line: str) -> tuple[str, dict[str, str], float]:
    m = re.match(_NAME, line)
    assert m, f"no metric name: {line!r}"
    name, i = m.group(0), m.end()
    labels: dict[str, str] = {}
    if i < len(line) and line[i] == "{":
        i += 1
        while line[i] != "}":
            lm = _LABEL_NAME.match(line, i)
            assert lm and line[lm.end()] == "=", f"bad label name: {line!r}"
            key = lm.group(0)
            assert key not in labels and not key.startswith("__"), line
            labels[key], i = _label_value(line, lm.end() + 1)
            if line[i] == ",":
                i += 1
            else:
                assert line[i] == "}", f"expected , or }}: {line!r}"
        i += 1
    rest = line[i:]
    assert rest.startswith(" "), f"no value: {line!r}"
    value, *ts = rest.strip().split(" ")
    assert _VALUE.fullmatch(value) and len(ts) <= 1, f"bad value: {line!r}"
    assert not ts or re.fullmatch(r"-?\d+", ts[0]), line
    return name, labels, float(value)


def check_exposition(text: str) -> list[tuple[str, dict[str, str], float]]:
    """Every line valid and families well formed; returns the samples with unescaped labels."""
    assert text.endswith("\n")
    samples: list[tuple[str, dict[str, str], float]] = []
    typed: dict[str, str] = {}
    helped: set[str] = set()
    done: set[str] = set()  # families whose samples have ended
    current = None
    seen: set[tuple[str, tuple[tuple[str, str], ...]]] = set()
    for line in text[:-1].split("\n"):
        if line.startswith("# HELP "):
            name, _, doc = line[7:].partition(" ")
            assert re.fullmatch(_NAME, name) and name not in helped, line
            assert not re.search(r"\\[^\\n]", doc.replace("\\\\", "")), f"bad escape: {line!r}"
            helped.add(name)
        elif line.startswith("# TYPE "):
            name, _, kind = line[7:].partition(" ")
            assert name not in typed and kind in _TYPES and name not in done, line
            typed[name] = kind
        elif line.startswith("#") or not line:
            continue
        else:
            name, labels, value = parse_sample(line)
            assert name in typed, f"sample before its TYPE: {line!r}"
            if current != name:
                assert name not in done, f"family {name} interleaved"
                if current is not None:
                    done.add(current)
                current = name
            key = (name, tuple(sorted(labels.items())))
            assert key not in seen, f"duplicate series: {line!r}"
            seen.add(key)
            samples.append((name, labels, value))
    return samples


HOSTILE = ['we"ird\\ name\nx', "\\", '"', "\n", "\\n", '\\"', "a}b{c=\"d\"", "x,y=z",
           "tab\there", "cr\rhere", "\u2028\x85\x1f\x1c", "\x01\x7f", "é漢字🙂", "", " ",
           "# HELP", "m{l=\"v\"} 1", "\\\\\\", "trail\\"]


def _expose(values: list[str]) -> str:
    x = Exposition()
    fam = x.family("slurmpod_test_ratio", "Test\nfamily \\ with odd help.")
    for k, v in enumerate(values):
        fam.add({"job_id": str(k), "name": v, "user": v[::-1]}, 0.5)
    return x.render()


def test_escape_label_only_the_three_characters() -> None:
    assert escape_label('a"b\\c\nd') == 'a\\"b\\\\c\\nd'
    assert escape_label("\\n") == "\\\\n" and escape_label("\r\t\u2028") == "\r\t\u2028"


def test_hostile_label_values_round_trip_and_pass_promtool() -> None:
    text = _expose(HOSTILE)
    assert "# HELP slurmpod_test_ratio Test\\nfamily \\\\ with odd help." in text
    samples = check_exposition(text)
    assert [s[1]["name"] for s in samples] == HOSTILE
    assert [s[1]["user"] for s in samples] == [v[::-1] for v in HOSTILE]
    assert text.count("\n") == len(HOSTILE) + 2  # no value split a line (only \n ends one)
    promtool_check(text)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=30),
                min_size=1, max_size=5))
def test_any_label_value_round_trips(values: list[str]) -> None:
    samples = check_exposition(_expose(values))
    assert [s[1]["name"] for s in samples] == values


@pytest.mark.parametrize("bad", [
    'm{l="a\\tb"} 1\n', 'm{l="a"b"} 1\n', 'm{l="a\nb"} 1\n', 'm{l="a\\"} 1\n', "m 1 2 3\n",
    'm{l="a",l="b"} 1\n', "m{1l=\"a\"} 1\n", "m one\n", 'm{l="a"} 1\nm{l="a"} 2\n',
])
def test_the_strict_reader_rejects_what_the_format_forbids(bad: str) -> None:
    with pytest.raises(AssertionError):
        check_exposition("# TYPE m gauge\n" + bad)

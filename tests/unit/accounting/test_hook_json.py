"""Comment v1 and AdminComment v1: schema, merging, size bounds, sacctmgr round trip."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from slurmpod.model.comment import (
    ADMIN_FIELDS,
    ADMIN_STR_KEYS,
    LIVE_KEYS,
    MAX_FIELD_BYTES,
    PROTECTED_KEYS,
    build_admin_comment,
    build_comment,
    decode_field,
    parse_initial_comment,
    validate_admin_comment,
    validate_comment,
)


def sacctmgr_22_05(value: str) -> str:
    """What sacctmgr 22.05 stores for `set AdminComment=<value>` (src/sacctmgr/common.c
    strip_quotes(..., make_lower=1)): quotes become backticks, letters become lower case."""
    return "".join("`" if c in "\"'" else c.lower() for c in value)


LIVE = {"mfu": 0.412345, "tflops": 407.77, "iter": 1200, "tokens_per_s": 123456.7, "peak": 989}


def test_comment_v1_keeps_submit_keys_and_sets_live_ones() -> None:
    initial = json.dumps({"slurmpod": "0.1.0", "run": "gpt-8b", "flops_per_iter": 4.2e15,
                          "gpus": 16, "mfu": 0.1})
    text = build_comment(initial, LIVE, now_s=1700000000.9)
    doc = json.loads(text)
    assert next(iter(doc)) == "v" and doc["v"] == 1
    assert doc["mfu"] == 0.4123 and doc["tflops"] == 407.8 and doc["iter"] == 1200
    assert doc["tokens_per_s"] == 123457 and doc["peak"] == 989 and doc["t"] == 1700000000
    assert doc["run"] == "gpt-8b" and doc["flops_per_iter"] == 4.2e15 and doc["gpus"] == 16
    assert doc["slurmpod"] == "0.1.0"
    assert validate_comment(doc) == []
    assert " " not in text  # compact


def test_comment_drops_stale_live_value() -> None:
    text = build_comment('{"v":1,"mfu":0.5,"iter":10}', {"iter": 20})
    assert json.loads(text) == {"v": 1, "iter": 20}


def test_comment_from_non_json_keeps_it_as_note() -> None:
    doc = json.loads(build_comment("my experiment", {"mfu": 0.3}))
    assert doc == {"v": 1, "mfu": 0.3, "note": "my experiment"}
    assert json.loads(build_comment(None, {})) == {"v": 1}


def test_comment_size_bound_drops_unprotected_keys_first() -> None:
    initial = json.dumps({"flops_per_iter": 1e15, "big": "x" * 900, "small": "y"})
    text = build_comment(initial, LIVE, now_s=1)
    assert len(text.encode()) <= MAX_FIELD_BYTES
    doc = json.loads(text)
    assert "big" not in doc and doc["small"] == "y" and doc["flops_per_iter"] == 1e15


def test_comment_that_cannot_fit_is_an_error() -> None:
    with pytest.raises(ValueError):
        build_comment(json.dumps({"run": "x" * 2000}), LIVE)


# Extra keys a user or another tool may have put in the Comment. Protected keys are slurmpod's
# own (short) submit-time keys; an oversized protected key is an error, tested above.
_EXTRA_KEYS = st.text(min_size=1, max_size=20).filter(
    lambda k: k not in PROTECTED_KEYS and k not in LIVE_KEYS)


@given(st.dictionaries(_EXTRA_KEYS, st.text(max_size=300), max_size=12),
       st.floats(0, 1), st.integers(0, 10**9))
def test_comment_is_always_bounded_json(extra: dict[str, str], mfu: float, it: int) -> None:
    text = build_comment(json.dumps(extra), {"mfu": mfu, "iter": it})
    assert len(text.encode()) <= MAX_FIELD_BYTES
    doc = json.loads(text)
    assert doc["v"] == 1 and doc["iter"] == it and validate_comment(doc) == []


SUMMARY = {"mfu": 0.41234, "mfu_p10": 0.39, "mfu_p90": 0.43, "tflops": 407.8,
           "tflops_mlm": 410.0, "tokens_per_s": 98765.4, "iter_ms": 1234.56, "iters": 1000,
           "last_iter": 1000, "gpus": 16, "peak": 989.0, "goodput": 0.8765, "ttfi_s": 95.2,
           "ckpt_s": 12, "restarts": 1, "fv": "MegatronCore-0.12", "src": "comment",
           "unknown": 5}


def test_admin_comment_v1_schema_and_sacctmgr_round_trip() -> None:
    text = build_admin_comment(SUMMARY)
    doc = json.loads(text)
    assert doc["v"] == 1 and next(iter(doc)) == "v"
    assert "unknown" not in doc and validate_admin_comment(doc) == []
    assert doc["fv"] == "megatroncore-0.12"  # lower-cased up front: survives sacctmgr 22.05
    assert doc["iters"] == 1000 and doc["ttfi_s"] == 95 and doc["goodput"] == 0.8765
    stored = sacctmgr_22_05(text)
    assert '"' not in stored and "`" in stored
    assert decode_field(stored) == doc  # what `sacct` shows decodes to the same document
    assert len(text.encode()) <= MAX_FIELD_BYTES


def test_admin_comment_full_key_set_fits() -> None:
    worst = {k: (10**15 if k not in ADMIN_STR_KEYS else "z" * 200) for k in ADMIN_FIELDS}
    text = build_admin_comment(worst)
    assert len(text.encode()) <= MAX_FIELD_BYTES
    assert validate_admin_comment(json.loads(text)) == []


def test_admin_comment_strings_are_sanitised() -> None:
    doc = json.loads(build_admin_comment({"err": "Symlink: '/etc/shadow' \"x\"\\"}))
    assert doc == {"v": 1, "err": "symlink:-etc-shadow-x-"}
    assert json.loads(build_admin_comment({"mfu": float("nan"), "iters": None})) == {"v": 1}


def test_decode_field_rejects_foreign_text() -> None:
    assert decode_field(None) is None and decode_field("") is None
    assert decode_field("hello") is None and decode_field("{broken") is None
    assert decode_field("[1,2]") is None
    assert decode_field(' {"v":1} ') == {"v": 1}


def test_parse_initial_comment_aliases() -> None:
    got = parse_initial_comment('{"flops":3e15,"gpus":8,"peak_tflops":989,"run":"r"}')
    assert got == {"flops_per_iter": 3e15, "gpus": 8, "peak": 989, "run": "r"}
    assert parse_initial_comment("not json") == {}


def test_validators_catch_bad_documents() -> None:
    assert validate_comment({"v": 2, "mfu": "high", "iter": 1.5})
    assert validate_comment({"v": 1, "mfu": -0.1}) and not validate_comment({"v": 1, "mfu": 1.3})
    assert validate_admin_comment({"v": 1, "mfu": "x", "zzz": 1, "err": "UPPER"})


@pytest.mark.parametrize(
    ("live", "want"),
    [
        ({"tflops": 0.000491, "peak": 0.05, "mfu": 0.0111}, {"tflops": 0.000491, "peak": 0.05,
                                                              "mfu": 0.0111}),
        ({"tflops": 395.6321, "peak": 989.0, "tokens_per_s": 262144.4},
         {"tflops": 395.6, "peak": 989.0, "tokens_per_s": 262144}),
        ({"tokens_per_s": 781.66, "mfu": 0.000012345}, {"tokens_per_s": 781.7, "mfu": 1.234e-05}),
    ],
)
def test_small_figures_keep_four_significant_digits(live: dict, want: dict) -> None:
    doc = json.loads(build_comment(None, live))
    assert {k: doc[k] for k in want} == want

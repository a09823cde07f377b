"""Turn a msgspec ValidationError into slurmpod's one-line message and key path.

msgspec (0.18-0.23) says what is wrong and where, as "Expected `int` >= 1 - at
`$.su_groups[1].nodes_per_su`". Two things a site author needs are missing from that line and
are recovered here from the model's types and the input: the name of a table key inside a dict
(msgspec writes `$.node_types[...]`), and the offending value ("(got 0)"). Runs only on the
error path, so it may use typing introspection freely.
"""

from __future__ import annotations

import math
import re
import types
from typing import Any, Literal, Union, get_args, get_origin, get_type_hints

_AT = re.compile(r"^(?P<msg>.*?)(?: - at `\$(?P<path>[^`]*)`)?$", re.S)
_SEGMENT = re.compile(r"\.(?P<field>[A-Za-z_]\w*)|\[(?P<index>\d+)\]|\[(?P<any>\.\.\.)\]")
_EXPECTED = re.compile(r"^Expected `(?P<type>[^`]+)`(?P<rest>.*?)(?:, got `[^`]+`)?$", re.S)

# msgspec's type words, as a TOML author reads them.
_WORDS = {"int": "an integer", "float": "a number", "str": "a string", "bool": "true or false",
          "object": "a table", "array": "a list", "null": "nothing"}
_MISSING = object()


def explain(message: str, model: Any, data: Any) -> tuple[str, str]:
    """(message, key path) for a msgspec ValidationError `message` raised converting `data`
    to `model`."""
    m = _AT.match(message)
    msg = m.group("msg") if m else message
    loc, tp, value = _walk(model, data, (m.group("path") if m else None) or "")
    key = _format(loc)

    if found := re.fullmatch(r"Object contains unknown field `(.+)`", msg):
        return ("unknown key; remove it or check its spelling (see docs/admin-guide.md)",
                _format([*loc, found.group(1)]))
    if found := re.fullmatch(r"Object missing required field `(.+)`", msg):
        return "required key is missing; add it", _format([*loc, found.group(1)])
    got = f" (got {short_value(value)})" if value is not _MISSING \
        and not isinstance(value, dict | list) else ""
    if isinstance(value, float) and not math.isfinite(value):
        # TOML has inf and nan; a bound check reports them as "> 0.0", which puzzles.
        return f"expected a finite number{got}", key
    if msg.startswith("Invalid enum value"):
        options = _literal_options(tp)
        if options:
            return f"must be one of {', '.join(map(repr, options))}{got}", key
        return f"{msg}{got}", key
    if found := _EXPECTED.match(msg):
        words = " | ".join(_WORDS.get(t, t) for t in found.group("type").split(" | "))
        rest = found.group("rest").replace("\\\\", "\\")  # msgspec shows regexes escaped
        return f"expected {words}{rest}{got}", key
    # A cross-field check (`__post_init__`) that names its own key path moves it into the key.
    head, sep, rest = msg.partition(": ")
    if sep and " " not in head:
        return rest, f"{key}.{head}" if key else head
    return msg, key


def short_value(value: Any) -> str:
    """The value as given, cut to keep the error one readable line."""
    text = repr(value)
    if len(text) <= 60:
        return text
    size = len(value) if isinstance(value, str) else len(text)
    return f"{text[:40]}… ({size} characters)"


def _format(loc: list[str | int]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else ("." if out else "") + str(part)
    return out


def _walk(tp: Any, data: Any, path: str) -> tuple[list[str | int], Any, Any]:
    """Follow msgspec's path through types and data: the key path with dict keys filled in, the
    type and the input value at its end (_MISSING where the input has none)."""
    loc: list[str | int] = []
    for seg in _SEGMENT.finditer(path):
        tp = _member_for(tp, data)
        if seg.group("field"):
            name = seg.group("field")
            loc.append(name)
            tp = _hints(tp).get(name, Any)
            data = data.get(name, _MISSING) if isinstance(data, dict) else _MISSING
        elif seg.group("index"):
            i = int(seg.group("index"))
            loc.append(i)
            tp = (get_args(tp) or (Any,))[0]
            data = data[i] if isinstance(data, list) and i < len(data) else _MISSING
        else:  # a dict value: find the entry that does not validate on its own
            value_tp = (get_args(tp) or (Any, Any))[-1]
            key = _failing_key(data, value_tp) if isinstance(data, dict) else None
            if key is None:
                return loc, value_tp, _MISSING
            loc.append(key)
            tp, data = value_tp, data[key]
    return loc, tp, data


def _failing_key(data: dict[str, Any], value_tp: Any) -> str | None:
    import msgspec  # lazy: start-up (msgspec only when used)

    for key, value in data.items():
        try:
            msgspec.convert(value, value_tp)
        except msgspec.ValidationError:
            return str(key)
    return None


def _hints(tp: Any) -> dict[str, Any]:
    try:
        return get_type_hints(tp)
    except (TypeError, NameError):
        return {}


def _member_for(tp: Any, data: Any) -> Any:
    """The member of a union (`list[int] | Literal['all']`, `X | None`) that `data` is meant for."""
    if get_origin(tp) not in (Union, types.UnionType):
        return tp
    members = [a for a in get_args(tp) if a is not type(None)]
    for member in members:
        origin = get_origin(member) or member
        if isinstance(origin, type) and isinstance(data, origin):
            return member
    return members[0] if members else tp


def _literal_options(tp: Any) -> tuple[Any, ...]:
    if get_origin(tp) in (Union, types.UnionType):
        return tuple(o for a in get_args(tp) for o in _literal_options(a))
    return get_args(tp) if get_origin(tp) is Literal else ()


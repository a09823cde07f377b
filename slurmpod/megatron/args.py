"""Import Megatron arguments: from a command line, a launch script, or the `arguments` dump.

All three give the same thing: a dict keyed by Megatron's argument *destination* names
(`--num-layers 32` -> `num_layers = 32`), ready for a run spec's `[megatron]` table or for
`ModelConfig.from_args`. Pure functions over text; no file I/O except `read_launch_script`.
"""

from __future__ import annotations

import ast
import re
import shlex
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from slurmpod.errors import ConfigError

# Flags whose destination is not the flag name with dashes -> underscores (megatron/training/
# arguments.py, core 0.14): (dest, value stored when the flag is given).
_SPECIAL_FLAGS: dict[str, tuple[str, Any]] = {
    "disable-bias-linear": ("add_bias_linear", False),
    "no-position-embedding": ("add_position_embedding", False),
    "recompute-activations": ("recompute_granularity", "selective"),
    "no-persist-layer-norm": ("persist_layer_norm", False),
    "no-rope-fusion": ("apply_rope_fusion", False),
    "use-flash-attn": ("use_flash_attn", True),
    "no-load-optim": ("no_load_optim", True),
    "no-load-rng": ("no_load_rng", True),
    "no-save-optim": ("no_save_optim", True),
    "no-save-rng": ("no_save_rng", True),
}

_INT = re.compile(r"^[+-]?\d+$")
# Every parser here runs on user text (a launch script may hold a 1 MB line), so each regex is
# anchored or can only start at a point no earlier attempt scanned past: linear, not quadratic.
# `\.py\b` not at a word's start: the `*.py` script of a launch line (`pretrain_gpt.py`).
_PY_IN_WORD = re.compile(r"(?<=.)\.py\b")
# Longest per-layer pattern `moe_layer_freq` may expand to (runspec.MAX_LAYERS).
_MAX_PATTERN = 10_000

_FLOAT = re.compile(r"^[+-]?(\d+\.\d*|\.\d+|\d+)([eE][+-]?\d+)?$")


def _names_script(text: str, after_first_word: bool = False) -> bool:
    r"""True if a whitespace-separated word of `text` holds `X.py` (the old
    `\S+\.py\b` search, which was quadratic in the line length); `after_first_word`
    skips a word that starts the text (the old `\s\S+\.py\b`)."""
    words = text.split()
    if after_first_word and words and text[:1] and not text[:1].isspace():
        words = words[1:]
    return any(_PY_IN_WORD.search(w) for w in words)


_WS = " \t\r\n"
_PLAIN = re.compile(r"[^ \t\r\n'\"\\]+")
_DQ_STOP = re.compile(r"[\"\\]")


def shell_words(text: str) -> list[str]:
    """Split `text` into words as a POSIX shell does: quotes, backslashes, `#` comments at a
    word's start. What `shell_words(text)` gives, but linear: shlex grows each
    word one character at a time (`token += c`), quadratic in a word's length (an 800 KB word
    takes 4 s). Raises ValueError("No closing quotation") as shlex does."""
    words: list[str] = []
    buf: list[str] = []
    in_word = False
    i, n = 0, len(text)
    while i < n:
        ch = text[i]
        if ch in _WS:
            if in_word:
                words.append("".join(buf))
                buf, in_word = [], False
            i += 1
        elif ch == "#" and not in_word:
            j = text.find("\n", i)
            i = n if j < 0 else j
        elif ch == "'":
            j = text.find("'", i + 1)
            if j < 0:
                raise ValueError("No closing quotation")
            buf.append(text[i + 1:j])
            in_word, i = True, j + 1
        elif ch == '"':
            in_word, i = True, i + 1
            while True:
                m = _DQ_STOP.search(text, i)
                if m is None or (text[m.start()] == "\\" and m.start() + 1 >= n):
                    raise ValueError("No closing quotation")
                k = m.start()
                buf.append(text[i:k])
                if text[k] == '"':
                    i = k + 1
                    break
                nxt = text[k + 1]  # bash: inside "", a backslash escapes only these
                if nxt != "\n":
                    buf.append(nxt if nxt in '"\\$`' else "\\" + nxt)
                i = k + 2
        elif ch == "\\":
            if i + 1 >= n:
                raise ValueError("No escaped character")
            if text[i + 1] != "\n":  # backslash-newline joins lines
                buf.append(text[i + 1])
                in_word = True
            i += 2
        else:
            j = _PLAIN.match(text, i).end()  # type: ignore[union-attr]
            buf.append(text[i:j])
            in_word, i = True, j
    if in_word:
        words.append("".join(buf))
    return words


def _scalar(token: str) -> Any:
    if _INT.match(token):
        return int(token)
    if _FLOAT.match(token):
        return float(token)
    if token in ("True", "true"):
        return True
    if token in ("False", "false"):
        return False
    return token


def _moe_layer_freq(value: Any) -> Any:
    """`--moe-layer-freq` takes an int or a Python list expression such as
    `([0]*3+[1]*58)` (Megatron evaluates it); evaluate it safely here."""
    if isinstance(value, int) or not isinstance(value, str):
        return value
    try:
        node = ast.parse(value.strip(), mode="eval").body
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        raise ConfigError(f"cannot read moe_layer_freq {value!r}; use an int or e.g. "
                          "'([0]*3+[1]*58)'", key="moe_layer_freq") from None

    def ev(n: ast.AST) -> Any:
        if isinstance(n, ast.Constant) and isinstance(n.value, int):
            return n.value
        if isinstance(n, ast.List | ast.Tuple):
            return [ev(e) for e in n.elts]
        if isinstance(n, ast.BinOp) and isinstance(n.op, ast.Mult | ast.Add):
            left, right = ev(n.left), ev(n.right)
            if isinstance(n.op, ast.Add):
                if isinstance(left, list) != isinstance(right, list):
                    raise ConfigError(f"cannot add a list and a number in moe_layer_freq "
                                      f"{value!r}", key="moe_layer_freq")
                out = left + right
            else:
                # `[0]*10**12` would exhaust memory before Megatron ever saw it.
                size = (len(left) * right if isinstance(left, list) and isinstance(right, int)
                        else len(right) * left if isinstance(right, list)
                        and isinstance(left, int) else 0)
                if size > _MAX_PATTERN:
                    raise ConfigError(f"moe_layer_freq {value!r} expands to {size} entries; "
                                      f"at most {_MAX_PATTERN} layers", key="moe_layer_freq")
                out = left * right
            if isinstance(out, list) and len(out) > _MAX_PATTERN:
                raise ConfigError(f"moe_layer_freq {value!r} has more than {_MAX_PATTERN} "
                                  "entries", key="moe_layer_freq")
            return out
        raise ConfigError(f"unsupported expression in moe_layer_freq {value!r}",
                          key="moe_layer_freq")

    try:
        out = ev(node)
    except RecursionError:  # a very long `1+1+...` chain
        raise ConfigError(f"moe_layer_freq {value[:40]!r}... is nested too deeply",
                          key="moe_layer_freq") from None
    return list(out) if isinstance(out, tuple) else out


def from_megatron_args(text: str | Iterable[str]) -> dict[str, Any]:
    """`--num-layers 32 --hidden-size 4096 --swiglu ...` -> {'num_layers': 32, ..., 'swiglu': True}.

    A flag followed by another flag (or nothing) is a store_true flag (`--no-x` stores x = False);
    a flag followed by several values keeps them as a list (`--data-path 0.5 a 0.5 b`). Tokens
    before the first flag (a `torchrun ... pretrain_gpt.py` prefix) are ignored.
    """
    try:
        tokens = shell_words(text) if isinstance(text, str) else list(text)
    except ValueError as exc:  # "No closing quotation", "No escaped character"
        raise ConfigError(f"cannot split the Megatron command line: {exc}",
                          hint="close the quote, or quote the whole line in single quotes"
                          ) from None
    script = next((k for k, t in enumerate(tokens) if t.endswith(".py")), None)
    if script is not None:
        tokens = tokens[script + 1:]
    out: dict[str, Any] = {}
    i = 0
    while i < len(tokens) and not tokens[i].startswith("--"):
        i += 1
    while i < len(tokens):
        tok = tokens[i]
        i += 1
        if not tok.startswith("--") or tok == "--":
            continue
        name, eq, inline = tok[2:].partition("=")
        values: list[str] = [inline] if eq else []
        while not eq and i < len(tokens) and not tokens[i].startswith("--"):
            values.append(tokens[i])
            i += 1
        if name in _SPECIAL_FLAGS and not values:
            dest, stored = _SPECIAL_FLAGS[name]
            out[dest] = stored
            continue
        dest = name.replace("-", "_")
        if not values:
            if dest.startswith("no_"):
                out[dest[3:]] = False
            else:
                out[dest] = True
        elif len(values) == 1:
            out[dest] = _scalar(values[0])
        else:
            out[dest] = [_scalar(v) for v in values]
    if "moe_layer_freq" in out:
        out["moe_layer_freq"] = _moe_layer_freq(out["moe_layer_freq"])
    return out


# --- launch scripts -------------------------------------------------------------------------

_ASSIGN = re.compile(r"^\s*(?:export\s+|local\s+|declare\s+(?:-\w+\s+)?)?([A-Za-z_]\w*)=(.*)$")
# A default (`${X:-default}`) holds no `${`: an unclosed `${` is then scanned only up to the next
# one, not to the end of the line for every `${` on it (quadratic). A nested default expands
# from the inside out over `_expand`'s rounds.
_VAR = re.compile(
    r"\$\{([A-Za-z_]\w*)(\[@\]|\[\*\])?(?::?-([^}$]*(?:\$(?!\{)[^}$]*)*))?\}|\$([A-Za-z_]\w*)")
# Expansion may double a line per round (A="$B $B"); stop well before memory runs out.
_MAX_EXPANDED = 64 * 2**20


def _strip_comment(line: str) -> str:
    """Drop a shell comment: `#` at the start of a word, outside quotes."""
    quote = ""
    prev = " "
    for k, ch in enumerate(line):
        if quote:
            if ch == quote:
                quote = ""
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and prev.isspace():
            return line[:k]
        prev = ch
    return line


def _logical_lines(text: str) -> list[str]:
    """Join backslash continuations and multi-line `NAME=( ... )` arrays into single lines."""
    joined = re.sub(r"\\\r?\n", " ", "\n".join(_strip_comment(x) for x in text.splitlines()))
    lines: list[str] = []
    buf: list[str] | None = None  # a list, not `str +=`: linear in an array's line count
    depth = 0
    for raw in joined.splitlines():
        line = raw
        if buf is not None:
            buf.append(line)
            depth += _paren_delta(line)
            if depth <= 0:
                lines.append(" ".join(buf))
                buf = None
            continue
        m = _ASSIGN.match(line)
        if m and m.group(2).lstrip().startswith("("):
            depth = _paren_delta(m.group(2))
            if depth > 0:
                buf = [line]
                continue
        lines.append(line)
    if buf is not None:
        lines.append(" ".join(buf))
    return lines


def _paren_delta(s: str) -> int:
    return s.count("(") - s.count(")")


def _expand(s: str, env: dict[str, str]) -> str:
    def sub(m: re.Match[str]) -> str:
        name = m.group(1) or m.group(4)
        default = m.group(3)
        if name in env:
            return env[name]
        if default is not None:
            return default
        return m.group(0)

    for _ in range(5):  # nested definitions (A="$B $C")
        new = _VAR.sub(sub, s)
        if new == s:
            break
        if len(new) > _MAX_EXPANDED:
            raise ConfigError(f"variables expand to more than {_MAX_EXPANDED // 2**20} MiB "
                              "of text; is a variable defined in terms of itself?")
        s = new
    return s


def from_launch_script(text: str) -> dict[str, Any]:
    """Megatron arguments from a launch script: variables and arrays defined in the script are
    substituted; the arguments are those after the first `*.py` on the line that runs it.

    Pragmatic, not a shell: `$((...))`, functions and conditionals are not evaluated. A
    variable that is not defined in the script stays literal (`$TP`), and validation then
    names the key that holds it.
    """
    env: dict[str, str] = {}
    launch: str | None = None
    for line in _logical_lines(text):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        m = _ASSIGN.match(line)
        if m and not _names_script(m.group(2), after_first_word=True):
            name, value = m.group(1), m.group(2).strip()
            is_array = value.startswith("(") and value.endswith(")")
            if is_array:
                value = value[1:-1]
            try:
                parts = shell_words(_expand(value, env))
            except ValueError:
                parts = [value]
            # An array keeps its words; a scalar is word-split where it is used unquoted.
            env[name] = " ".join(shlex.quote(p) for p in parts) if is_array else " ".join(parts)
            continue
        if ("--" in stripped or "$" in stripped) and _names_script(stripped):
            launch = stripped
    if launch is None:
        raise ConfigError("no `*.py` launch line with Megatron arguments found in the script",
                          hint="pass the arguments with --from-megatron-args instead")
    expanded = _expand(launch, env)
    try:
        tokens = shell_words(expanded)
    except ValueError as exc:
        raise ConfigError(f"cannot split the launch line: {exc}") from None
    for k, tok in enumerate(tokens):
        if tok.endswith(".py"):
            tokens = tokens[k + 1:]
            break
    return from_megatron_args(tokens)


def read_launch_script(path: Path | str) -> dict[str, Any]:
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read: {exc.strerror}", file=str(path)) from None
    except UnicodeDecodeError:
        raise ConfigError("not UTF-8 text", file=str(path)) from None
    try:
        return from_launch_script(text)
    except ConfigError as exc:
        raise ConfigError(exc.message, file=str(path), hint=exc.hint) from None


# --- the `arguments` dump ---------------------------------------------------------------------

# Megatron's `_print_args` (megatron/training/arguments.py): `  {name} {'.' * (48 - len)} {value}`
# between `---- arguments ----` and `---- end of arguments ----`. Log lines may carry prefixes
# (srun --label `0: `, timestamps), so the name is found after any whitespace.
# Matched against a right-stripped line, so the value is a greedy `(.*)` (a lazy `(.*?)\s*$`
# is quadratic in a run of spaces).
_DUMP_LINE = re.compile(r"(?:^|\s)([A-Za-z_][A-Za-z0-9_]*) \.+ (.*)$")
# A name of 48+ characters gets no dots: `  {name}  {value}` (two spaces).
_DUMP_LONG = re.compile(r"(?:^|\s)([A-Za-z_][A-Za-z0-9_]{47,})  (\S.*)$")
# megatron/training/tokenizer: ` > padded vocab (size: V) with K dummy tokens (new size: P)`.
_PADDED = re.compile(r"> padded vocab \(size: (\d+)\) with \d+ dummy tokens \(new size: (\d+)\)")
# `(?<!-)` starts a match only at the first dash of a run and `++`/`*+` never give back: a line
# of a million dashes is scanned once, not once per dash.
_BANNER_START = re.compile(r"(?<!-)-{3,}+\s*+arguments\s*+---")
_BANNER_END = re.compile(r"(?<!-)-{3,}+\s*+end of arguments\s*+---")


# inf and nan: str() of a float argument that is unbounded or unset (`--clip-grad inf`).
_FLOAT_WORD = re.compile(r"^[+-]?(inf|nan)$")
# Longest literal evaluated: a per-layer list of _MAX_PATTERN entries fits; a longer `[[[...`
# line is kept as text rather than parsed.
_MAX_LITERAL = 1 << 16


def _dump_value(raw: str) -> Any:
    """A value as `_print_args` printed it (str() of the Python value) -> that value where it
    is a literal (tuples become lists, as JSON and TOML have no tuple); anything else
    (`torch.bfloat16`, paths) stays a string."""
    if raw == "None":
        return None
    if raw in ("True", "False"):
        return raw == "True"
    if _INT.match(raw):
        return int(raw)
    if _FLOAT.match(raw) or _FLOAT_WORD.match(raw):
        return float(raw)
    if raw[:1] in "[({'\"" and len(raw) <= _MAX_LITERAL:
        try:
            val = ast.literal_eval(raw)
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            return raw
        return list(val) if isinstance(val, tuple) else val
    return raw


def parse_arguments_dump(lines: str | Iterable[str], *, strict: bool = True) -> dict[str, Any]:
    """Megatron's start-up `arguments` dump (from a job log) -> {dest name: value}.

    The one reader of the dump: `plan`/`mfu` call it on a log, the log parser on the lines it
    collected between the banners. Only the first dump is read when banners are present;
    values are Python literals where they parse (`None`, `True`, `32`, `inf`, `[0, 1, 1]`),
    strings otherwise (`torch.bfloat16`). When the lines also hold the tokenizer's
    `> padded vocab (size: V) ... (new size: P)` line, `padded_vocab_size` (and a missing
    `vocab_size`) come from it, so a whole job log is enough for `flops_per_iteration`.
    `strict=False` (accounting): a `moe_layer_freq` that cannot be expanded stays as printed
    instead of raising ConfigError, so one odd value does not lose the whole dump.
    """
    all_rows = lines.splitlines() if isinstance(lines, str) else list(lines)
    start = next((k for k, line in enumerate(all_rows) if _BANNER_START.search(line)), None)
    rows = all_rows[start + 1:] if start is not None else all_rows
    out: dict[str, Any] = {}
    for line in rows:
        if start is not None and (_BANNER_END.search(line) or _BANNER_START.search(line)):
            break
        line = line.rstrip()
        m = _DUMP_LINE.search(line) or _DUMP_LONG.search(line)
        if m:
            out[m.group(1)] = _dump_value(m.group(2))
    if out.get("padded_vocab_size") is None:
        # The tokenizer reports the padded size after the dump (the dump has no such key).
        for line in all_rows:
            pm = _PADDED.search(line)
            if pm:
                out["padded_vocab_size"] = int(pm.group(2))
                if out.get("vocab_size") is None:
                    out["vocab_size"] = int(pm.group(1))
                break
    if "moe_layer_freq" in out:
        try:
            out["moe_layer_freq"] = _moe_layer_freq(out["moe_layer_freq"])
        except ConfigError:
            if strict:
                raise
    return out

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
_FLOAT = re.compile(r"^[+-]?(\d+\.\d*|\.\d+|\d+)([eE][+-]?\d+)?$")


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
    except SyntaxError:
        raise ConfigError(f"cannot read moe_layer_freq {value!r}; use an int or e.g. "
                          "'([0]*3+[1]*58)'", key="moe_layer_freq") from None

    def ev(n: ast.AST) -> Any:
        if isinstance(n, ast.Constant) and isinstance(n.value, int):
            return n.value
        if isinstance(n, ast.List | ast.Tuple):
            return [ev(e) for e in n.elts]
        if isinstance(n, ast.BinOp) and isinstance(n.op, ast.Mult | ast.Add):
            left, right = ev(n.left), ev(n.right)
            return left * right if isinstance(n.op, ast.Mult) else left + right
        raise ConfigError(f"unsupported expression in moe_layer_freq {value!r}",
                          key="moe_layer_freq")

    out = ev(node)
    return list(out) if isinstance(out, tuple) else out


def from_megatron_args(text: str | Iterable[str]) -> dict[str, Any]:
    """`--num-layers 32 --hidden-size 4096 --swiglu ...` -> {'num_layers': 32, ..., 'swiglu': True}.

    A flag followed by another flag (or nothing) is a store_true flag (`--no-x` stores x = False);
    a flag followed by several values keeps them as a list (`--data-path 0.5 a 0.5 b`). Tokens
    before the first flag (a `torchrun ... pretrain_gpt.py` prefix) are ignored.
    """
    tokens = shlex.split(text, comments=True) if isinstance(text, str) else list(text)
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
_VAR = re.compile(r"\$\{([A-Za-z_]\w*)(\[@\]|\[\*\])?(?::?-([^}]*))?\}|\$([A-Za-z_]\w*)")


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
    buf: str | None = None
    depth = 0
    for raw in joined.splitlines():
        line = raw
        if buf is not None:
            buf += " " + line
            depth += _paren_delta(line)
            if depth <= 0:
                lines.append(buf)
                buf = None
            continue
        m = _ASSIGN.match(line)
        if m and m.group(2).lstrip().startswith("("):
            depth = _paren_delta(m.group(2))
            if depth > 0:
                buf = line
                continue
        lines.append(line)
    if buf is not None:
        lines.append(buf)
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
        if m and not re.search(r"\s\S+\.py\b", m.group(2)):
            name, value = m.group(1), m.group(2).strip()
            is_array = value.startswith("(") and value.endswith(")")
            if is_array:
                value = value[1:-1]
            try:
                parts = shlex.split(_expand(value, env), comments=True)
            except ValueError:
                parts = [value]
            # An array keeps its words; a scalar is word-split where it is used unquoted.
            env[name] = " ".join(shlex.quote(p) for p in parts) if is_array else " ".join(parts)
            continue
        if re.search(r"\S+\.py\b", stripped) and ("--" in stripped or "$" in stripped):
            launch = stripped
    if launch is None:
        raise ConfigError("no `*.py` launch line with Megatron arguments found in the script",
                          hint="pass the arguments with --from-megatron-args instead")
    expanded = _expand(launch, env)
    try:
        tokens = shlex.split(expanded, comments=True)
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
_DUMP_LINE = re.compile(r"(?:^|\s)([A-Za-z_][A-Za-z0-9_]*) \.+ (.*?)\s*$")
# A name of 48+ characters gets no dots: `  {name}  {value}` (two spaces).
_DUMP_LONG = re.compile(r"(?:^|\s)([A-Za-z_][A-Za-z0-9_]{47,})  (\S.*?)\s*$")
# megatron/training/tokenizer: ` > padded vocab (size: V) with K dummy tokens (new size: P)`.
_PADDED = re.compile(r"> padded vocab \(size: (\d+)\) with \d+ dummy tokens \(new size: (\d+)\)")
_BANNER_START = re.compile(r"-{3,}\s*arguments\s*-{3,}")
_BANNER_END = re.compile(r"-{3,}\s*end of arguments\s*-{3,}")


def _dump_value(raw: str) -> Any:
    if raw == "None":
        return None
    if raw in ("True", "False"):
        return raw == "True"
    if raw[:1] in "[({" or _FLOAT.match(raw) or raw[:1] in "'\"":
        try:
            return ast.literal_eval(raw)
        except (ValueError, SyntaxError, MemoryError, RecursionError):
            return raw
    return raw


def parse_arguments_dump(lines: str | Iterable[str]) -> dict[str, Any]:
    """Megatron's start-up `arguments` dump (from a job log) -> {dest name: value}.

    Only the first dump is read when banners are present; values are Python literals where
    they parse (`None`, `True`, `32`, `[0, 1, 1]`), strings otherwise (`torch.bfloat16`).
    When the lines also hold the tokenizer's `> padded vocab (size: V) ... (new size: P)` line,
    `padded_vocab_size` (and a missing `vocab_size`) come from it, so a whole job log is enough
    for `flops_per_iteration`.
    """
    all_rows = lines.splitlines() if isinstance(lines, str) else list(lines)
    start = next((k for k, line in enumerate(all_rows) if _BANNER_START.search(line)), None)
    rows = all_rows[start + 1:] if start is not None else all_rows
    out: dict[str, Any] = {}
    for line in rows:
        if start is not None and (_BANNER_END.search(line) or _BANNER_START.search(line)):
            break
        line = line.rstrip("\n")
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
        out["moe_layer_freq"] = _moe_layer_freq(out["moe_layer_freq"])
    return out

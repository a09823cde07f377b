"""Stand-in for `sacct` in unit tests, printing what sacct would with the query's own
`--delimiter=` (slurmpod chooses a fresh one per query: backends.parse).

    fake_sacct.py FILE us|pipe SACCT-ARGS...   a recorded sample written with the unit separator
                                               or `|`, that delimiter replaced
    fake_sacct.py FILE json SACCT-ARGS...      FILE holds a JSON list of records (lists of field
                                               values, printed verbatim as sacct does: any text)
"""

from __future__ import annotations

import json
import sys

RECORDED = {"us": "\x1f", "pipe": "|"}


def main(argv: list[str]) -> int:
    path, recorded, *args = argv
    delimiter = next((a.partition("=")[2] for a in args if a.startswith("--delimiter=")), "|")
    with open(path, encoding="utf-8", newline="") as f:
        text = f.read()
    if recorded == "json":
        text = "".join(delimiter.join(row) + "\n" for row in json.loads(text))
    else:
        text = text.replace(RECORDED[recorded], delimiter)
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""JSON from users (graph files, results given to ``kc report --from``, trace inputs) read with a depth limit.

Python's ``json`` recurses once per nesting level: a 100,000-deep file is a RecursionError, and a file that
parses thousands of levels deep sends the code that walks it into the same error. The contract loader limits
YAML nesting (``obligations.contract.MAX_DEPTH``); this is the same limit for JSON, found by a scan that
skips strings, before anything parses, and reported at its line and column.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

__all__ = ["MAX_DEPTH", "JsonInputError", "loads", "load"]

MAX_DEPTH = 64  # nesting of arrays and objects; results need 8, graph files 6

_TOKEN = re.compile(r'"(?:[^"\\]|\\.)*"|[\[\]{}]', re.DOTALL)


class JsonInputError(ValueError):
    """JSON that cannot be read: not JSON, nested too deep, or not readable (message: ``where:line:col: why``)."""


def _line_col(text: str, pos: int) -> tuple[int, int]:
    line = text.count("\n", 0, pos) + 1
    return line, pos - (text.rfind("\n", 0, pos) + 1) + 1


def loads(text: str, where: str, max_depth: int = MAX_DEPTH) -> Any:
    """Parse ``text``; JsonInputError located in ``where`` if it is not JSON or nests deeper than ``max_depth``."""
    depth = 0
    for m in _TOKEN.finditer(text):
        c = m.group()
        if c in "[{":
            depth += 1
            if depth > max_depth:
                line, col = _line_col(text, m.start())
                raise JsonInputError(f"{where}:{line}:{col}: JSON nested more than {max_depth} levels deep")
        elif c in "]}":
            depth -= 1
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise JsonInputError(f"{where}:{e.lineno}:{e.colno}: not JSON: {e.msg}") from None
    except (RecursionError, ValueError) as e:  # a number too long to convert, and the like
        raise JsonInputError(f"{where}: not JSON: {e}") from None


def load(path: str | Path, max_depth: int = MAX_DEPTH) -> Any:
    """Read and parse the JSON file ``path`` (UTF-8) with :func:`loads`; unreadable files are JsonInputError."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise JsonInputError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    except OSError as e:
        raise JsonInputError(f"{path}: {e.strerror or e}") from None
    return loads(text, str(path), max_depth)

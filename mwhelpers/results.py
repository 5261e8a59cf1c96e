"""What worker programs report to the kernel: one tagged line each, read back as dicts.

A worker program that wants to hand numbers to the notebook prints one line,
a tag and JSON::

    print("RESULT " + json.dumps({"loss": history.history["loss"], "chief": is_chief}))

and progress lines as a tag with ``key=value`` pairs, where a bare leading
value is named after the tag::

    print(f"STEP {step} loss={loss:.4f}")      # -> {"step": 5, "loss": 0.1234}

The kernel reads them back with :meth:`Runtime.results` (the last ``RESULT``
of every task, as a :class:`Results` table) and :meth:`TaskRun.records`
(every line of one tag), or, for logs written without the extension, with
:func:`read_results`.  A cell that streams a task's output does not show its
``RESULT {...}`` lines (they are for the machine, and long); its log keeps them.
"""

from __future__ import annotations

import html
import json
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

TAG = "RESULT"


def _number(text: str) -> int | float | str:
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def parse(line: str, tag: str = TAG) -> dict[str, Any] | None:
    """The values of one ``TAG ...`` line, or None when the line has another tag.

    ``TAG {json object}`` gives the object; ``TAG 5 loss=0.1 name=x`` gives
    ``{"tag": 5, "loss": 0.1, "name": "x"}`` (the tag lowercased names the bare value).
    A ``TAG {`` line whose JSON does not parse raises ValueError naming the line.
    """
    if not line.startswith(tag):
        return None
    rest = line[len(tag):]
    if rest and not rest[0].isspace():
        return None  # "RESULTS ..." is not a RESULT line
    rest = rest.strip()
    if rest.startswith("{"):
        try:
            record: dict[str, Any] = json.loads(rest)
            return record
        except json.JSONDecodeError as err:
            raise ValueError(f"a {tag} line is not valid JSON ({err.msg} at column "
                             f"{err.pos + len(tag) + 2}): {line[:200]}") from None
    values: dict[str, Any] = {}
    bare: list[int | float | str] = []
    for token in rest.split():
        key, eq, value = token.partition("=")
        if eq:
            values[key] = _number(value)
        else:
            bare.append(_number(token))
    if bare:
        values = {tag.lower(): bare[0] if len(bare) == 1 else bare, **values}
    return values


def records(lines: Iterable[str], tag: str = TAG) -> list[dict[str, Any]]:
    """Every ``TAG`` line among ``lines``, parsed, in order."""
    found = (parse(line, tag) for line in lines)
    return [r for r in found if r is not None]


def last(lines: Iterable[str], tag: str = TAG) -> dict[str, Any] | None:
    """The last ``TAG`` line among ``lines``, parsed; None when there is none."""
    found = records(lines, tag)
    return found[-1] if found else None


def read_results(logs: Mapping[str, str | os.PathLike[str]], tag: str = TAG) -> Results:
    """The last ``TAG`` line of each log file, for logs written without the extension:
    ``read_results({"worker:0": "job_0.log", "worker:1": "job_1.log"})``.
    A log without one is left out of the table (its task is in ``.missing``)."""
    return Results.collect(((task, Path(path).read_text(errors="replace").splitlines())
                            for task, path in logs.items()), tag)


# -- the table ---------------------------------------------------------------------------------
def _flat(value: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, v in value.items():
        name = f"{prefix}{key}"
        if isinstance(v, Mapping):
            out.update(_flat(v, f"{name}."))
        else:
            out[name] = v
    return out


def _short(value: object, width: int = 32) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, (list, tuple)):
        if value and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value):
            if len(value) == 1:
                return _short(value[0])
            return f"{_short(value[0])} -> {_short(value[-1])} ({len(value)})"
        text = json.dumps(value)
    else:
        text = str(value)
    return text if len(text) <= width else text[:width - 3] + "..."


class Results(dict[str, dict[str, Any]]):
    """Task name -> the dict its program reported; shown as a table, one row per task.

    Nested dicts become dotted columns (``history.loss``); a list of numbers is
    shown as its first and last value and its length (the dict keeps it whole).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.missing: list[str] = []

    @classmethod
    def collect(cls, logs: Iterable[tuple[object, Iterable[str]]], tag: str = TAG) -> Results:
        """The last ``TAG`` line of each (task, its log's lines); tasks without one go to
        ``.missing``."""
        found = cls()
        for task, lines in logs:
            value = last(lines, tag)
            if value is None:
                found.missing.append(str(task))
            else:
                found[str(task)] = value
        return found

    def rows(self) -> tuple[list[str], list[list[str]]]:
        flat = {task: _flat(value) for task, value in self.items()}
        columns: list[str] = []
        for values in flat.values():
            columns += [c for c in values if c not in columns]
        rows = [[task] + [_short(values[c]) if c in values else "" for c in columns]
                for task, values in flat.items()]
        return ["task"] + columns, rows

    def table(self) -> str:
        header, rows = self.rows()
        widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
        lines = ["  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip()
                 for r in [header, *rows]]
        lines.insert(1, "  ".join("-" * w for w in widths))
        if self.missing:
            lines.append(f"(no result yet from {', '.join(self.missing)})")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.table() if self or self.missing else "(no results)"

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:
        p.text(str(self))

    def _repr_html_(self) -> str:
        header, rows = self.rows()
        head = "".join(f"<th>{html.escape(c)}</th>" for c in header)
        body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>" for r in rows)
        note = (f"<p>no result yet from {html.escape(', '.join(self.missing))}</p>"
                if self.missing else "")
        return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>{note}"

"""Cells that need machines the reader may not have show what they printed in a recorded run.

A notebook part that needs SSH hosts or a Slurm cluster cannot run on a laptop, yet a cell
that prints nothing teaches nothing.  Such cells carry a tag ``replay:KEY``; after a real run
(on real hosts, or the suite's test hosts), :func:`record` saves their outputs, with their
source, to a JSON file kept next to the notebook.  On a machine without the hosts the cell
calls ``recording.show(KEY)``, which displays those outputs under a line saying they were
recorded elsewhere and not run here::

    python -m mwhelpers.workshop.suite notebooks/10_more_machines.ipynb         # runs on test hosts
    python -m mwhelpers.workshop.replay output/10_more_machines.ipynb notebooks/recorded/10_more_machines.json

A recorded cell whose source has changed since is stale; :func:`stale` lists them, so a
test can insist that the recording is made again.
"""

from __future__ import annotations

import datetime
import html
import json
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypedDict, final

TAG_PREFIX = "replay:"
FORMAT = 1


# What is read of an executed notebook (nbformat 4's JSON; an nbformat node is such a dict).
class CellMetadata(TypedDict, total=False):
    tags: list[str]


class NotebookOutput(TypedDict, total=False):
    output_type: str
    name: str  # a stream's
    text: str | list[str]  # a stream's
    data: dict[str, str | list[str]]  # displayed data, by MIME type
    ename: str  # an error's
    evalue: str


class NotebookCell(TypedDict, total=False):
    metadata: CellMetadata
    source: str | list[str]
    outputs: list[NotebookOutput]


class PapermillMetadata(TypedDict, total=False):
    end_time: str | None


class NotebookMetadata(TypedDict, total=False):
    papermill: PapermillMetadata


class Notebook(TypedDict, total=False):
    cells: list[NotebookCell]
    metadata: NotebookMetadata


# What a recording keeps (its JSON file); final, so that ``"stream" in output`` tells them apart.
@final
class StreamOutput(TypedDict):
    stream: str  # "stdout" or "stderr"
    text: str


@final
class DataOutput(TypedDict):
    data: dict[str, str]  # text/plain, text/html, image/png


KeptOutput = StreamOutput | DataOutput


class RecordedCell(TypedDict):
    source: str
    outputs: list[KeptOutput]


class RecordingData(TypedDict):
    format: int
    recorded: str
    note: str
    cells: dict[str, RecordedCell]


class RecordingError(Exception):
    """A recording cannot be made or read as asked."""


def _key(cell: NotebookCell) -> str | None:
    keys = [t[len(TAG_PREFIX):] for t in cell.get("metadata", {}).get("tags", []) if t.startswith(TAG_PREFIX)]
    return keys[0] if keys else None


def tagged_cells(nb: Notebook) -> dict[str, NotebookCell]:
    """KEY -> cell, for the cells of a notebook (an nbformat node or plain dict) tagged
    ``replay:KEY``.  A key used twice is an error."""
    found: dict[str, NotebookCell] = {}
    for cell in nb["cells"]:
        key = _key(cell)
        if key is None:
            continue
        if key in found:
            raise RecordingError(f"two cells are tagged {TAG_PREFIX}{key}: give each its own key")
        found[key] = cell
    return found


def _source(cell: NotebookCell) -> str:
    src = cell["source"]
    return "".join(src) if isinstance(src, list) else src


def _kept(output: NotebookOutput) -> KeptOutput | None:
    """An output as the recording keeps it: streams and displayed data (text, HTML, images)."""
    kind = output["output_type"]
    if kind == "stream":
        text = output["text"]
        return {"stream": output["name"], "text": "".join(text) if isinstance(text, list) else text}
    if kind in ("display_data", "execute_result"):
        return {"data": {mime: "".join(v) if isinstance(v, list) else v
                         for mime, v in output["data"].items()
                         if mime in ("text/plain", "text/html", "image/png")}}
    return None  # an error output: a recording of a failed run is refused before this


def record(executed: str | os.PathLike[str], path: str | os.PathLike[str],
           note: str = "") -> RecordingData:
    """Save the outputs of ``executed``'s ``replay:KEY`` cells to ``path`` (JSON).

    ``executed`` is a notebook that ran where those cells could (its outputs are kept);
    ``note`` says where that was.  A tagged cell that printed nothing or failed is refused:
    the recording would teach nothing, or the wrong thing.
    """
    nb: Notebook = json.loads(Path(executed).read_text())
    cells = tagged_cells(nb)
    if not cells:
        raise RecordingError(f"{executed} has no cell tagged {TAG_PREFIX}KEY: nothing to record")
    saved: dict[str, RecordedCell] = {}
    for key, cell in cells.items():
        outputs = cell.get("outputs", [])
        errors = [o for o in outputs if o["output_type"] == "error"]
        if errors:
            first = errors[0]
            raise RecordingError(f"cell {TAG_PREFIX}{key} failed in {executed} ({first.get('ename')}: "
                                 f"{first.get('evalue')}): record a run that passed")
        kept = [k for k in map(_kept, outputs) if k is not None]
        if not kept:
            raise RecordingError(f"cell {TAG_PREFIX}{key} printed nothing in {executed}: was it skipped? "
                                 "Record a run where the hosts it needs were there")
        saved[key] = {"source": _source(cell), "outputs": kept}
    meta = nb.get("metadata", {}).get("papermill", {})
    when = (meta.get("end_time") or datetime.datetime.now(datetime.timezone.utc).isoformat())[:10]
    recording: RecordingData = {"format": FORMAT, "recorded": when, "note": note, "cells": saved}
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(recording, indent=1, sort_keys=True) + "\n")
    return recording


def stale(notebook: str | os.PathLike[str], path: str | os.PathLike[str]) -> list[str]:
    """What no longer matches between ``notebook``'s tagged cells and the recording at
    ``path``: one sentence per key that is missing, extra or whose source changed."""
    cells = tagged_cells(json.loads(Path(notebook).read_text()))
    saved = Recording.load(path).cells
    problems = [f"{key}: not recorded" for key in cells if key not in saved]
    problems += [f"{key}: recorded, but no cell is tagged {TAG_PREFIX}{key} any more"
                 for key in saved if key not in cells]
    problems += [f"{key}: the cell changed since it was recorded" for key, cell in cells.items()
                 if key in saved and saved[key]["source"] != _source(cell)]
    return problems


class Recording:
    """The saved outputs of a notebook's ``replay:KEY`` cells, shown with :meth:`show`."""

    def __init__(self, data: RecordingData, path: Path | None = None) -> None:
        # (``data`` is read from JSON: checked here before it is trusted)
        if data.get("format") != FORMAT or not isinstance(data.get("cells"), dict):
            raise RecordingError(f"{path or 'this'} is not a recording mwhelpers {FORMAT} can read")
        self.path = path
        self.recorded = data.get("recorded", "")
        self.note = data.get("note", "")
        self.cells: dict[str, RecordedCell] = data["cells"]

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Recording:
        path = Path(path)
        try:
            return cls(json.loads(path.read_text()), path)
        except FileNotFoundError:
            raise RecordingError(f"no recording at {path}") from None
        except json.JSONDecodeError as err:
            raise RecordingError(f"{path} is not valid JSON ({err.msg}, line {err.lineno})") from None

    @classmethod
    def find(cls, name: str, start: str | os.PathLike[str] | None = None) -> Recording:
        """The recording ``recorded/NAME.json`` beside the notebook: looked for in the folder
        of the notebook this kernel runs (``JPY_SESSION_NAME``, which Jupyter Server and the
        suite set), then from ``start`` (default: the current folder) and the folders above
        it, also under their ``notebooks/`` folder."""
        start = Path(start or Path.cwd()).resolve()
        folders = [start, *start.parents]
        session = os.environ.get("JPY_SESSION_NAME")
        if session:
            folders.insert(0, Path(session).resolve().parent)
        for folder in folders:
            for candidate in (folder / "recorded" / f"{name}.json",
                              folder / "notebooks" / "recorded" / f"{name}.json"):
                if candidate.is_file():
                    return cls.load(candidate)
        raise RecordingError(f"no recorded/{name}.json beside this notebook ({folders[0]}) nor in "
                             f"{start} or the folders above it: start the kernel in the notebook's folder")

    def header(self, why: str) -> str:
        where = f" {self.note}" if self.note else ""
        return f"[not run here: {why}. Recorded on {self.recorded}{where}:]"

    def show(self, key: str, why: str = "the machines it needs are not available") -> None:
        """Display what the cell tagged ``replay:KEY`` printed in the recorded run, below a
        line that says why it did not run here."""
        if key not in self.cells:
            raise RecordingError(f"the recording {self.path or ''} has no cell {key!r} "
                                 f"(it has {', '.join(sorted(self.cells))})")
        from IPython.display import publish_display_data

        line = self.header(why)
        publish_display_data({"text/plain": line,
                              "text/html": f"<p><i>{html.escape(line)}</i></p>"})
        for out in self.cells[key]["outputs"]:
            if "stream" in out:
                stream = sys.stderr if out["stream"] == "stderr" else sys.stdout
                stream.write(out["text"])
                stream.flush()
            else:
                publish_display_data(out["data"])


def stand_in(name: str, needed: bool = True,
             start: str | os.PathLike[str] | None = None) -> Callable[[str, str], None]:
    """``not_here(key, why)``, called instead of a cell that cannot run here: it shows what the
    cell tagged ``replay:KEY`` printed in the notebook's recorded run (:meth:`Recording.find`
    of ``name``, looked for once, where ``needed``), or prints ``SKIPPED: why`` where there is
    none (said once, with the reason)."""
    recording = None
    if needed:
        try:
            recording = Recording.find(name, start)
        except RecordingError as e:
            print("no recorded run to show:", e)

    def not_here(key: str, why: str) -> None:
        if recording is None:
            print(f"SKIPPED: {why}")
        else:
            recording.show(key, why)

    return not_here


def main(argv: Sequence[str] | None = None) -> int:
    import argparse

    p = argparse.ArgumentParser(prog="python -m mwhelpers.workshop.replay",
                                description="Save the outputs of an executed notebook's replay:KEY cells.")
    p.add_argument("executed", help="a notebook that ran where those cells could (with outputs)")
    p.add_argument("recording", help="the JSON file to write (e.g. notebooks/recorded/NAME.json)")
    p.add_argument("--note", default="", help="where it ran, shown in the line above each replay")
    args = p.parse_args(argv)
    try:
        saved = record(args.executed, args.recording, args.note)
    except (RecordingError, OSError, json.JSONDecodeError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"recorded {len(saved['cells'])} cell(s) of {args.executed} in {args.recording}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""How the tutorials read: words and sentence lengths of the notebooks' markdown.

    .venv/bin/python benchmarks/prose.py [NOTEBOOK ...] [--long] [--limits]

Counts the prose a learner reads in the markdown cells: fenced code blocks, tables, HTML
lines and images are left out; headings count as words but not as sentences; every list item
is a sentence of its own (and is split further where it holds several sentences). Inline code
counts as one word. Prints, per notebook, the words, the sentences, the mean sentence length,
the longest sentence and how many sentences are over 35 words, then the suite's totals.

`--long` lists the sentences over 35 words. `--limits` exits 1 unless the suite holds at most
18,000 words, every notebook's mean sentence is at most 17 words and no sentence is over 35
(issue 41's goals). `--docs` measures the guide's pages, the cheat sheet and the README instead
(markdown files), against the same sentence goals (issue 52).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

MAX_WORDS = 18_000
MAX_MEAN = 17.0
MAX_SENTENCE = 35

_CODE_SPAN = re.compile(r"`[^`]*`")
_LINK = re.compile(r"!?\[([^\]]*)\]\([^)]*\)")
_LIST_ITEM = re.compile(r"^\s*(?:[-*+]|\d+[.)])\s+")
_HEADING = re.compile(r"^\s*#{1,6}\s")
# A sentence ends at . ! ? (optionally closed by a quote or bracket) before a space and
# an upper-case letter, a digit, a quote, a bracket or inline code; abbreviations are kept.
_END = re.compile(r"(?<!\be\.g)(?<!\bi\.e)(?<!\bvs)(?<!\betc)[.!?][\"')\]]*\s+(?=[A-Z0-9\"'(`])")
_WORD = re.compile(r"[A-Za-z0-9\u00c0-\uffff][\w'\u2019./+-]*")


@dataclass
class Prose:
    name: str
    words: int = 0
    sentences: list[int] = field(default_factory=list)
    long: list[str] = field(default_factory=list)

    @property
    def mean(self) -> float:
        return sum(self.sentences) / len(self.sentences) if self.sentences else 0.0


def _blocks(markdown: str) -> list[tuple[str, bool]]:
    """Split a cell's markdown into (text, is_heading) units: paragraphs and list items."""
    units: list[tuple[str, bool]] = []
    current: list[str] = []
    fenced = False

    def flush() -> None:
        if current:
            units.append((" ".join(current), False))
            current.clear()

    for line in markdown.splitlines():
        stripped = line.strip()
        if stripped.startswith(("```", "~~~")):
            fenced = not fenced
            flush()
            continue
        if fenced:
            continue
        if not stripped or stripped.startswith(("|", "<", "![", "---")):
            flush()
            continue
        if _HEADING.match(line):
            flush()
            units.append((_HEADING.sub("", line), True))
            continue
        if _LIST_ITEM.match(line):
            flush()
            current.append(_LIST_ITEM.sub("", line))
            continue
        current.append(stripped.lstrip("> "))
    flush()
    return units


def _words(text: str) -> int:
    return len(_WORD.findall(text))


def _markdown(path: Path) -> list[str]:
    """A notebook's markdown cells, or a markdown file's whole text."""
    if path.suffix == ".md":
        return [path.read_text(encoding="utf-8")]
    nb = json.loads(path.read_text(encoding="utf-8"))
    return ["".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "markdown"]


def measure(path: Path) -> Prose:
    prose = Prose(path.name)
    for source in _markdown(path):
        for text, heading in _blocks(source):
            text = _LINK.sub(r"\1", text)
            text = _CODE_SPAN.sub("CODE", text)
            text = text.replace("**", "").replace("__", "")
            if heading:
                prose.words += _words(text)
                continue
            for sentence in _END.split(text):
                n = _words(sentence)
                if not n:
                    continue
                prose.words += n
                prose.sentences.append(n)
                if n > MAX_SENTENCE:
                    prose.long.append(sentence.strip())
    return prose


def docs(root: Path) -> list[Path]:
    """What a reader of the project reads beside the notebooks, held to the same sentences."""
    return [*sorted((root / "docs" / "guide").glob("*.md")), root / "docs" / "cheatsheet.md",
            root / "README.md"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("notebooks", nargs="*", type=Path)
    parser.add_argument("--docs", action="store_true",
                        help="the guide's pages, the cheat sheet and the README instead")
    parser.add_argument("--long", action="store_true", help="list sentences over 35 words")
    parser.add_argument("--limits", action="store_true", help="exit 1 when a goal is missed")
    args = parser.parse_args(argv)
    root = Path(__file__).resolve().parent.parent
    paths = args.notebooks or (docs(root) if args.docs
                               else sorted((root / "notebooks").glob("*.ipynb")))
    results = [measure(p) for p in paths]
    print(f"{'notebook':40} {'words':>6} {'sent.':>6} {'mean':>5} {'max':>4} {'>35':>4}")
    for r in results:
        top = max(r.sentences, default=0)
        print(f"{r.name:40} {r.words:6} {len(r.sentences):6} {r.mean:5.1f} {top:4} {len(r.long):4}")
    words = sum(r.words for r in results)
    count = sum(len(r.sentences) for r in results)
    over = sum(len(r.long) for r in results)
    mean = sum(sum(r.sentences) for r in results) / count if count else 0.0
    print(f"{'suite':40} {words:6} {count:6} {mean:5.1f} {'':4} {over:4}")
    if args.long:
        for r in results:
            for sentence in r.long:
                print(f"\n[{r.name}] ({_words(sentence)} words) {sentence}")
    if not args.limits:
        return 0
    missed = []
    if words > MAX_WORDS and not args.docs:  # (a cap for the notebooks only)
        missed.append(f"the suite has {words} words (at most {MAX_WORDS})")
    missed += [
        f"{r.name}: mean sentence {r.mean:.1f} words (at most {MAX_MEAN:g})"
        for r in results
        if r.mean > MAX_MEAN
    ]
    if over:
        missed.append(f"{over} sentences over {MAX_SENTENCE} words")
    for line in missed:
        print("missed:", line, file=sys.stderr)
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())

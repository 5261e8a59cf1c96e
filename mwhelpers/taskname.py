"""A task's name (``worker:1``): a module that imports nothing, for every other to use."""

from __future__ import annotations


class Task(tuple[str, int]):
    """A task name: ``Task("worker", 1)`` prints as ``worker:1``."""

    def __new__(cls, type_: str, index: int) -> Task:
        return super().__new__(cls, (type_, index))

    @property
    def type(self) -> str:
        return self[0]

    @property
    def index(self) -> int:  # type: ignore[override]  # the task's index, not tuple.index
        return self[1]

    def __str__(self) -> str:
        return f"{self[0]}:{self[1]}"

    def __repr__(self) -> str:
        return f"Task({self[0]!r}, {self[1]})"

    @property
    def slug(self) -> str:
        """File-name friendly form: ``worker-1``."""
        return f"{self[0]}-{self[1]}"

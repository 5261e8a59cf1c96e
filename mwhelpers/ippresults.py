"""ipyparallel's results behind one small typed seam: a cell run on several engines.

``%%px`` and :meth:`mwhelpers.interactive.Interactive.run` read what each engine did with a cell
(done or not, its error, its output so far, its value) and follow its output as it comes.
ipyparallel gives that through an ``AsyncResult`` whose per-engine futures are private
(``_children``) and whose output lives in each future's ``output.metadata``.  This module is
the only one that touches them; the rest of the package sees an :class:`Execution` and its
:class:`EngineCell` objects, in the order of the engines the cell was sent to.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

# What ipyparallel gathers of one engine's output (stdout, stderr, outputs, execute_result).
Metadata = Mapping[str, Any]
MessageCallback = Callable[[dict[str, Any]], None]


class EngineCell:
    """One engine's part of a cell: ipyparallel's future for it."""

    def __init__(self, future: Any) -> None:
        self._future = future

    def done(self) -> bool:
        return bool(self._future.done())

    def error(self) -> BaseException | None:
        """The error the engine raised (ipyparallel gives it as the result), or the request's
        own failure (an engine that died); None while running or when it succeeded."""
        if not self.done():
            return None
        try:
            result = self._future.result()
        except Exception as e:
            return e
        return result if isinstance(result, BaseException) else None

    @property
    def output(self) -> Metadata:
        """What the engine printed and displayed so far (ipyparallel adds each message here
        before it calls the callbacks)."""
        return self._future.output.metadata  # type: ignore[no-any-return]

    def value(self) -> object:
        """The ``execute_result`` of the cell's last expression, or None."""
        return self.output.get("execute_result")

    def follow(self, on_message: MessageCallback) -> Callable[[], None]:
        """Have ``on_message(msg)`` called for each output message from now on; returns the
        function that stops it."""
        callbacks: list[MessageCallback] = self._future.iopub_callbacks
        callbacks.append(on_message)

        def stop() -> None:
            if on_message in callbacks:
                callbacks.remove(on_message)
        return stop


class Execution:
    """A cell sent to several engines at once (ipyparallel's ``AsyncResult``)."""

    def __init__(self, async_result: Any) -> None:
        self._result = async_result
        # (the one read of ipyparallel's private per-engine futures)
        self.engines = [EngineCell(f) for f in async_result._children]

    def ready(self) -> bool:
        return bool(self._result.ready())

    def wait(self, timeout: float) -> None:
        self._result.wait(timeout)

    def wait_for_output(self, timeout: float) -> None:
        self._result.wait_for_output(timeout)

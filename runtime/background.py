"""One checkpoint write running in its own thread while the worker trains on (background checkpoints).

The worker (runtime/session_runner.py) starts at most one at a time and settles it (``wait()``) before the next
checkpoint, the export, "close", or a "commit checkpoint" for it; a failure is kept and raised by ``wait()`` in the
worker's main thread, never lost.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from prefect_gliner2.runtime.protocol import CheckpointResult

__all__ = ["BackgroundWrite"]


class BackgroundWrite:
    """One checkpoint write running in its own thread; `wait()` returns its index hash or raises its error."""

    def __init__(self, info: CheckpointResult, write: Callable[[], str]) -> None:
        self.info = info
        self.uri = info.uri
        self.error: BaseException | None = None
        self._digest: str | None = None
        self._write = write
        self._thread = threading.Thread(target=self._run, name="checkpoint-writer", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self._digest = self._write()
        except BaseException as exc:  # noqa: BLE001 - raised by wait(), in the worker's main thread
            self.error = exc
        finally:
            del self._write  # the snapshot it holds is freed as soon as the write ends

    def done(self) -> bool:
        return not self._thread.is_alive()

    def wait(self) -> str:
        self._thread.join()
        if self.error is not None:
            raise self.error
        assert self._digest is not None
        return self._digest

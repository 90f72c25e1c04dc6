"""A Prefect flow whose call starts the spare session worker before Prefect creates the flow run.

    @spare_first_flow(name="gliner2-train", persist_result=False)
    def train_flow(...): ...

Calling a flow (``Flow.__call__``) serializes its parameters (Prefect's encoder imports FastAPI on first use: about
0.3 s of CPU), creates the flow run through the API and sets it Running before the flow's function runs. A spare
worker (``runtime.spare``) started as the call begins imports torch and gliner2 meanwhile, on another core, instead
of after it: the worker is what a run's first batch waits for. The flow's function starts a spare too
(``spare_worker()``, which starts none while one is waiting), for runs that Prefect starts without a call (a
deployment's worker, ``prefect flow-run retry``) and for ``with_options`` copies (plain ``Flow`` objects). A spare
that no run adopted is discarded when the call returns; a spare that cannot start (e.g. a bad
``$PREFECT_GLINER2_SPARE_WORKER``) is left to the flow's function, which raises the error inside the flow run as
before.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Generic, TypeVar

from prefect import Flow
from typing_extensions import ParamSpec

from prefect_gliner2.runtime.spare import discard_spare, prestart_worker

__all__ = ["SpareFirstFlow", "spare_first_flow"]

P = ParamSpec("P")
R = TypeVar("R")


class SpareFirstFlow(Flow[P, R], Generic[P, R]):
    """A ``Flow`` whose call starts a spare session worker first (see the module docstring)."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        try:
            prestart_worker()
        except Exception:  # noqa: BLE001, S110 - the flow's own spare_worker() raises it inside the flow run
            pass
        try:
            return super().__call__(*args, **kwargs)
        finally:
            discard_spare()  # adopted by the run's worker by now, unless none started


def spare_first_flow(**options: Any) -> Callable[[Callable[P, R]], SpareFirstFlow[P, R]]:
    """``@flow(**options)``, the flow a ``SpareFirstFlow``."""

    def decorate(fn: Callable[P, R]) -> SpareFirstFlow[P, R]:
        return SpareFirstFlow(fn, **options)

    return decorate

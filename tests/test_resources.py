"""Resource bounds: the default CPU thread budget of a worker slot (never all CPUs for each of several runs)."""

from __future__ import annotations

import pytest

from prefect_gliner2.runtime import resources
from prefect_gliner2.session_core.errors import ConfigError


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in (resources.ENV_CPU_THREADS, resources.ENV_WORKER_SLOTS, "OMP_NUM_THREADS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(resources, "usable_cpus", lambda: 8)
    return monkeypatch


def test_a_slot_gets_its_share_of_the_usable_cpus(clean_env: pytest.MonkeyPatch) -> None:
    assert resources.default_cpu_threads() == 8  # one slot on this host: all usable CPUs
    clean_env.setenv(resources.ENV_WORKER_SLOTS, "4")
    assert resources.default_cpu_threads() == 2  # four runs at once: 4 x 2 threads on 8 CPUs, no oversubscription
    clean_env.setenv(resources.ENV_WORKER_SLOTS, "16")
    assert resources.default_cpu_threads() == 1  # never below one thread


def test_explicit_budgets_come_first(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv(resources.ENV_WORKER_SLOTS, "4")
    clean_env.setenv("OMP_NUM_THREADS", "3")
    assert resources.default_cpu_threads() == 3
    clean_env.setenv(resources.ENV_CPU_THREADS, "5")
    assert resources.default_cpu_threads() == 5


@pytest.mark.parametrize("raw", ["0", "-2", "two"])
def test_a_bad_budget_is_named(clean_env: pytest.MonkeyPatch, raw: str) -> None:
    clean_env.setenv(resources.ENV_WORKER_SLOTS, raw)
    with pytest.raises(ConfigError, match=f"PREFECT_GLINER2_WORKER_SLOTS={raw!r} is not a positive integer"):
        resources.default_cpu_threads()


def test_usable_cpus_respects_the_affinity_mask() -> None:
    import os

    assert 1 <= resources.usable_cpus() <= len(os.sched_getaffinity(0))

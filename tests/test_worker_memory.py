"""Worker children keep the memory they free (glibc's malloc thresholds raised), unless the user says otherwise."""

from __future__ import annotations

import os

import pytest

from prefect_gliner2.runtime.spawn import (
    CONTEXT,
    ENV_WORKER_MEMORY,
    RETAIN_TUNABLES,
    reap,
    start_child,
    worker_environment,
)
from prefect_gliner2.session_core.errors import ConfigError

from support.memory_child import BLOCK, fault_probe

PAGES = BLOCK // os.sysconf("SC_PAGE_SIZE")
RETAINED = ":".join(f"{name}={value}" for name, value in RETAIN_TUNABLES.items())


def _probe() -> tuple[int, int, str | None]:
    parent_conn, child_conn = CONTEXT.Pipe(duplex=False)
    process = CONTEXT.Process(target=fault_probe, args=(child_conn,), daemon=True)
    start_child(process)
    child_conn.close()
    try:
        assert parent_conn.poll(60), "the probe child did not answer"
        first, second, tunables = parent_conn.recv()
    finally:
        reap(process, 30)
    assert process.exitcode == 0
    assert first >= 16, f"the first fill of {PAGES} fresh pages took only {first} page faults"
    return first, second, tunables


def test_the_environment_adds_the_thresholds_and_keeps_what_the_user_set() -> None:
    assert worker_environment({}) == {"GLIBC_TUNABLES": RETAINED}
    assert worker_environment({ENV_WORKER_MEMORY: " retain "}) == {"GLIBC_TUNABLES": RETAINED}
    mine = "glibc.malloc.trim_threshold=1048576:glibc.malloc.arena_max=2"
    assert worker_environment({"GLIBC_TUNABLES": mine}) == {
        "GLIBC_TUNABLES": f"{mine}:glibc.malloc.mmap_threshold={RETAIN_TUNABLES['glibc.malloc.mmap_threshold']}"
    }
    assert worker_environment({ENV_WORKER_MEMORY: "release", "GLIBC_TUNABLES": mine}) == {}


def test_a_bad_setting_is_refused_before_any_child_starts(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigError, match=r"PREFECT_GLINER2_WORKER_MEMORY='keep' is not one of retain, release"):
        worker_environment({ENV_WORKER_MEMORY: "keep"})
    monkeypatch.setenv(ENV_WORKER_MEMORY, "keep")
    process = CONTEXT.Process(target=fault_probe, args=(None,), daemon=True)
    with pytest.raises(ConfigError, match="'release' keeps glibc's defaults"):
        start_child(process)
    assert process.pid is None


def test_a_child_reuses_a_freed_block_without_faulting_it_in_again(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GLIBC_TUNABLES", raising=False)
    monkeypatch.delenv(ENV_WORKER_MEMORY, raising=False)
    first, second, tunables = _probe()
    assert tunables == RETAINED
    assert second <= first // 16, f"{second} page faults for a block freed just before (the first fill: {first})"
    assert "GLIBC_TUNABLES" not in os.environ  # only the child got it


def test_release_keeps_glibcs_defaults_and_every_page_faults_again(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GLIBC_TUNABLES", raising=False)
    monkeypatch.setenv(ENV_WORKER_MEMORY, "release")
    first, second, tunables = _probe()
    assert tunables is None
    assert second >= first * 0.9, f"only {second} page faults refilling the block (the first fill: {first})"

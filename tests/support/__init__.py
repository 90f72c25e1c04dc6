"""Shared test support: tiny configs and inputs, reference runs, bitwise comparisons, children, the chaos engine.

Importable as ``support`` from the tests (pytest puts ``tests/`` on ``sys.path``) and from ``bench/`` scripts (which
put ``tests/`` on ``sys.path`` themselves). Test support never imports from ``bench/``.

    config.py           the one training-config factory (``training_config``)
    session.py          session tests: tiny models, plans, direct loops, snapshots, fresh-process children
    flow.py             worker/flow/CLI tests: tiny inputs, reference exports, bitwise export comparison, flow children
    processes.py        SIGKILL a child and wait until a pid is gone
    prefect_harness.py  a local Prefect test server (the ``prefect_server`` fixture in conftest.py, the chaos CLI)
    chaos.py            the chaos engine: SIGKILLs at seeded moments, resume, bit-for-bit comparison, storage faults
    session_child.py    run as ``python -m support.session_child``: a fresh-process session continuation
    flow_child.py       run as ``python -m support.flow_child``: train_flow in a fresh interpreter
"""

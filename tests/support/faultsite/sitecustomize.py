"""Test-only start-up hook for processes a test cannot call into (flow runs a Prefect worker starts).

With this folder on PYTHONPATH and ``SUPPORT_FAULT_PLAN`` holding a FaultPlan's JSON, each new interpreter installs
that plan explicitly (``faults.install``), exactly as an in-process test would; the flow passes it to its session
worker. The product itself never reads the environment for faults: without this test folder nothing happens.
"""

import os

if os.environ.get("SUPPORT_FAULT_PLAN"):
    from prefect_gliner2.runtime import faults

    faults.install(faults.FaultPlan.from_json(os.environ["SUPPORT_FAULT_PLAN"]))

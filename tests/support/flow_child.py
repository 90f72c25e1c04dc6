"""Run train_flow in this fresh interpreter (crash tests, the chaos engine): argv[1] is the JSON of the flow's
parameters, argv[2] (optional, may be empty) the JSON of a FaultPlan to install first.

Run as ``python -m support.flow_child`` with tests/ on PYTHONPATH. Uses PREFECT_API_URL from the environment (the
test server) with flow-run heartbeats off; prints the summary JSON.
"""

from __future__ import annotations

import json
import sys

if __name__ == "__main__":
    import prefect.settings as settings
    from prefect.settings import temporary_settings

    from prefect_gliner2.flows.train import train_flow
    from prefect_gliner2.runtime import faults

    if len(sys.argv) > 2 and sys.argv[2]:
        faults.install(faults.FaultPlan.from_json(sys.argv[2]))
    with temporary_settings(updates={settings.PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None}):
        summary = train_flow(**json.loads(sys.argv[1]))
    print(json.dumps(summary))

"""What a managed checkpoint recorded, read straight from its files (a test's independent view)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from prefect_gliner2.session_core.layout import MANAGED_STATE_FILE


def recorded_history(checkpoint: str | Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The training and validation histories a managed checkpoint recorded (its managed.json)."""
    state = json.loads((Path(checkpoint) / MANAGED_STATE_FILE).read_text())
    return list(state["train_metrics_history"]), list(state["eval_metrics_history"])

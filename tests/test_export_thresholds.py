"""The export names the step its weights come from and carries thresholds fitted for those weights, which gliner2
then really extracts with."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import torch

from prefect_gliner2.session_core.evaluation import score_extraction
from prefect_gliner2.session_core.pairs import to_pairs
from prefect_gliner2.session_core.thresholds import describe, fixed, read_thresholds
from prefect_gliner2.training import ManagedTraining, TrainingSession
from prefect_gliner2.training.inference import model_extractor
from prefect_gliner2.training.weights import load_exported_model

from support.session import eval_records, make_config, make_model, make_plan, snapshot


def _run(**overrides):
    config = make_config("span", False, eval_strategy="epoch", num_epochs=3, **overrides)
    plan = make_plan("span", config)
    session = TrainingSession(make_model("span"), config, max_steps=plan.max_steps)
    return ManagedTraining(session, plan, eval_examples=eval_records(8))


def test_best_export_names_its_own_step_and_carries_thresholds_fitted_for_it(tmp_path):
    # "best" = the highest eval_loss: the first validation, so the best weights are not the final ones
    run = _run(metric_for_best="eval_loss", greater_is_better=True)
    run.run()
    first = run.eval_metrics_history[0]["step"]
    assert run.best_step == first < run.session.step
    before = snapshot(run.session)
    info = run.export_weights(str(tmp_path / "best"), which="best")
    assert all(torch.equal(before[k], v) for k, v in snapshot(run.session).items())  # fitting swapped weights back
    recorded = json.loads((tmp_path / "best" / "export.json").read_text())
    assert recorded["step"] == info["step"] == first  # today's bug recorded the final step here
    # what the model was trained to extract travels with it (extract's default labels), in the data's own order
    trained = [label for _, output in to_pairs(run.plan.records.examples()) for label in output.get("entities", {})]
    assert recorded["schema"] == {"entities": list(dict.fromkeys(trained))} and len(recorded["schema"]["entities"]) > 1
    fitted = read_thresholds(str(tmp_path / "best"))
    assert fitted is not None and fitted.fitted and fitted.details["step"] == first
    assert fitted.details["records"] == 8 and fitted.details["f1"] >= fitted.details["f1_default"]

    # the fitted F1 is what gliner2 really scores with the exported model at those thresholds (same shuffled order)
    model = load_exported_model(str(tmp_path / "best"))
    pairs = to_pairs(eval_records(8))
    seed = int(run.config.seed)
    at_fitted = score_extraction(pairs, model_extractor(model, threshold=fitted), seed=seed).metrics()["eval_f1"]
    at_default = score_extraction(pairs, model_extractor(model, threshold=fixed(0.5)), seed=seed).metrics()
    assert at_fitted == fitted.details["f1"] > 0.0  # the early tiny model finds nothing at 0.5, some below it
    assert fitted.entities  # labels with >= 10 gold mentions got values of their own, applied per label
    assert at_default["eval_f1"] == fitted.details["f1_default"]

    final = run.export_weights(str(tmp_path / "final"), which="final")
    assert json.loads((tmp_path / "final" / "export.json").read_text())["step"] == final["step"] == run.session.step
    assert read_thresholds(str(tmp_path / "final")).details["step"] == run.session.step


def test_no_validation_extraction_records_no_thresholds(tmp_path):
    run = _run(eval_extraction=False, metric_for_best="eval_loss")
    run.run()
    run.export_weights(str(tmp_path / "best"))
    assert read_thresholds(str(tmp_path / "best")) is None


def test_evaluate_uses_the_recorded_thresholds_unless_one_is_passed(tmp_path, capsys):
    from prefect_gliner2.flows.cli import main
    from prefect_gliner2.session_core.thresholds import Thresholds
    from prefect_gliner2.training.tiny import save_tiny_model, tiny_records

    model = save_tiny_model(tmp_path / "model", "span", seed=0)
    recorded = Thresholds(threshold=0.0, entities={"city": 1.0}, fitted=True, details={"records": 6, "f1": 0.5})
    (model / "export.json").write_text(json.dumps({"label": "best", "step": 3, "thresholds": recorded.to_dict()}))
    data = tmp_path / "gold.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in tiny_records(6, seed=3)))

    def evaluate(*extra: str) -> tuple[dict, str]:
        out = tmp_path / "report.json"
        assert (
            main(["evaluate", "--model", str(model), "--data", str(data), "--orders", "1", "--json", str(out), *extra])
            == 0
        )
        return json.loads(out.read_text()), capsys.readouterr().out

    def predicted(report: dict, label: str) -> int:
        return next(row["tp"] + row["fp"] for row in report["per_label"] if row["label"] == label)

    own, printed = evaluate()
    assert own["thresholds"] == {"source": "fitted", **recorded.to_dict()} and own["threshold"] == 0.0
    assert predicted(own, "city") == 0 and predicted(own, "person") > 0  # city's own 1.0 silences it, only it
    assert (
        "thresholds 0 (entities city 1), fitted on 6 validation records" in printed and "(the model's own)" in printed
    )
    explicit, printed = evaluate("--threshold", "0.0")
    assert explicit["thresholds"]["source"] == "explicit" and explicit["thresholds"]["entities"] == {}
    assert predicted(explicit, "city") > 0 and predicted(explicit, "person") == predicted(own, "person")
    assert "thresholds 0 (--threshold)" in printed


@pytest.mark.usefixtures("prefect_server")
def test_a_training_run_exports_the_selected_step_with_fitted_thresholds(tmp_path):
    from prefect_gliner2.flows.cli.progress import describe as progress_text
    from prefect_gliner2.runtime.compare import score_exports_here

    from support.config import training_config
    from support.flow import make_space, run_flow

    space = make_space(tmp_path)
    # selected by eval_f1 (the default) at 0.5: the tiny model finds nothing at 0.5 at either validation, so the
    # first (step 3 of 6) stays best (a later one must be strictly better): best != final
    config = training_config()
    summary = run_flow(
        model=space["span"],
        train_data=space["inputs"]["train"],
        valid_data=space["inputs"]["valid"],
        config=config,
        run_key="thresholds",
        storage=str(tmp_path / "runs"),
    )
    assert (summary["label"], summary["best_step"], summary["export_step"], summary["total_steps"]) == ("best", 3, 3, 6)
    recorded = json.loads((Path(summary["export"]) / "export.json").read_text())
    assert recorded["step"] == 3 and recorded["thresholds"] == summary["thresholds"]
    fitted = read_thresholds(summary["export"])
    assert fitted.fitted and fitted.details["step"] == 3 and fitted.details["records"] == 4
    line = f"exported the best model (weights of step 3) to {summary['export']}; {describe(fitted)}"
    assert line in _run_logs(summary["flow_run_id"], "exported the")  # the export task's line, as the UI shows it
    assert "validation records: micro F1" in describe(fitted)
    assert f"{describe(fitted)}" in progress_text(summary)  # what `prefect-gliner2 train` prints at the end

    # retraining's comparison (runtime/compare.py, also `prefect-gliner2 compare`) scores the export at them
    scored = score_exports_here({"m": summary["export"]}, {"valid": space["inputs"]["valid"]}, seed=config["seed"])
    assert scored["valid"]["m"]["thresholds_from"] == "recorded"
    assert scored["valid"]["m"]["thresholds"] == fitted.to_dict()
    assert scored["valid"]["m"]["eval_f1"] == fitted.details["f1"] > 0.0


def _run_logs(flow_run_id: str, containing: str, timeout: float = 30.0) -> list[str]:
    """The flow run's log messages in the Prefect API (sent in batches: poll until one contains `containing`)."""
    from uuid import UUID

    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId

    query = LogFilter(flow_run_id=LogFilterFlowRunId(any_=[UUID(flow_run_id)]))
    deadline = time.monotonic() + timeout
    with get_client(sync_client=True) as client:
        while True:
            messages = [log.message for log in client.read_logs(log_filter=query)]
            if any(containing in m for m in messages) or time.monotonic() > deadline:
                return messages
            time.sleep(0.5)

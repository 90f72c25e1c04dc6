"""The export names the step its weights come from and carries thresholds fitted for those weights, which gliner2
then really extracts with."""

from __future__ import annotations

import json

import torch

from prefect_gliner2.session_core import ManagedTraining, TrainingSession
from prefect_gliner2.session_core.evaluation import model_extractor, score_extraction
from prefect_gliner2.session_core.pairs import to_pairs
from prefect_gliner2.session_core.thresholds import fixed, read_thresholds
from prefect_gliner2.session_core.weights import load_exported_model

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

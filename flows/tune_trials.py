"""A study's trials as training runs: ask Optuna for parameters, train each trial's run segment by segment, report
its validations, let the pruner pause it, and tell Optuna how it ended; adopt the trials a killed study left running.

    StudyRunner(study, space, base, "ner-lr", seed=0, launcher=InProcess(), trials=12).run(continue_trials=[3])

A trial's run key is the sweep's for the same parameters (``sweep_points``: the study key and a digest of the base
parameters and the trial's config), recorded in its ``run_key`` attribute. A segment trains the run to the trial's
next pause point; at the pause the pruner decides: pruned, the trial ends PRUNED and its run stays paused at that
checkpoint (attributes ``cursor``, ``checkpoint``, ``steps``); kept, the next segment continues the same run key.
Trials count toward ``trials`` unless they continue another (``continues``) or were abandoned before training
(a kill between Optuna's creation of a trial and the recording of its parameters).

Killed at any moment and started again, the study adopts its RUNNING trials: each continues its run key from the
run's checkpoint, from the pause point after the last validation it reported (a segment already done is found done:
its flow run on the fleet, the run's pause or finish record in process). No run trains anything twice but what it
trained after its last checkpoint. One slot: the same trials in the same order; see ``flows.tune``.
"""

from __future__ import annotations

import math
from typing import Any

from prefect_gliner2.flows.prefect_ui import run_logger
from prefect_gliner2.flows.sweep import sweep_points
from prefect_gliner2.flows.tune_segments import Segment
from prefect_gliner2.flows.tune_study import (
    ask,
    next_budget,
    optuna_module,
    reached_budget,
    report,
    study_resources,
    trial_handle,
)
from prefect_gliner2.runtime.pause import run_outcome
from prefect_gliner2.runtime.prepare import default_storage
from prefect_gliner2.runtime.rundir import RunDirectory
from prefect_gliner2.session_core.errors import ConfigError
from prefect_gliner2.session_core.search_space import SearchSpace

__all__ = ["StudyRunner", "counted"]


def counted(frozen: Any) -> bool:
    """Whether a trial counts toward the study's number of trials (sampled, not abandoned, not waiting)."""
    attrs = frozen.user_attrs
    return "continues" not in attrs and not attrs.get("abandoned") and frozen.state.name != "WAITING"


class StudyRunner:
    """Runs a study's trials to `trials` counted ones, `launcher.slots` at a time (see the module docstring)."""

    def __init__(
        self,
        study: Any,
        space: SearchSpace,
        base: dict[str, Any],
        study_key: str,
        *,
        seed: int,
        launcher: Any,
        trials: int,
        greater: bool,
    ) -> None:
        self.study, self.space, self.base, self.study_key = study, space, base, study_key
        self.seed, self.launcher, self.trials, self.greater = seed, launcher, trials, greater
        self.resources = study_resources(study)
        self.storage = str(base.get("storage") or default_storage())
        self.names = {param.name for param in space.params}
        self.handles: dict[int, Any] = {}
        self.deferred: list[Segment] = []  # segments whose run key another active trial is training
        self.optuna = optuna_module()

    def run(self, continue_trials: list[int], continue_best: int = 0) -> None:
        """Continue the trials asked for, adopt running ones, run trials to the count, then continue the
        `continue_best` most promising pruned trials (``_promote``)."""
        for number in continue_trials:
            self._enqueue_continuation(number)
        active: list[Segment] = []
        for frozen in self.study.get_trials(deepcopy=False, states=(self.optuna.trial.TrialState.RUNNING,)):
            self._start(self._adopt(frozen), active)
        self._loop(active)
        if continue_best and self._promote(continue_best):
            self._loop([])

    def _loop(self, active: list[Segment]) -> None:
        while True:
            while len(active) < self.launcher.slots and self._more():
                self._start(self._new_trial(), active)
            if not active:
                return
            for segment in self.launcher.wait(active):
                active.remove(segment)
                self._start(self._after(segment), active)
                for waiting in [s for s in self.deferred if s.run_key not in {a.run_key for a in active}]:
                    self.deferred.remove(waiting)
                    self._start(waiting, active)

    # ---- trials -------------------------------------------------------------------------------------------

    def _more(self) -> bool:
        trials = self.study.get_trials(deepcopy=False)
        waiting = any(t.state.name == "WAITING" for t in trials)
        return waiting or sum(counted(t) for t in trials) < self.trials

    def _new_trial(self) -> Segment | None:
        trial = ask(self.study, self.space, self.seed)
        self.handles[trial.number] = trial
        return self._first_segment(trial.number, trial.params, trial.user_attrs)

    def _adopt(self, frozen: Any) -> Segment | None:
        """A trial a killed study left running: it continues from the pause point after its last report."""
        handle = self.handles[frozen.number] = trial_handle(self.study, frozen)
        if set(frozen.params) != self.names:
            handle.set_user_attr("abandoned", True)
            self.study.tell(frozen.number, state=self.optuna.trial.TrialState.FAIL)
            run_logger().info("trial %d was abandoned before its parameters were recorded", frozen.number)
            return None
        reported = max(frozen.intermediate_values, default=None)
        run_logger().info("trial %d was running: it continues from its run's checkpoint", frozen.number)
        return self._first_segment(frozen.number, frozen.params, frozen.user_attrs, reported)

    def _first_segment(
        self, number: int, params: dict[str, Any], attrs: dict[str, Any], reported: int | None = None
    ) -> Segment | None:
        """The trial's first segment in this study process: to its first pause point; for a trial adopted after
        a report at step S, to the pause point that reported it (the run is found paused there at once, and the
        pruner decides as it would have)."""
        try:
            [point] = sweep_points(self.base, None, [params], self.study_key)
        except ConfigError as exc:
            self._fail(number, f"its parameters make no valid run: {exc}")
            return None
        self.handles[number].set_user_attr("run_key", point["run_key"])
        budget = None
        if _prunes(attrs):
            pruner, resources = self.space.pruner, self.resources
            budget = (
                next_budget(pruner, resources, 0) if reported is None else reached_budget(pruner, resources, reported)
            )
        run_params = {**self.base, "config": point["form"], "run_key": point["run_key"]}
        return Segment(number, point["run_key"], run_params, budget)

    def _promote(self, count: int) -> bool:
        """Continue the `count` most promising pruned trials to their end (the furthest trained first, then the
        best at its pause point), as pruned trials paused at a checkpoint allow: what they trained is kept. Trials
        this study promoted before (an earlier run of it) count. True when one was enqueued."""
        trials = self.study.get_trials(deepcopy=False)
        done = sum(1 for t in trials if t.user_attrs.get("promoted"))
        continued = {t.user_attrs.get("continues") for t in trials}
        candidates = [t for t in trials if t.state.name == "PRUNED" and t.number not in continued]
        candidates.sort(key=lambda t: (-max(t.intermediate_values, default=0), self._badness(t), t.number))
        for trial in candidates[: max(count - done, 0)]:
            attrs = {"continues": trial.number, "prune": False, "promoted": True}
            self.study.enqueue_trial(trial.params, user_attrs=attrs)
            run_logger().info("promoting pruned trial %d: it continues from its checkpoint", trial.number)
        return count > done and bool(candidates)

    def _badness(self, frozen: Any) -> float:
        """A pruned trial's value at its pause point, as a sort key (lower is more promising; NaN last)."""
        values = frozen.intermediate_values
        value = values[max(values)] if values else math.nan
        if math.isnan(value):
            return math.inf
        return -value if self.greater else value

    def _enqueue_continuation(self, number: int) -> None:
        trials = self.study.get_trials(deepcopy=False)
        if not 0 <= number < len(trials):
            raise ConfigError(f"study {self.study_key!r} has no trial {number} (it has {len(trials)})")
        if trials[number].state.name != "PRUNED":
            raise ConfigError(
                f"trial {number} of study {self.study_key!r} is {trials[number].state.name}; only a pruned trial "
                "is continued (from its pause point, to the end)"
            )
        taken = [t.number for t in trials if t.user_attrs.get("continues") == number]
        if taken:
            run_logger().info("trial %d is continued by trial %d already", number, taken[0])
            return
        self.study.enqueue_trial(trials[number].params, user_attrs={"continues": number, "prune": False})
        run_logger().info("trial %d will be continued to its end from its checkpoint", number)

    # ---- segments -----------------------------------------------------------------------------------------

    def _start(self, segment: Segment | None, active: list[Segment]) -> None:
        if segment is None:
            return
        if segment.run_key in {a.run_key for a in active}:
            self.deferred.append(segment)  # the same parameters as an active trial: after it, on its checkpoint
            return
        run_logger().info(
            "trial %d (run %s): training to %s",
            segment.number,
            segment.run_key,
            f"its first validation at or after step {segment.budget}" if segment.budget else "its end",
        )
        self.launcher.start(segment)
        active.append(segment)

    def _after(self, segment: Segment) -> Segment | None:
        """Report what the ended segment trained; prune, finish, or return the trial's next segment."""
        trial = self.handles[segment.number]
        self._note_flow_run(trial, segment)
        if segment.state != "COMPLETED":
            self._fail(segment.number, segment.error or f"its flow run ended {segment.state}")
            return None
        outcome = run_outcome(RunDirectory(self.storage, segment.run_key))
        if outcome is None:
            self._fail(segment.number, f"run {segment.run_key} recorded neither a pause nor its end")
            return None
        kind, record = outcome
        report(trial, record.get("validations") or (), self.greater)
        trial.set_user_attr("steps", record["total_steps"])
        if kind == "finished":
            self._complete(segment, record)
            return None
        trial.set_user_attr("checkpoint", record["checkpoint"])
        trial.set_user_attr("cursor", record["cursor"])
        if _prunes(trial.user_attrs) and trial.should_prune():
            self.study.tell(segment.number, state=self.optuna.trial.TrialState.PRUNED)
            run_logger().info(
                "trial %d pruned at step %d: its run %s is paused at checkpoint %s (continue it by its number)",
                segment.number,
                record["total_steps"],
                segment.run_key,
                record["checkpoint"],
            )
            return None
        budget = next_budget(self.space.pruner, self.resources, record["total_steps"])
        return Segment(segment.number, segment.run_key, segment.params, budget)

    def _complete(self, segment: Segment, record: dict[str, Any]) -> None:
        trial = self.handles[segment.number]
        trial.set_user_attr("export", record.get("export"))
        value = record.get("best_metric")
        if value is None:
            self._fail(segment.number, f"run {segment.run_key} selected no model (no finite validation metric)")
            return
        self.study.tell(segment.number, float(value))
        run_logger().info("trial %d complete: %s = %s", segment.number, record.get("metric_for_best"), value)

    def _fail(self, number: int, why: str) -> None:
        self.handles[number].set_user_attr("error", why[:2000])
        self.study.tell(number, state=self.optuna.trial.TrialState.FAIL)
        run_logger().warning("trial %d failed: %s", number, why)

    @staticmethod
    def _note_flow_run(trial: Any, segment: Segment) -> None:
        runs = list(trial.user_attrs.get("flow_runs") or [])
        if segment.flow_run_id and segment.flow_run_id not in runs:
            trial.set_user_attr("flow_runs", [*runs, segment.flow_run_id])


def _prunes(attrs: dict[str, Any]) -> bool:
    return bool(attrs.get("prune", True))

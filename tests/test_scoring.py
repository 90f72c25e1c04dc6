"""The torch-free extraction scorer on hand-made records: every task kind, the matching rules and the edge cases."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest

from prefect_gliner2.session_core.errors import RecordError
from prefect_gliner2.session_core.metrics import SCORE_KEYS
from prefect_gliner2.session_core.scoring import (
    Counts,
    DatasetSchema,
    data_order,
    inference_schema,
    normalize_text,
    score_records,
)

ENTITY_GOLD = {"entities": {"person": ["Alice Smith", "Bob"], "city": ["Paris"]}}


def test_counts_arithmetic_and_empty_counts_are_zero_not_nan():
    assert Counts.of(["a", "a", "b"], ["a", "c"]) == Counts(tp=1, fp=1, fn=2)
    empty = Counts()
    assert (empty.precision, empty.recall, empty.f1) == (0.0, 0.0, 0.0)
    only_gold = Counts(fn=3)
    assert (only_gold.precision, only_gold.recall, only_gold.f1, only_gold.support) == (0.0, 0.0, 0.0, 3)
    only_predicted = Counts(fp=2)
    assert (only_predicted.precision, only_predicted.recall, only_predicted.f1) == (0.0, 0.0, 0.0)
    c = Counts(tp=3, fp=1, fn=2)
    assert (c.precision, c.recall) == (0.75, 0.6)
    assert c.f1 == pytest.approx(2 * 0.75 * 0.6 / 1.35)
    assert Counts(1, 2, 3) + Counts(4, 5, 6) == Counts(5, 7, 9)


def test_normalization_trims_and_collapses_whitespace_but_keeps_case():
    assert normalize_text("  Alice \n  Smith ") == "Alice Smith"
    assert normalize_text({"text": " Bob ", "start": 3}) == "Bob"
    assert normalize_text("alice") != normalize_text("Alice")
    assert normalize_text(None) == ""


def test_entities_exact_text_per_label():
    predicted = {"entities": {"person": ["Alice Smith", "Bob"], "city": ["Paris"]}}
    report = score_records([ENTITY_GOLD], [predicted])
    assert report.labels == {("entities", "person"): Counts(2, 0, 0), ("entities", "city"): Counts(1, 0, 0)}
    assert report.metrics()["eval_f1"] == 1.0
    assert report.metrics()["eval_entity_f1"] == 1.0


def test_entity_case_overlap_wrong_label_and_whitespace():
    predicted = {
        "entities": {
            "person": ["alice smith", " Bob  "],  # case differs: no match; whitespace is normalized: match
            "city": ["Alice Smith", "Par"],  # right text under the wrong label; a partial span
        }
    }
    report = score_records([ENTITY_GOLD], [predicted])
    assert report.labels[("entities", "person")] == Counts(tp=1, fp=1, fn=1)
    assert report.labels[("entities", "city")] == Counts(tp=0, fp=2, fn=1)
    total = report.total()
    assert total == Counts(tp=1, fp=3, fn=2)
    assert report.metrics()["eval_precision"] == 0.25
    assert report.metrics()["eval_recall"] == pytest.approx(1 / 3)


def test_duplicates_count_as_a_multiset():
    gold = {"entities": {"day": ["Monday", "Monday"]}}
    assert score_records([gold], [{"entities": {"day": ["Monday"]}}]).labels[("entities", "day")] == Counts(1, 0, 1)
    twice = {"entities": {"day": ["Monday", "Monday", "Monday"]}}
    assert score_records([gold], [twice]).labels[("entities", "day")] == Counts(2, 1, 0)


def test_labels_are_the_data_sets_so_an_unlisted_label_is_a_false_positive():
    gold = [ENTITY_GOLD, {"entities": {"company": ["Acme"]}}]
    predicted = [{"entities": {"company": ["Acme"], "person": ["Alice Smith", "Bob"], "city": ["Paris"]}}, {}]
    report = score_records(gold, predicted)
    assert report.labels[("entities", "company")] == Counts(tp=0, fp=1, fn=1)
    assert report.labels[("entities", "person")] == Counts(tp=2, fp=0, fn=0)


def test_empty_gold_and_empty_predictions():
    empty_gold = {"entities": {"person": []}}
    none = score_records([empty_gold], [{"entities": {}}])
    assert none.labels == {("entities", "person"): Counts()}
    metrics = none.metrics()
    assert set(metrics) == set(SCORE_KEYS)
    assert all(value == 0.0 and not math.isnan(value) for value in metrics.values())
    spurious = score_records([empty_gold], [{"entities": {"person": ["Zoe"]}}])
    assert spurious.labels[("entities", "person")] == Counts(fp=1)
    missed = score_records([ENTITY_GOLD], [{}])
    assert missed.total() == Counts(fn=3) and missed.metrics()["eval_f1"] == 0.0
    nothing = score_records([], [])
    assert nothing.records == 0 and nothing.metrics()["eval_f1"] == 0.0 and nothing.rows() == []


def test_relations_head_tail_and_type():
    gold = {
        "relations": [
            {"works_for": {"head": "Alice", "tail": "Acme"}},
            {"works_for": {"head": "Bob", "tail": "Globex"}},
            {"lives_in": {"head": "Alice", "tail": "Paris"}},
        ]
    }
    predicted = {
        "relation_extraction": {
            "works_for": [("Alice", "Acme"), {"head": "Globex", "tail": "Bob"}],  # second one: reversed
            "lives_in": [{"head": {"text": "Alice"}, "tail": {"text": "Paris"}}],
        }
    }
    report = score_records([gold], [predicted])
    assert report.labels[("relations", "works_for")] == Counts(tp=1, fp=1, fn=1)
    assert report.labels[("relations", "lives_in")] == Counts(tp=1, fp=0, fn=0)
    assert report.metrics()["eval_relation_f1"] == pytest.approx(2 * 2 / (2 * 2 + 1 + 1))
    assert report.metrics()["eval_entity_f1"] == 0.0  # no entities anywhere: 0.0, not NaN


def test_classifications_single_and_multi_label():
    gold = {
        "classifications": [
            {"task": "sentiment", "labels": ["positive", "negative"], "true_label": ["positive"]},
            {"task": "topics", "labels": ["a", "b", "c"], "true_label": ["a", "b"], "multi_label": True},
        ]
    }
    right = {"sentiment": "positive", "topics": ["a", "b"]}
    assert score_records([gold], [right]).metrics()["eval_classification_f1"] == 1.0
    wrong = {"sentiment": {"label": "negative", "confidence": 0.9}, "topics": ["b", "c"]}
    report = score_records([gold], [wrong])
    assert report.labels[("classifications", "sentiment")] == Counts(tp=0, fp=1, fn=1)
    assert report.labels[("classifications", "topics")] == Counts(tp=1, fp=1, fn=1)
    missing = score_records([gold], [{}])
    assert missing.labels[("classifications", "sentiment")] == Counts(fn=1)


def test_structures_score_field_values_over_instances():
    gold = {
        "json_structures": [
            {"product": {"name": "Phone", "price": "$9", "colors": ["red", "blue"]}},
            {"product": {"name": "Laptop", "price": None, "tier": {"value": "pro", "choices": ["pro", "basic"]}}},
        ]
    }
    predicted = {
        "product": [
            {"name": "Laptop", "price": "$9", "colors": ["red"], "tier": "basic"},
            {"name": "Phone", "price": "$10", "colors": []},
        ]
    }
    report = score_records([gold], [predicted])
    assert report.labels[("structures", "product.name")] == Counts(tp=2)
    assert report.labels[("structures", "product.price")] == Counts(tp=1, fp=1)
    assert report.labels[("structures", "product.colors")] == Counts(tp=1, fn=1)
    assert report.labels[("structures", "product.tier")] == Counts(fp=1, fn=1)
    assert report.metrics()["eval_structure_f1"] == pytest.approx(2 * 4 / (2 * 4 + 2 + 2))


def test_micro_macro_per_kind_and_rows():
    gold = [
        {
            "entities": {"person": ["Ann"], "city": ["Rome", "Oslo"]},
            "relations": [{"visits": {"head": "Ann", "tail": "Rome"}}],
            "classifications": [{"task": "mood", "labels": ["up", "down"], "true_label": "up"}],
        }
    ]
    predicted = [
        {
            "entities": {"person": ["Ann"], "city": ["Rome"]},
            "relation_extraction": {"visits": []},
            "mood": "up",
        }
    ]
    report = score_records(gold, predicted)
    metrics = report.metrics()
    assert report.total() == Counts(tp=3, fp=0, fn=2)
    assert metrics["eval_precision"] == 1.0 and metrics["eval_recall"] == 0.6
    assert metrics["eval_f1"] == pytest.approx(0.75)
    assert metrics["eval_entity_f1"] == pytest.approx(2 * 2 / (2 * 2 + 1))
    assert metrics["eval_relation_f1"] == 0.0 and metrics["eval_classification_f1"] == 1.0
    per_label = {"person": 1.0, "city": 2 / 3, "visits": 0.0, "mood": 1.0}
    assert metrics["eval_macro_f1"] == pytest.approx(sum(per_label.values()) / 4)
    rows = report.rows()
    assert [(r["kind"], r["label"]) for r in rows] == [
        ("entities", "city"),
        ("entities", "person"),
        ("relations", "visits"),
        ("classifications", "mood"),
    ]
    assert rows[0] == {
        "kind": "entities",
        "label": "city",
        "precision": 1.0,
        "recall": 0.5,
        "f1": pytest.approx(2 / 3),
        "support": 2,
        "tp": 1,
        "fp": 0,
        "fn": 1,
        "confused": 0,
        "confused_with": {},
    }
    assert json.loads(json.dumps(report.to_dict()))["total"]["support"] == 5


def test_confusion_counts_the_false_positives_that_are_another_labels_gold():
    gold = [
        {"entities": {"person": ["Ann", "Bo"], "city": ["Rome", "Oslo"], "day": ["Monday"]}},
        {"entities": {"person": ["Cy"], "city": ["Ann"], "day": []}},
    ]
    predicted = [
        # person: Rome and Oslo are cities (2 confused), Zed is no one's; city: Ann is a person (1), Monday a day (1)
        {"entities": {"person": ["Ann", "Rome", "Oslo", "Zed"], "city": ["Rome", "Ann", "Monday"], "day": []}},
        # Ann is gold for city in this record, not for person: a confusion with city; Cy for person is right
        {"entities": {"person": ["Cy", "Ann"], "city": [], "day": ["Cy"]}},
    ]
    report = score_records(gold, predicted)
    rows = {row["label"]: row for row in report.rows()}
    assert (rows["person"]["fp"], rows["person"]["confused"], rows["person"]["confused_with"]) == (4, 3, {"city": 3})
    assert (rows["city"]["fp"], rows["city"]["confused"]) == (2, 2)
    assert rows["city"]["confused_with"] == {"day": 1, "person": 1}
    assert (rows["day"]["fp"], rows["day"]["confused"], rows["day"]["confused_with"]) == (1, 1, {"person": 1})
    # a relation predicted for one type whose (head, tail) is gold for another type of the record
    gold_r = [
        {"relations": [{"works_for": {"head": "Ann", "tail": "Acme"}}, {"lives_in": {"head": "Bo", "tail": "Oslo"}}]}
    ]
    ann_acme = {"head": "Ann", "tail": "Acme"}
    predicted_r = [{"relation_extraction": {"works_for": [], "lives_in": [ann_acme, {"head": "X", "tail": "Y"}]}}]
    rows = {row["label"]: row for row in score_records(gold_r, predicted_r).rows()}
    assert (rows["lives_in"]["fp"], rows["lives_in"]["confused"]) == (2, 1)
    assert rows["lives_in"]["confused_with"] == {"works_for": 1} and rows["works_for"]["confused"] == 0


def test_inference_schema_asks_for_every_label_of_the_data_set():
    gold = [
        {"entities": {"person": ["Ann"]}, "entity_descriptions": {"person": "a human"}},
        {
            "entities": {"city": ["Rome"]},
            "relations": [{"visits": {"head": "Ann", "tail": "Rome"}}],
            "classifications": [{"task": "mood", "labels": ["up", "down"], "true_label": ["up"]}],
            "json_structures": [{"trip": {"to": "Rome", "kind": {"value": "work", "choices": ["work", "fun"]}}}],
        },
    ]
    dataset = DatasetSchema.of([record for record in gold])
    assert inference_schema(gold[0], dataset) == {
        "entities": {"person": "a human", "city": ""},
        "relations": ["visits"],
        "structures": {
            "trip": {
                "fields": [{"name": "to", "dtype": "str"}, {"name": "kind", "dtype": "str", "choices": ["work", "fun"]}]
            }
        },
    }
    assert inference_schema(gold[1], dataset)["classifications"] == [
        {"task": "mood", "labels": ["up", "down"], "multi_label": False}
    ]


def test_malformed_input_is_refused_with_what_was_wrong():
    with pytest.raises(RecordError, match="1 predictions for 2 gold records"):
        score_records([ENTITY_GOLD, ENTITY_GOLD], [{}])
    with pytest.raises(RecordError, match="prediction 0 must be an object"):
        score_records([ENTITY_GOLD], ["Alice"])
    with pytest.raises(RecordError, match="'entities' must map labels"):
        score_records([{"entities": "Alice"}], [{}])
    with pytest.raises(RecordError, match="classification needs 'task'"):
        score_records([{"classifications": [{"task": "x"}]}], [{}])
    with pytest.raises(RecordError, match="a relation must be"):
        score_records([{"relations": [{"r": {"head": "a", "tail": "b"}}]}], [{"relation_extraction": {"r": ["x"]}}])


def test_scoring_stays_torch_free():
    code = (
        "import sys; import prefect_gliner2.session_core.scoring, prefect_gliner2.session_core.metrics; "
        "heavy = [m for m in ('torch', 'numpy', 'transformers', 'gliner2', 'prefect') if m in sys.modules]; "
        "print(heavy); sys.exit(1 if heavy else 0)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr


def test_labels_are_asked_in_the_order_the_records_list_them():
    # first appearance would be person, company, city; every record lists city before company
    outputs = [
        {"entities": {"person": ["Ann"], "company": ["Acme"]}},
        {"entities": {"person": ["Bo"], "city": ["Rome"], "company": ["Initech"], "day": ["Monday"]}},
        {"entities": {"city": ["Oslo"]}},
    ]
    assert list(DatasetSchema.of(outputs).entities) == ["person", "city", "company", "day"]
    assert data_order([["b", "c"], ["a", "b"]]) == ["a", "b", "c"]
    assert data_order([["a", "b"], ["b", "a"], ["c"]]) == ["a", "b", "c"]  # records disagree: first appearance
    assert data_order([]) == []

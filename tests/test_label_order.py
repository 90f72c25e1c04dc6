"""Seeded per-record label orders: deterministic, a true permutation, different across records and trials."""

from __future__ import annotations

from prefect_gliner2.session_core.label_order import shuffle_schema

SCHEMA = {
    "entities": {"person": "a human", "company": "", "city": "", "day": ""},
    "relations": ["works_for", "lives_in", "born_in"],
    "classifications": [{"task": "topic", "labels": ["a", "b"], "multi_label": False}],
    "structures": {"order": {"fields": [{"name": "id", "dtype": "str"}, {"name": "qty", "dtype": "str"}]}},
}


def test_same_inputs_same_order_and_nothing_lost() -> None:
    first = shuffle_schema(SCHEMA, seed=7, position=3)
    assert first == shuffle_schema(SCHEMA, seed=7, position=3)
    assert list(first) == list(SCHEMA)
    assert first["entities"] == SCHEMA["entities"]  # same labels with their descriptions (dict equality ignores order)
    assert sorted(first["relations"]) == sorted(SCHEMA["relations"])
    assert first["classifications"] == SCHEMA["classifications"]
    fields = first["structures"]["order"]["fields"]
    assert sorted(f["name"] for f in fields) == ["id", "qty"]
    assert list(SCHEMA["entities"]) == ["person", "company", "city", "day"]  # the input is not modified


def test_orders_differ_across_records_and_trials() -> None:
    orders = {tuple(shuffle_schema(SCHEMA, seed=0, position=p)["entities"]) for p in range(40)}
    assert len(orders) > 10  # 24 permutations; 40 records reach many of them
    trials = {tuple(shuffle_schema(SCHEMA, seed=0, position=0, trial=t)["entities"]) for t in range(20)}
    assert len(trials) > 5
    seeds = {tuple(shuffle_schema(SCHEMA, seed=s, position=0)["entities"]) for s in range(20)}
    assert len(seeds) > 5

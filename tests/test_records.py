"""Records: every accepted input form, record JSON (key order kept) and hashes, and every rejection with row and
reason."""

from __future__ import annotations

import gzip
import hashlib
import json
import os
from typing import Any

import fsspec
import pytest

from prefect_gliner2.session_core.canonical import Record, RecordSet, record_json
from prefect_gliner2.session_core.errors import RecordError
from prefect_gliner2.session_core.records import load_records

TEXT = "John Smith works at Google in Paris."


def _records(n: int) -> list[dict[str, Any]]:
    return [
        {"input": f"Person {i} named John met Mary in Paris.", "output": {"entities": {"person": ["John", "Mary"]}}}
        for i in range(n)
    ]


def _rec(**output: Any) -> dict[str, Any]:
    return {"input": TEXT, "output": output}


def _error(records: Any, **kwargs: Any) -> str:
    with pytest.raises(RecordError) as info:
        load_records(records, **kwargs)
    return str(info.value)


class FakeInputExample:
    """Stands in for gliner2.training.InputExample (importing gliner2 would import torch)."""

    def __init__(self, text: str, entities: dict[str, list[str]]) -> None:
        self.text = text
        self.entities = entities

    def to_dict(self) -> dict[str, Any]:
        return {"input": self.text, "output": {"entities": self.entities}}


class AttributeOnlyExample:
    """An InputExample-like object without to_dict(): read by attributes."""

    def __init__(self, text: str, entities: dict[str, list[str]]) -> None:
        self.text = text
        self.entities = entities
        self.classifications: list[Any] = []


def test_record_json_hash_and_length() -> None:
    record = {"output": {"entities": {"person": ["John Smith"], "company": ["Google"]}}, "input": TEXT}
    records = load_records([record])
    # input first, then output; the key order inside output is the caller's (gliner2 reads it), never sorted
    expected = (
        '{"input":"John Smith works at Google in Paris.",'
        '"output":{"entities":{"person":["John Smith"],"company":["Google"]}}}'
    )
    assert isinstance(records[0], Record)
    assert records[0].canonical_json == expected == record_json({"input": TEXT, "output": record["output"]})
    assert records[0].content_hash == hashlib.sha256(expected.encode("utf-8")).hexdigest()
    assert records[0].text_length == len(TEXT)
    assert records[0].example == json.loads(expected)


def test_non_ascii_is_kept_as_utf8() -> None:
    record = {"input": "Zoë lives in Zürich 東京.", "output": {"entities": {"city": ["zürich", "東京"]}}}
    loaded = load_records([record])[0]
    assert "Zürich" in loaded.canonical_json and "\\u" not in loaded.canonical_json
    assert loaded.content_hash == hashlib.sha256(loaded.canonical_json.encode("utf-8")).hexdigest()


def test_only_the_top_level_key_order_is_normalised() -> None:
    a = {"input": TEXT, "output": {"entities": {"person": ["John Smith"], "company": ["Google"]}}}
    b = {"output": {"entities": {"person": ["John Smith"], "company": ["Google"]}}, "input": TEXT}
    c = {"input": TEXT, "output": {"entities": {"company": ["Google"], "person": ["John Smith"]}}}
    assert load_records([a])[0].content_hash == load_records([b])[0].content_hash
    assert load_records([a])[0].content_hash != load_records([c])[0].content_hash  # gliner2 trains them differently


def test_alternative_native_dict_formats_are_canonicalized() -> None:
    native = {"input": TEXT, "output": {"entities": {"person": ["John Smith"]}}}
    text_schema = {"text": TEXT, "schema": {"entities": {"person": ["John Smith"]}}}
    text_entities = {"text": TEXT, "entities": {"person": ["John Smith"]}}
    records = load_records([native, text_schema, text_entities])
    assert records[0] == records[1] == records[2]
    assert records.example(2) == native


def test_key_order_inside_a_record_is_kept_and_hashed() -> None:
    """gliner2 builds the schema in dict order (entity types, structure fields, relation fields), so order is data:
    it survives loading, JSONL, the manifest round trip, and two orders are two different records."""
    first = _rec(
        entities={"person": ["John Smith"], "company": ["Google"], "city": ["Paris"]},
        json_structures=[{"job": {"employer": "Google", "employee": "John Smith"}}],
    )
    second = _rec(
        json_structures=[{"job": {"employee": "John Smith", "employer": "Google"}}],
        entities={"city": ["Paris"], "company": ["Google"], "person": ["John Smith"]},
    )
    loaded = load_records([first, second])
    assert loaded.example(0) == first and list(loaded.example(0)["output"]["entities"]) == ["person", "company", "city"]
    assert list(loaded.example(0)["output"]["json_structures"][0]["job"]) == ["employer", "employee"]
    assert list(loaded.example(1)["output"]) == ["json_structures", "entities"]
    assert list(loaded.example(1)["output"]["entities"]) == ["city", "company", "person"]
    assert loaded.content_hash(0) != loaded.content_hash(1)
    assert load_records([loaded.example(0)]).content_hash(0) == loaded.content_hash(0)
    assert load_records(loaded.examples()) == loaded


def test_real_gliner2_input_example_with_every_task_kind() -> None:
    from gliner2.training.data import ChoiceField, Classification, Relation, Structure

    import prefect_gliner2.training
    from prefect_gliner2.training import InputExample  # gliner2's own class, re-exported lazily

    assert InputExample is __import__("gliner2.training", fromlist=["InputExample"]).InputExample
    assert "InputExample" in prefect_gliner2.training.__all__

    example = InputExample(
        text=TEXT,
        entities={"person": ["John Smith"], "city": ["Paris"]},
        entity_descriptions={"company": "a firm"},
        classifications=[Classification(task="topic", labels=["work", "sport"], true_label="work")],
        structures=[
            Structure("job", employee="John Smith", employer="Google", kind=ChoiceField("full", ["full", "part"]))
        ],
        relations=[Relation("works_at", head="John Smith", tail="Google")],
    )
    assert example.validate() == []
    loaded = load_records([example])
    assert loaded.example(0) == example.to_dict()
    assert json.dumps(loaded.example(0)) == json.dumps(example.to_dict())  # same key order, at every level


def test_input_example_duck_typing() -> None:
    records = load_records(
        [FakeInputExample(TEXT, {"person": ["John Smith"]}), AttributeOnlyExample(TEXT, {"company": ["Google"]})]
    )
    assert records.example(0) == {"input": TEXT, "output": {"entities": {"person": ["John Smith"]}}}
    assert records.example(1) == {"input": TEXT, "output": {"entities": {"company": ["Google"]}}}


def test_all_task_kinds_negatives_and_spans_are_valid() -> None:
    record = _rec(
        entities={"person": ["john smith", {"text": "Google", "start": 20, "end": 26}], "date": []},
        entity_descriptions={"person": "a human"},
        classifications=[
            {"task": "topic", "labels": ["work", "sport"], "true_label": "work"},
            {
                "task": "tags",
                "labels": ["a", "b"],
                "true_label": ["a", "b"],
                "multi_label": True,
                "label_descriptions": {"a": "first"},
                "examples": [["x", "a"]],
            },
        ],
        json_structures=[
            {
                "job": {
                    "employee": "John Smith",
                    "employer": ["Google"],
                    "kind": {"value": "full", "choices": ["full", "part"]},
                    "note": None,
                }
            }
        ],
        json_descriptions={"job": {"employee": "who"}},
        record_metadata={"job": {"mode": "natural", "anchor": "employee"}},
        relations=[
            {"works_at": {"head": "John Smith", "tail": "Google"}},
            {"works_at": {"head": "John", "tail": "google"}},
        ],
        relation_descriptions={"works_at": "employment"},
    )
    assert len(load_records([record, _rec(entities={"person": []})])) == 2


def test_jsonl_local_path_list_of_paths_and_gzip(tmp_path: os.PathLike) -> None:
    rows = _records(5)
    first, second = os.path.join(tmp_path, "a.jsonl"), os.path.join(tmp_path, "b.jsonl.gz")
    with open(first, "w", encoding="utf-8") as handle:
        handle.writelines(json.dumps(r) + "\n" for r in rows[:3])
    with gzip.open(second, "wt", encoding="utf-8") as handle:
        handle.writelines(json.dumps(r) + "\n" for r in rows[3:])
    expected = load_records(rows)
    assert load_records([first, second]) == expected
    from pathlib import Path

    assert load_records(Path(first)) == expected[:3]


def test_jsonl_from_fsspec_memory_url() -> None:
    rows = _records(4)
    with fsspec.open("memory://data/train.jsonl", "w", encoding="utf-8") as handle:
        handle.write("\n".join(json.dumps(r) for r in rows))  # no trailing newline is fine
    assert load_records("memory://data/train.jsonl") == load_records(rows)


def test_jsonl_blank_malformed_and_non_utf8_lines_name_the_line(tmp_path: os.PathLike) -> None:
    path = os.path.join(tmp_path, "bad.jsonl")
    good = json.dumps(_records(1)[0])
    with open(path, "wb") as handle:
        handle.write(f"{good}\n\n{{oops\n{good}\n".encode() + b"\xff\xfe\n" + b"   \n")
    message = _error(path)
    assert f"{path} line 2: blank line" in message
    assert f"row 1 ({path} line 3): invalid JSON" in message
    assert f"{path} line 5: not valid UTF-8" in message
    assert f"{path} line 6: blank line" in message


def test_jsonl_row_numbers_continue_across_files(tmp_path: os.PathLike) -> None:
    first, second = os.path.join(tmp_path, "a.jsonl"), os.path.join(tmp_path, "b.jsonl")
    with open(first, "w") as handle:
        handle.write(json.dumps(_records(1)[0]) + "\n")
    with open(second, "w") as handle:
        handle.write(json.dumps(_rec(entities={"person": ["Nobody"]})) + "\n")
    assert f"row 1 ({second} line 1): entity 'Nobody' (type: person) not found in text" in _error([first, second])


@pytest.mark.parametrize(
    ("record", "reason"),
    [
        (_rec(entities={"person": ["Alice"]}), "entity 'Alice' (type: person) not found in text (case-insensitive)"),
        ({"input": "", "output": {"entities": {"p": []}}}, "'input' text is empty"),
        ({"input": "   ", "output": {"entities": {"p": []}}}, "'input' text is empty"),
        ({"input": 5, "output": {"entities": {"p": []}}}, "'input' must be a string, got int"),
        ({"input": TEXT, "output": ["entities"]}, "'output' must be an object of tasks, got list"),
        (_rec(), "no task: 'output' needs at least one of entities"),
        (_rec(entities={}), "no task"),
        (_rec(entites={"person": ["John"]}), "unknown output key 'entites' (did you mean 'entities'?)"),
        (_rec(entities={"person": "John"}), "entities['person'] must be a list of mentions, got str"),
        (_rec(entities={"": ["John"]}), "entity type '' must be a non-empty string"),
        (_rec(entities={"person": [3]}), "entity 3 (type: person) must be a string or a {'text', 'start', 'end'} span"),
        (
            _rec(entities={"company": [{"text": "Google", "start": 0, "end": 6}]}),
            "offsets [0, 6) hold 'John S', not 'Google'",
        ),
        (_rec(entities={"company": [{"text": "Google"}]}), "is a span missing ['end', 'start']"),
        (
            _rec(entities={"p": []}, entity_descriptions={"company": "firms"}),
            "entity_descriptions describes 'company', which is not in entities",
        ),
        (
            _rec(classifications=[{"task": "t", "labels": ["a", "b"], "true_label": "c"}]),
            "true label 'c' not in labels list for task 't'",
        ),
        (_rec(classifications=[{"task": "t", "labels": []}]), "classification 0 is missing ['true_label']"),
        (
            _rec(classifications=[{"task": "t", "labels": [], "true_label": "a"}]),
            "classification 't' must have a non-empty list of string labels",
        ),
        (
            _rec(classifications=[{"task": "", "labels": ["a"], "true_label": "a"}]),
            "task name must be a non-empty string",
        ),
        (
            _rec(classifications=[{"task": "t", "labels": ["a"], "true_label": "a", "label_descriptions": {"z": "?"}}]),
            "label description key 'z' not in labels",
        ),
        (
            _rec(classifications=[{"task": "t", "labels": ["a"], "true_label": "a", "examples": [["only one"]]}]),
            "example 0 for task 't' must be an [input, output] pair",
        ),
        (_rec(classifications={"task": "t"}), "'classifications' must be a list, got dict"),
        (
            _rec(json_structures=[{"job": {"employee": "Alice"}}]),
            "structure value 'Alice' for 'job.employee' not found in text",
        ),
        (
            _rec(json_structures=[{"job": {"kind": {"value": "x", "choices": ["a"]}}}]),
            "choice field whose value is not in its choices",
        ),
        (_rec(json_structures=[{"job": {}}]), "structure 'job' has no fields"),
        (_rec(json_structures=[{"job": {"employee": ["John", "Zed"]}}]), "item 'Zed' not found in text"),
        (
            _rec(relations=[{"works_at": {"head": "John", "tail": "Apple"}}]),
            "relation value 'Apple' for 'works_at.tail' not found in text",
        ),
        (
            _rec(relations=[{"r": {"head": "John", "tail": "Google"}}, {"r": {"head": "John", "object": "Paris"}}]),
            "relation 'r' has inconsistent fields",
        ),
        (_rec(relations=[{"r": {}}]), "relation 'r' has no fields"),
        (_rec(record_metadata=["job"], entities={"p": []}), "'record_metadata' must be an object, got list"),
        (_rec(entities={"person": ["John"]}, extra=1), "unknown output key 'extra'"),
        ({"input": TEXT, "output": {"entities": {"p": []}}, "id": 7}, "unknown top-level key(s) 'id'"),
        ({"input": TEXT}, "missing key 'output'"),
        ({"txt": TEXT}, "unknown record format with keys ['txt']"),
        (
            {"text": TEXT, "entities": {"p": []}, "entity_descriptions": {}},
            "unknown top-level key(s) ['entity_descriptions']",
        ),
        (5, "unsupported record type int"),
        (
            _rec(
                entities={"person": ["John"]},
                classifications=[{"task": "t", "labels": ["a"], "true_label": "a", 3: "x"}],
            ),
            "non-string key 3",
        ),
        (
            _rec(entities={"person": ["John"]}, record_metadata={"job": {"x": {1, 2}}}),
            "not JSON-serializable: set is not JSON-serializable",
        ),
        (_rec(entities={"person": ["John"]}, record_metadata={"job": float("nan")}), "not JSON-serializable"),
        ({"input": "bad \ud800 text", "output": {"entities": {"p": []}}}, "not valid Unicode (a lone surrogate)"),
    ],
)
def test_each_rejection_names_row_and_reason(record: Any, reason: str) -> None:
    message = _error([_records(1)[0], record])
    assert "row 1: " in message and reason in message, message
    assert "1 of 2 training records are invalid" in message
    assert "row 0" not in message


def test_case_insensitive_mentions_are_accepted() -> None:
    assert len(load_records([_rec(entities={"person": ["JOHN SMITH"], "company": ["google"]})])) == 1


def test_all_problems_are_collected_and_listing_is_capped() -> None:
    bad = [_rec(entities={"person": [f"Nobody{i}"]}) for i in range(30)]
    message = _error(_records(2) + bad, what="validation")
    assert "30 of 32 validation records are invalid" in message
    assert "row 2: entity 'Nobody0'" in message and "row 21: entity 'Nobody19'" in message
    assert "row 22:" not in message and "... and 10 more problem(s)" in message
    assert "nothing was dropped" in message


def test_empty_inputs_are_errors(tmp_path: os.PathLike) -> None:
    assert "no training records" in _error([])
    empty = os.path.join(tmp_path, "empty.jsonl")
    open(empty, "w").close()
    assert "no training records" in _error(empty) and empty in _error(empty)
    assert len(load_records([], allow_empty=True)) == 0


def test_unsupported_sources() -> None:
    assert "got a single record; wrap records in a list" in _error(_records(1)[0])
    assert "mix file paths and in-memory records" in _error(["a.jsonl", _records(1)[0]])
    assert "cannot read records from int" in _error(42)


def test_missing_file_raises_os_error(tmp_path: os.PathLike) -> None:
    with pytest.raises(FileNotFoundError):
        load_records(os.path.join(tmp_path, "missing.jsonl"))


def test_record_set_sequence_behaviour() -> None:
    records = load_records(_records(5))
    assert len(records) == 5 and records[-1] == records[4]
    assert [r.content_hash for r in records] == [records.content_hash(i) for i in range(5)]
    assert isinstance(records[1:3], RecordSet) and len(records[1:3]) == 2 and records[1:3][0] == records[1]
    with pytest.raises(IndexError, match="record row 5 is out of range: this set has 5 records"):
        records[5]
    example = records.example(0)
    example["input"] = "mutated"
    assert records.example(0)["input"] != "mutated"
    assert records.examples([2, 0]) == [records.example(2), records.example(0)]
    assert records.examples() == [records.example(i) for i in range(5)]
    assert records.json_array() == record_json(records.examples())
    assert list(records.lengths) == [len(r["input"]) for r in _records(5)]
    assert load_records(records) is records
    assert records == load_records(_records(5)) and records != load_records(_records(4))
    assert records.digest_hex == hashlib.sha256(b"".join(records.digest(i) for i in range(5))).hexdigest()


def test_native_training_dataset_like_source() -> None:
    class Dataset:
        def to_records(self) -> list[dict[str, Any]]:
            return _records(3)

    assert load_records(Dataset()) == load_records(_records(3))

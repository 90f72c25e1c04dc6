"""Tiny offline GLiNER2 builders (prefect_gliner2.training.tiny): determinism, native loading, native training,
inference."""

from __future__ import annotations

import math
import random
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from prefect_gliner2.training.tiny import (
    BENCH_MODEL_SIZE,
    GLINER2_BASE_SIZE,
    GLINER2_SPECIAL_TOKENS,
    TINY_ENTITY_TYPES,
    TINY_SPECIAL_TOKENS,
    TINY_WORDS,
    build_tiny_encoder_dir,
    build_tiny_model,
    build_tiny_tokenizer,
    save_tiny_model,
    tiny_encoder_config,
    tiny_records,
    tiny_vocab,
)

torch = pytest.importorskip("torch")
gliner2 = pytest.importorskip("gliner2")

ARCHITECTURES = ("span", "boundary")


# ---------------------------------------------------------------------------
# fixtures
# ---------------------------------------------------------------------------


@pytest.fixture(autouse=True)
def one_torch_thread():
    """Tiny models gain nothing from intra-op threads, and on a shared 2-core box two
    threads per process oversubscribe: a 0.06 s training run was measured at 2.7 s."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def offline(monkeypatch):
    """Offline env vars, plus a socket guard: any connection attempt fails the test."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")
    import huggingface_hub.constants as hub_constants

    # huggingface_hub reads HF_HUB_OFFLINE once, at import time.
    if hasattr(hub_constants, "HF_HUB_OFFLINE"):
        monkeypatch.setattr(hub_constants, "HF_HUB_OFFLINE", True)

    def refuse(*args, **kwargs):
        raise AssertionError(f"network access attempted: {args!r}")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)


@pytest.fixture
def restore_globals():
    """ExtractorTrainer reseeds every global RNG and sets torch's matmul precision; undo that."""
    import numpy as np

    py_state, np_state, torch_state = random.getstate(), np.random.get_state(), torch.get_rng_state()
    precision = torch.get_float32_matmul_precision()
    yield
    random.setstate(py_state)
    np.random.set_state(np_state)
    torch.set_rng_state(torch_state)
    torch.set_float32_matmul_precision(precision)


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory):
    """One saved tiny model directory per architecture, built once for the module."""
    root = tmp_path_factory.mktemp("tiny-models")
    return {arch: save_tiny_model(root / arch, arch, seed=0) for arch in ARCHITECTURES}


def _load(path):
    return gliner2.AutoExtractor.from_pretrained(str(path))


def _files(directory: Path) -> dict[str, bytes]:
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


# ---------------------------------------------------------------------------
# vocabulary, tokenizer, records
# ---------------------------------------------------------------------------


def test_vocab_layout():
    vocab = tiny_vocab()
    assert vocab["[PAD]"] == 0
    assert len(vocab) == len(TINY_SPECIAL_TOKENS) + len(GLINER2_SPECIAL_TOKENS) + len(TINY_WORDS)
    assert len(set(vocab.values())) == len(vocab)
    assert 200 <= len(TINY_WORDS) <= 1000
    assert all(w == w.lower() and " " not in w for w in TINY_WORDS)
    # gliner2's own list must be covered, or the processor would grow the tokenizer
    from gliner2.processor import SchemaTransformer

    assert set(SchemaTransformer.SPECIAL_TOKENS) <= set(vocab)


def test_tokenizer_loads_offline_and_covers_records(tmp_path, offline):
    from gliner2.processing.word_splitter import WhitespaceTokenSplitter
    from transformers import AutoTokenizer

    build_tiny_tokenizer(tmp_path / "tok")
    tokenizer = AutoTokenizer.from_pretrained(str(tmp_path / "tok"))
    assert len(tokenizer) == len(tiny_vocab())
    assert tokenizer.pad_token_id == 0
    for special in GLINER2_SPECIAL_TOKENS:
        assert tokenizer.tokenize(special) == [special]
    assert tokenizer.tokenize("Hello-World") == ["[UNK]", "-", "[UNK]"]  # punctuation is split off
    assert tokenizer("Alice lives")["input_ids"][0] == tokenizer.cls_token_id

    # Every word of the records, every entity label and classification label, and
    # the processor's synthetic labels ("entity 3", "label 2") are in the vocabulary.
    splitter = WhitespaceTokenSplitter()
    words = set()
    for record in tiny_records(300, seed=0, classifications=True) + tiny_records(50, seed=7):
        words.update(token for token, _, _ in splitter(record["input"]))
        for classification in record["output"].get("classifications", []):
            words.update([classification["task"], *classification["labels"]])
    words.update(TINY_ENTITY_TYPES)
    words.update(["entities", "entity 1", "entity 12", "label 3", "field 2", "classifications"])
    unknown = sorted(w for w in words if tokenizer.unk_token in tokenizer.tokenize(w))
    assert unknown == []


def test_records_are_deterministic_grounded_and_varied():
    records = tiny_records(40, seed=3)
    assert records == tiny_records(40, seed=3)
    assert tiny_records(10, seed=3) == records[:10]  # record i depends only on (seed, i)
    assert tiny_records(10, seed=4) != records[:10]
    assert tiny_records(0) == []

    lengths = set()
    for record in records:
        assert set(record) == {"input", "output"}
        text = record["input"]
        entities = record["output"]["entities"]
        assert entities and set(entities) <= set(TINY_ENTITY_TYPES)
        for mentions in entities.values():
            assert mentions and len(mentions) == len(set(mentions))
            for mention in mentions:
                assert mention in text
        assert "classifications" not in record["output"]
        lengths.add(len(text.split()))
    assert len(lengths) >= 8 and min(lengths) < 12 and max(lengths) > 25
    types = {kind for record in records for kind in record["output"]["entities"]}
    assert types == set(TINY_ENTITY_TYPES)

    with_cls = tiny_records(12, seed=3, classifications=True)
    labelled = [r for r in with_cls if "classifications" in r["output"]]
    assert len(labelled) == 4
    for record in labelled:
        (classification,) = record["output"]["classifications"]
        assert classification["task"] == "sentiment"
        assert len(classification["true_label"]) == 1
        assert classification["true_label"][0] in classification["labels"]


def test_records_use_no_global_rng():
    state = random.getstate()
    tiny_records(20, seed=1, classifications=True)
    assert random.getstate() == state


def test_importing_tiny_stays_torch_free():
    # A fresh process: the package and every module in it load their heavy dependencies only when building.
    code = (
        "import sys\n"
        "import prefect_gliner2.training.tiny as t\n"
        "from prefect_gliner2.training.tiny import data, encoder, models, tokenizer\n"
        "assert t.tiny_records(3) and len(t.tiny_vocab()) > 200\n"
        "heavy = sorted(m for m in ('torch', 'transformers', 'gliner2', 'tokenizers', 'numpy') if m in sys.modules)\n"
        "assert not heavy, heavy\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr


# ---------------------------------------------------------------------------
# building, saving, loading
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_save_is_byte_identical_and_loads_offline(arch, model_dirs, tmp_path, offline):
    again = save_tiny_model(tmp_path / "again", arch, seed=0)
    first, second = _files(model_dirs[arch]), _files(again)
    assert set(first) >= {
        "config.json",
        "encoder_config/config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
    }
    assert first == second  # every file, not just the weights

    other_seed = save_tiny_model(tmp_path / "seed1", arch, seed=1)
    assert (other_seed / "model.safetensors").read_bytes() != first["model.safetensors"]

    model = _load(model_dirs[arch])
    expected = gliner2.BoundaryExtractor if arch == "boundary" else gliner2.SpanExtractor
    assert type(model) is expected
    assert model.architecture == arch
    assert model.config.architecture == arch
    assert model.encoder.config.hidden_size == 32
    assert model.encoder.config.num_hidden_layers == 1
    assert len(model.processor.tokenizer) == len(tiny_vocab())
    assert all(p.dtype == torch.float32 for p in model.parameters())

    other = "span" if arch == "boundary" else "boundary"
    with pytest.raises(gliner2.ArchitectureMismatchError):
        gliner2.AutoExtractor.from_pretrained(str(model_dirs[arch]), architecture=other)


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_build_tiny_model_matches_saved_dir_and_keeps_global_rng(arch, model_dirs, tmp_path, offline):
    import numpy as np

    states = (random.getstate(), np.random.get_state()[1].copy(), torch.get_rng_state())
    model = build_tiny_model(arch, seed=0)
    kept = build_tiny_model(arch, seed=0, directory=tmp_path / "kept")
    if threading.active_count() == 1:  # other threads (Prefect's services, in a full run) draw from `random` too
        assert random.getstate() == states[0]
    assert np.array_equal(np.random.get_state()[1], states[1])
    assert torch.equal(torch.get_rng_state(), states[2])

    reference = _load(model_dirs[arch]).state_dict()
    for built in (model, kept):
        assert type(built).__name__ == type(_load(model_dirs[arch])).__name__
        state = built.state_dict()
        assert state.keys() == reference.keys()
        assert all(torch.equal(state[key], reference[key]) for key in reference)
    assert (tmp_path / "kept" / "model.safetensors").read_bytes() == (
        model_dirs[arch] / "model.safetensors"
    ).read_bytes()


def test_options_reach_the_model(tmp_path, offline):
    boundary = build_tiny_model("boundary", hidden_size=64, num_layers=2, dropout=0.1)
    assert boundary.encoder.config.hidden_size == 64
    assert boundary.encoder.config.num_hidden_layers == 2
    assert boundary.encoder.config.hidden_dropout_prob == 0.1
    assert boundary.encoder.config.attention_probs_dropout_prob == 0.1
    assert boundary.config.boundary_head["dropout"] == 0.1
    assert boundary.config.boundary_head["boundary_dim"] == 64

    span = build_tiny_model("span", dropout=0.0, max_width=4)
    assert span.encoder.config.hidden_dropout_prob == 0.0
    assert span.config.span_head["max_width"] == 4 and span.max_width == 4

    bench = build_tiny_model("span", **BENCH_MODEL_SIZE)
    assert bench.encoder.config.hidden_size == BENCH_MODEL_SIZE["hidden_size"]
    assert bench.encoder.config.num_hidden_layers == BENCH_MODEL_SIZE["num_layers"]

    custom = build_tiny_model("boundary", boundary_head={"enable_records": False, "enable_relations": False})
    assert not hasattr(custom, "record_decoder") and not hasattr(custom, "relation_scorer")

    deberta = build_tiny_model("span", encoder="deberta-v2")
    assert deberta.encoder.config.model_type == "deberta-v2" and deberta.encoder.config.relative_attention
    assert _files(save_tiny_model(tmp_path / "d1", "boundary", encoder="deberta-v2")) == _files(
        save_tiny_model(tmp_path / "d2", "boundary", encoder="deberta-v2")
    )
    with pytest.raises(ValueError, match="encoder must be one of"):
        save_tiny_model(tmp_path / "bad", "span", encoder="roberta")

    with pytest.raises(ValueError):
        save_tiny_model(tmp_path / "bad", "token")
    with pytest.raises(ValueError):
        save_tiny_model(tmp_path / "bad", "span", seed=-1)


def test_encoder_dir_is_deterministic_and_builds_a_fresh_extractor(tmp_path, offline):
    from transformers import AutoModel, AutoTokenizer

    first = build_tiny_encoder_dir(tmp_path / "a", seed=5)
    second = build_tiny_encoder_dir(tmp_path / "b", seed=5)
    assert _files(first) == _files(second)
    assert "model.safetensors" in _files(first)

    encoder = AutoModel.from_pretrained(str(first))
    assert encoder.config.hidden_size == 32
    assert len(AutoTokenizer.from_pretrained(str(first))) == encoder.config.vocab_size

    # the "new model from a pretrained encoder" path: model_name is the encoder directory
    config = gliner2.ExtractorConfig(model_name=str(first), architecture="span", max_width=4)
    extractor = gliner2.SpanExtractor(config)
    assert torch.equal(extractor.encoder.embeddings.word_embeddings.weight, encoder.embeddings.word_embeddings.weight)


# ---------------------------------------------------------------------------
# native training and inference
# ---------------------------------------------------------------------------


def _native_config(output_dir: Path):
    from gliner2.training.trainer import TrainingConfig

    return TrainingConfig(
        output_dir=str(output_dir),
        fp16=False,
        bf16=False,
        num_workers=0,
        pin_memory=False,
        batch_size=4,
        num_epochs=1,
        eval_strategy="no",
        save_best=False,
        logging_steps=1,
        seed=0,
    )


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_native_trainer_trains_tiny_model(arch, model_dirs, tmp_path, monkeypatch, offline, restore_globals):
    from gliner2.training.trainer import ExtractorTrainer

    workdir = tmp_path / "cwd"
    workdir.mkdir()
    monkeypatch.chdir(workdir)  # anything written relative to the cwd would show up here

    model = _load(model_dirs[arch])
    before = {key: value.clone() for key, value in model.state_dict().items()}
    records = tiny_records(16, seed=0)
    output_dir = tmp_path / "out"

    # gliner2 2.1 shuffles a list of dict records *in place* (random.seed(config.seed);
    # random.shuffle(caller's list)): always hand it a copy. Canary for that behaviour:
    handed = list(records)
    result = ExtractorTrainer(model, _native_config(output_dir)).train(train_data=handed)
    assert handed != records and sorted(map(repr, handed)) == sorted(map(repr, records))

    assert result["total_steps"] == 4
    history = result["train_metrics_history"]
    assert len(history) == 4
    assert all(math.isfinite(entry["loss"]) and entry["loss"] > 0 for entry in history)

    after = model.state_dict()
    changed = [key for key in before if not torch.equal(before[key], after[key])]
    assert any(key.startswith("encoder.") for key in changed)
    head = "boundary_head." if arch == "boundary" else "span_rep."
    assert any(key.startswith(head) for key in changed)

    # what train() writes: the config, an (empty) logs dir and a full "final" checkpoint
    assert sorted(p.name for p in output_dir.iterdir()) == ["final", "logs", "training_config.json"]
    final = output_dir / "final"
    assert {"config.json", "model.safetensors", "encoder_config/config.json"} <= set(_files(final))
    assert list(workdir.iterdir()) == []

    reloaded = _load(final)
    assert type(reloaded) is type(model)
    assert all(torch.equal(reloaded.state_dict()[key], after[key]) for key in after)


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_native_trainer_trains_classifications(arch, model_dirs, tmp_path, offline, restore_globals):
    from gliner2.training.trainer import ExtractorTrainer

    model = _load(model_dirs[arch])
    classifier_before = {k: v.clone() for k, v in model.state_dict().items() if k.startswith("classifier.")}
    records = tiny_records(12, seed=2, classifications=True)
    result = ExtractorTrainer(model, _native_config(tmp_path / "out")).train(train_data=list(records))

    history = result["train_metrics_history"]
    assert all(math.isfinite(entry["loss"]) for entry in history)
    assert any(entry["classification_loss"] > 0 for entry in history)
    after = model.state_dict()
    assert any(not torch.equal(value, after[key]) for key, value in classifier_before.items())


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_inference_runs(arch, model_dirs, offline):
    model = _load(model_dirs[arch])
    record = tiny_records(1, seed=0)[0]
    labels = list(record["output"]["entities"])

    result = model.extract_entities(record["input"], labels)
    assert set(result["entities"]) == set(labels)
    assert model.training is False  # the runtime switches the model to eval mode itself

    classified = model.classify_text(record["input"], {"sentiment": ["positive", "negative", "neutral"]})
    assert "sentiment" in classified


def test_gliner2_base_shape_is_the_real_encoder_and_the_vocab_option_reaches_the_model(tmp_path, offline):
    from transformers import AutoModel

    config = tiny_encoder_config(
        GLINER2_BASE_SIZE["hidden_size"],
        GLINER2_BASE_SIZE["num_layers"],
        **{k: v for k, v in GLINER2_BASE_SIZE.items() if k not in ("hidden_size", "num_layers")},
    )
    assert (config.vocab_size, config.hidden_size, config.num_hidden_layers, config.num_attention_heads) == (
        128_100,
        768,
        12,
        12,
    )
    assert (config.position_buckets, config.share_att_key, config.norm_rel_ebd, config.position_biased_input) == (
        256,
        True,
        "layer_norm",
        False,
    )
    with torch.device("meta"):  # shapes only: no 700 MB allocation in a unit test
        encoder = AutoModel.from_config(config)
    assert 183_000_000 < sum(p.numel() for p in encoder.parameters()) < 185_000_000  # DeBERTa-v3-base: ~184M

    small = build_tiny_model("span", encoder="deberta-v2", deberta_v3=True, vocab_size=1000)
    assert small.encoder.config.vocab_size == 1000 and len(small.processor.tokenizer) == 1000
    assert small.encoder.get_input_embeddings().weight.shape[0] == 1000
    assert small.encoder.config.position_buckets == 256
    with pytest.raises(ValueError, match="vocab_size must be"):
        save_tiny_model(tmp_path / "bad", "span", vocab_size=10)
    with pytest.raises(ValueError, match="deberta_v3"):
        save_tiny_model(tmp_path / "bad", "span", deberta_v3=True)


# ---------------------------------------------------------------------------
# the count head: a trained tiny span model really extracts
# ---------------------------------------------------------------------------


def test_span_count_head_is_pinned_to_one_and_boundary_is_untouched(tmp_path, offline):
    model = _load(save_tiny_model(tmp_path / "pinned", "span", seed=0))
    final = model.count_pred[-1]
    assert torch.equal(final.weight, torch.zeros_like(final.weight))
    assert final.bias.argmax().item() == 1 and final.bias.sum().item() == 1.0
    probe = torch.randn(16, model.count_pred[0].in_features, generator=torch.Generator().manual_seed(0))
    assert model.count_pred(probe).argmax(-1).tolist() == [1] * 16
    random_head = _load(save_tiny_model(tmp_path / "random", "span", seed=0, pinned_count=None))
    assert not torch.equal(random_head.count_pred[-1].weight, torch.zeros_like(final.weight))
    others = {k: v for k, v in model.state_dict().items() if not k.startswith("count_pred.2.")}
    assert all(torch.equal(v, random_head.state_dict()[k]) for k, v in others.items())  # only the final layer differs
    with pytest.raises(ValueError, match="count must be in"):
        save_tiny_model(tmp_path / "bad", "span", seed=0, pinned_count=20)


def test_trained_tiny_span_model_extracts_only_with_a_count_above_zero(offline, restore_globals):
    """gliner2 trains no count loss for entities; its inference extracts a label only when the count head says > 0."""
    from prefect_gliner2.session_core.scoring import score_records
    from prefect_gliner2.training import ManagedTraining, ManagedTrainingPlan, TrainingConfig, TrainingSession

    model = build_tiny_model("span", seed=0)
    config = TrainingConfig(
        fp16=False,
        bf16=False,
        num_epochs=10,
        batch_size=8,
        eval_strategy="no",
        encoder_lr=3e-3,
        task_lr=1e-2,
        seed=7,
        # the count head is the subject here, not label-order robustness: train in the order this test asks
        shuffle_entity_labels=False,
        negative_label_prob=0.0,
    )
    plan = ManagedTrainingPlan(tiny_records(64, seed=1), config, architecture="span")
    with ManagedTraining(TrainingSession(model, config, max_steps=plan.max_steps), plan) as run:
        run.run()
        count_head = {k: v.clone() for k, v in model.count_pred.state_dict().items()}
        valid = tiny_records(24, seed=2)
        texts, gold = [r["input"] for r in valid], [r["output"] for r in valid]
        labels = list(TINY_ENTITY_TYPES)
        pinned = score_records(gold, model.batch_extract_entities(texts, labels, batch_size=8))
        assert all(torch.equal(v, model.count_pred.state_dict()[k]) for k, v in count_head.items())  # never trained
        assert pinned.total().tp > 0
        with torch.no_grad():
            model.count_pred[-1].bias.copy_(torch.nn.functional.one_hot(torch.tensor(0), 20).float())
        unpinned = score_records(gold, model.batch_extract_entities(texts, labels, batch_size=8))
        assert unpinned.total().predicted == 0 and pinned.total().predicted > 0

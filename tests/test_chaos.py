"""The chaos engine's quick mode (`bench/chaos.py --quick`): SIGKILLs at seeded moments, resume, bitwise equal."""

from __future__ import annotations

from pathlib import Path

from support import chaos, chaos_storage


def test_quick_chaos_resumes_bit_for_bit(prefect_server: str, tmp_path: Path) -> None:
    report = chaos.run_chaos(quick=True, seed=0, api_url=prefect_server, work=tmp_path)
    text = chaos.format_report(report)
    assert report["killed"] == report["kill_points_tried"] == 2, text
    assert report["resumed"] == 2, text
    assert report["differing_bits"] == 0, text
    assert report["histories_equal"] and report["summaries_equal"], text
    for case in report["cases"]:
        assert case["tensors"] > 0 and case["differing_tensors"] == 0, text
        assert all(kill["worker_gone"] for kill in case["kills"]), text
    assert {case["case"] for case in report["cases"]} == {"boundary", "span-lora"}


def test_differing_bits_counts_exact_bit_flips() -> None:
    import torch

    a = torch.tensor([1.0, 2.0, 3.0])
    b = a.clone()
    assert chaos.differing_bits(a, b) == 0
    b.view(torch.int32)[1] ^= 0b101  # two bits of the mantissa
    assert chaos.differing_bits(a, b) == 2
    assert chaos.differing_bits(a, a.double()) == 3 * 8 * 8  # a dtype change counts every bit


def test_storage_faults_are_detected_and_never_silently_retrained(prefect_server: str, tmp_path: Path) -> None:
    """A damaged newest checkpoint is detected, moved aside, and the run continues exactly from the previous intact
    checkpoint (never silently ignored); a failing checkpoint write (injected, or a real EFBIG) loses nothing."""
    faults = chaos_storage.storage_faults(tmp_path, chaos.make_inputs(tmp_path / "data"), prefect_server)
    text = "\n".join(
        f"{f.fault}: detected {f.detected}, exact {f.continued_exactly}; {f.error} -- {f.note}" for f in faults
    )
    assert len(faults) == 5 and all(f.detected for f in faults), text
    for fault in faults[:3]:  # damaged newest checkpoint: quarantined, continued from the previous intact one
        assert fault.continued_exactly and "moved aside" in fault.note, text
    assert all(f.continued_exactly for f in faults[3:]), text
    assert "StorageFullError" in faults[4].error and "free space" in faults[4].error, text  # permanent, not retried
    assert "kept ['step-000002-batch-000003']" in faults[4].note, text  # committed before the fault: kept, used
    assert "continued from batch 4" in faults[4].note, text


def test_background_checkpoint_chaos_resumes_bit_for_bit(prefect_server: str, tmp_path: Path) -> None:
    """Checkpoints written in the background: the flow is SIGKILLed while a write is paused and training has gone
    on past it, and the worker SIGKILLs itself inside a background write; every resume is bit-exact."""
    report = chaos.run_chaos(quick=True, seed=0, api_url=prefect_server, work=tmp_path, cases=["span-background"])
    text = chaos.format_report(report)
    (case,) = report["cases"]
    assert [kill["kind"] for kill in case["kills"]] == ["background-write", "background-worker"], text
    assert report["killed"] == report["kill_points_tried"] == 2 and report["resumed"] == 2, text
    assert all(kill["worker_gone"] for kill in case["kills"]), text
    paused = case["kills"][0]  # killed while checkpoint i was written: the cursor had not moved to it
    assert (paused["cursor_after"] or 0) <= int(paused["point"].split(":")[1]), text
    assert report["differing_bits"] == 0 and case["tensors"] > 0 and case["differing_tensors"] == 0, text
    assert report["histories_equal"] and report["summaries_equal"], text

"""Runs on object storage: a real S3 API server (moto, on loopback) behind s3fs, as a fleet would use it.

A run whose storage is ``s3://`` exports the same bits as a direct run, reports the disk it uses, keeps only the
checkpoints retention allows, and loading its export leaves no temporary copy behind.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import pytest
from _flow_helpers import assert_same_export, config, make_space, reference_export, run_flow
from _prefect_fixtures import prefect_server  # noqa: F401  (fixture)
from support_services import s3_bucket, s3_endpoint  # noqa: F401  (fixtures)

pytestmark = pytest.mark.usefixtures("prefect_server")


@pytest.fixture(scope="module")
def space(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return make_space(tmp_path_factory.mktemp("s3"))


def _download(uri: str, target: Path) -> str:
    import fsspec

    fs, path = fsspec.core.url_to_fs(uri)
    fs.invalidate_cache()
    fs.get(f"{path.rstrip('/')}/", str(target), recursive=True)
    return str(target)


def test_a_run_on_s3_exports_the_reference_bits_and_keeps_bounded_checkpoints(
    space: dict[str, Any],
    s3_bucket: str,  # noqa: F811
    tmp_path: Path,
) -> None:
    cfg = config()
    summary = run_flow(
        model=space["span"],
        train_data=space["inputs"]["train"],
        valid_data=space["inputs"]["valid"],
        config=cfg,
        run_key="s3-span",
        storage=f"{s3_bucket}/runs",
        checkpoint_every=1,
        keep_checkpoints=2,
    )
    assert summary["export"].startswith("s3://")
    reference = reference_export(space["span"], space["inputs"], cfg, space["root"] / "ref-span")
    assert_same_export(_download(summary["export"], tmp_path / "export"), reference)

    import fsspec

    fs, _ = fsspec.core.url_to_fs(s3_bucket)
    fs.invalidate_cache()
    kept = sorted(p.rsplit("/", 1)[-1] for p in fs.ls(f"{s3_bucket}/runs/s3-span/checkpoints", detail=False))
    # 6 updates, a checkpoint after each: the newest two plus the one taken at the best validation step survive
    best = f"step-{summary['best_step']:06d}-"
    assert summary["checkpoint"] in kept and 2 <= len(kept) <= 3, kept
    assert any(name.startswith(best) for name in kept), (best, kept)
    assert summary["checkpoints_kept"] == len(kept)
    assert summary["disk_bytes"] >= summary["checkpoint_bytes"] > 0


def test_loading_an_s3_export_leaves_no_temporary_copy(
    space: dict[str, Any],
    s3_bucket: str,  # noqa: F811
    tmp_path: Path,
) -> None:
    import fsspec
    import torch

    from prefect_gliner2.session_core import load_exported_model

    local = reference_export(space["span"], space["inputs"], config(), space["root"] / "ref-span")
    fs, _ = fsspec.core.url_to_fs(s3_bucket)
    fs.put(f"{local}/", f"{s3_bucket}/model", recursive=True)
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    previous, tempfile.tempdir = tempfile.tempdir, str(scratch)
    try:
        model = load_exported_model(f"{s3_bucket}/model")
    finally:
        tempfile.tempdir = previous
    assert list(scratch.iterdir()) == [], "load_exported_model left a temporary copy"
    direct = load_exported_model(local)
    remote_state, local_state = model.state_dict(), direct.state_dict()
    assert sorted(remote_state) == sorted(local_state)
    assert all(torch.equal(remote_state[k], local_state[k]) for k in local_state)

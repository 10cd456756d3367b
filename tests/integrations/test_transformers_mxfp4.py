"""gpt-oss's MXFP4 release in transformers: on a CPU transformers loads it by dequantizing the
experts to bf16 (convert_moe_packed_tensors); ``ktforge.transformers.load_checkpoint`` then runs
them from the file's own MXFP4 codes and scales, with gpt-oss's activation and biases, and frees
that copy."""

from __future__ import annotations

from pathlib import Path

from ..checkpoints.test_gpt_oss_model import saved_gpt_oss
from ..mxfp4_checkpoints import gpt_oss_release
from .test_transformers_int4 import assert_served_from_the_files


def test_gpt_oss_experts_run_on_the_files_mxfp4_values(tmp_path: Path) -> None:
    saved_gpt_oss(tmp_path / "model")
    gpt_oss_release(tmp_path / "model", tmp_path / "release")
    packed, file_bytes = assert_served_from_the_files(tmp_path / "release", "mxfp4", 32)
    assert packed == file_bytes  # exactly the file's codes and scales

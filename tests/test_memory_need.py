"""The memory a pair needs, known before download: from the Hub's metadata (a fake `HfApi`, no
network) or from local safetensors headers, and a clear refusal when the GPU is too small."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import save_file

from dflash_core.errors import CheckpointError, DoesNotFitError
from dflash_core.loading.memory_need import MARGIN, PairSize, WeightSize, check_fits, local_weight_size, pair_size

GB = 2**30


class FakeApi:
    """`HfApi.model_info` from a table: repo id -> (parameters per dtype, config), or an exception."""

    def __init__(self, table):
        self.table, self.calls = table, []

    def model_info(self, repo_id, expand=None, timeout=None):
        self.calls.append((repo_id, tuple(expand or ())))
        entry = self.table[repo_id]
        if isinstance(entry, BaseException):
            raise entry
        counts, config = entry
        return SimpleNamespace(safetensors=SimpleNamespace(parameters=counts, total=sum(counts.values())), config=config)


def not_found(repo_id):
    from huggingface_hub.errors import RepositoryNotFoundError

    response = SimpleNamespace(headers={}, request=None)
    return RepositoryNotFoundError(f"404 Client Error. Repository Not Found for url: .../{repo_id}", response=response)


def test_hub_metadata_counts_floats_at_the_load_dtype_and_mxfp4_packs_dequantized():
    api = FakeApi({
        "org/target": ({"BF16": 8 * GB}, {"model_type": "qwen3_5"}),
        "org/gpt-oss": ({"BF16": 2 * GB, "U8": 6 * GB}, {"quantization_config": {"quant_method": "mxfp4"}}),
        "org/drafter": ({"BF16": GB // 2}, {}),
    })
    size = pair_size("org/target", "org/drafter", 2, api)
    assert size.target.bytes == 16 * GB and size.drafter.bytes == GB and size.need == int(17 * GB * (1 + MARGIN))
    assert api.calls[0] == ("org/target", ("safetensors", "config"))
    assert "weights 17.0 GB (target 16.0 GB + drafter 1.00 GB, from the Hub's metadata)" in size.describe()
    # float32 doubles a bf16 checkpoint; each MXFP4 byte holds two values, dequantized to bf16.
    assert pair_size("org/target", "org/drafter", 4, api).weights == 34 * GB
    assert pair_size("org/gpt-oss", "org/drafter", 2, api).target.bytes == (2 + 12) * 2 * GB


def test_a_gpu_too_small_is_refused_with_the_need_and_the_free_memory():
    api = FakeApi({"org/target": ({"BF16": 30 * GB}, {}), "org/drafter": ({"BF16": GB}, {})})
    size = pair_size("org/target", "org/drafter", 2, api)
    with pytest.raises(DoesNotFitError) as refused:
        check_fits(size, "Big pair", "cuda:0", free=20 * GB, total=24 * GB)
    message = str(refused.value)
    assert message.startswith("Big pair needs about 77.5 GB on cuda:0 (weights 62.0 GB")
    assert "cuda:0 has 20.0 GB free of 24.0 GB" in message and "too small" in message
    assert "not at fault" in message and "Nothing was downloaded" in message
    check_fits(size, "Big pair", "cuda:0", free=80 * GB, total=141 * GB)  # fits: no error
    check_fits(size, "Big pair", "cuda:0", free=40 * GB, total=141 * GB, reclaimable=40 * GB)  # once others go


def test_an_unreachable_hub_leaves_the_size_unknown_and_blocks_nothing():
    api = FakeApi({"org/target": ConnectionError("[Errno -3] Temporary failure in name resolution"),
                   "org/drafter": ({"BF16": GB}, {})})
    size = pair_size("org/target", "org/drafter", 2, api)
    assert size.need is None
    assert size.describe() == (
        "size unknown before download: the Hub could not be reached for org/target (ConnectionError: "
        "[Errno -3] Temporary failure in name resolution); loading without the memory check"
    )
    check_fits(size, "pair", "cuda:0", free=1, total=2)  # unknown: not refused


def test_a_repository_that_does_not_exist_is_a_broken_pair():
    api = FakeApi({"org/typo": not_found("org/typo"), "org/drafter": ({"BF16": GB}, {})})
    with pytest.raises(CheckpointError, match="'org/typo' is not a model repository on the Hugging Face Hub"):
        pair_size("org/typo", "org/drafter", 2, api)


def test_a_local_directory_is_counted_from_its_safetensors_headers(tmp_path):
    target, drafter = tmp_path / "target", tmp_path / "drafter"
    target.mkdir(), drafter.mkdir()
    # Two shards: 300 bf16 values and 7 int64 ids in one, 100 float32 values in the other.
    save_file({"a": torch.zeros(10, 30, dtype=torch.bfloat16), "ids": torch.zeros(7, dtype=torch.int64)},
              str(target / "model-00001-of-00002.safetensors"))
    save_file({"b": torch.zeros(100)}, str(target / "model-00002-of-00002.safetensors"))
    (target / "config.json").write_text(json.dumps({"model_type": "llama"}))
    save_file({"w": torch.zeros(4, 4, dtype=torch.bfloat16)}, str(drafter / "model.safetensors"))
    assert local_weight_size(target, 4).bytes == 400 * 4 + 7 * 8  # floats at float32, ints as stored
    assert local_weight_size(target, 2).bytes == 400 * 2 + 7 * 8
    size = pair_size(str(target), str(drafter), 2)
    assert size.weights == 856 + 32 and "from the safetensors files" in size.describe()
    empty = tmp_path / "empty"
    empty.mkdir()
    assert local_weight_size(empty, 2).unknown == f"{empty} has no safetensors files"


def test_an_unknown_part_makes_the_pair_unknown():
    size = PairSize(WeightSize("t", 10), WeightSize("d", None, unknown="d is gated on the Hub (401)"))
    assert size.weights is None and "d is gated on the Hub (401)" in size.describe()

import json
import os

import pytest

from cbop_torchrl.io import atomic_json_dump, atomic_write, config_hash
from cbop_torchrl.runtime import resolve_device


def test_atomic_write_keeps_the_old_file_when_the_writer_fails(tmp_path):
    target = tmp_path / "results.json"
    atomic_json_dump({"score": 1.0}, target)

    def broken_writer(tmp):
        tmp.write_text("{partial")
        raise RuntimeError("killed mid-write")

    with pytest.raises(RuntimeError):
        atomic_write(target, broken_writer)
    assert json.loads(target.read_text()) == {"score": 1.0}
    assert [p.name for p in tmp_path.iterdir()] == ["results.json"]


def test_atomic_write_gives_umask_permissions_not_mkstemp_0600(tmp_path):
    old = os.umask(0o022)
    try:
        path = atomic_json_dump({}, tmp_path / "out.json")
    finally:
        os.umask(old)
    assert path.stat().st_mode & 0o777 == 0o644


def test_config_hash_ignores_key_order_but_not_values():
    assert config_hash({"a": 1, "b": 2}) == config_hash({"b": 2, "a": 1})
    assert config_hash({"a": 1}) != config_hash({"a": 2})


def test_cuda_request_without_gpu_is_explained():
    import torch

    if torch.cuda.is_available():
        assert resolve_device("cuda").type == "cuda"
    else:
        with pytest.raises(RuntimeError, match="device=cpu or device=auto"):
            resolve_device("cuda")
    assert resolve_device("cpu").type == "cpu"

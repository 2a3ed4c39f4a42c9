"""Where models run: the device a run asks for, and a process's place under torchrun."""

import pytest
import torch

from minixl.device import resolve_device


def test_devices():
    assert resolve_device("cpu").type == "cpu"
    assert resolve_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")
    with pytest.raises(ValueError, match="unknown device 'tpu'"):
        resolve_device("tpu")
    if not torch.cuda.is_available():
        for name in ("cuda", "cuda:0"):
            with pytest.raises(ValueError, match="sees no CUDA GPU"):
                resolve_device(name)


def test_the_place_of_a_process_comes_from_torchruns_environment(monkeypatch):
    from minixl.device import distributed_env, training_device
    for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    assert distributed_env() == (0, 0, 1) and training_device("cpu").type == "cpu"
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert distributed_env() == (3, 1, 4)
    assert training_device("cpu") == torch.device("cpu")  # gloo: every process on the CPU
    monkeypatch.setenv("RANK", "4")
    with pytest.raises(ValueError, match="need 0 <= RANK < WORLD_SIZE"):
        distributed_env()
    monkeypatch.setenv("WORLD_SIZE", "two")
    with pytest.raises(ValueError, match="WORLD_SIZE, RANK and LOCAL_RANK must be integers"):
        distributed_env()

"""giga_train.utils (GigaTrain's helpers), module_auto_wrap_policy and ssh_copy_id."""
import os
import re
import sys

import numpy as np
import pytest
import torch

from giga_train import module_auto_wrap_policy, ssh_copy_id, utils


def test_conversions_through_nested_containers():
    data = {"a": np.arange(3), "b": [1.5, np.ones(2)], "c": (1, 2)}
    t = utils.to_tensor(data)
    assert t is data and isinstance(t["a"], torch.Tensor) and isinstance(t["b"][1], torch.Tensor)
    assert t["c"].tolist() == [1, 2]
    n = utils.to_numpy({"x": torch.ones(2), "y": [3]})
    assert isinstance(n["x"], np.ndarray) and isinstance(n["y"][0], np.ndarray)
    d = utils.to_dtype({"x": torch.ones(2), "z": "keep"}, torch.float16)
    assert d["x"].dtype == torch.float16 and d["z"] == "keep"
    assert utils.to_dtype([np.ones(1)], np.float16)[0].dtype == np.float16
    assert utils.to_cpu([torch.ones(1), "s"])[1] == "s"
    assert utils.to_list(torch.tensor([1, 2])) == [1, 2] and utils.to_list((1,)) == [1]
    assert utils.as_list(3) == [3] and utils.as_list((3,)) == [3]


def test_import_function_time_and_memory():
    assert utils.import_function("os.path.join") is os.path.join
    assert utils.import_function("os/path/join", "/") is os.path.join
    assert re.fullmatch(r"\d{4}-\d{2}-\d{2}-\d{6}", utils.get_cur_time())
    assert re.fullmatch(r"\d+\.\d\d/\d+\.\d\d MB", utils.get_cpu_memory("MB"))


def test_wait_for_gpu_memory(monkeypatch, capsys):
    from giga_train.compat import utils as helpers  # giga_train.utils re-exports it: the lookups happen here
    frees = iter([1, 1, 8])
    monkeypatch.setattr(helpers, "_gpu_memory", lambda gpu: (8 * 2**30, 0, next(frees) * 2**30))
    monkeypatch.setattr(helpers.time, "sleep", lambda s: None)
    utils.wait_for_gpu_memory([0], 4, seconds=0)
    assert capsys.readouterr().out.count("Wait For GPU Memory: 4.00GB") == 2
    monkeypatch.setattr(helpers, "_gpu_memory", lambda gpu: (8, 0, 0))
    with pytest.raises(TimeoutError):
        utils.wait_for_gpu_memory([0, 1], 1, unit="B", seconds=0, count_limit=2)


def test_logger_and_environment(tmp_path, monkeypatch):
    path = tmp_path / "logs" / "train.log"
    logger = utils.create_logger(str(path))
    logger.info("hello")
    for handler in logger.handlers:
        handler.flush()
    assert "hello" in path.read_text()
    logger.handlers = []
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.setenv("PYTHONPATH", "/x")
    utils.setup_environment()
    assert sys.path[0] == str(tmp_path) and os.environ["PYTHONPATH"] == f"/x:{tmp_path}"


def test_state_dict_files_and_folders(tmp_path):
    state = {"w": torch.arange(4.0), "b": torch.ones(2)}
    utils.save_state_dict(state, str(tmp_path / "m" / "diffusion_pytorch_model.safetensors"))
    assert torch.equal(utils.load_state_dict(str(tmp_path / "m"))["w"], state["w"])
    utils.save_state_dict(state, str(tmp_path / "p" / "weights.bin"))
    assert torch.equal(utils.load_state_dict(str(tmp_path / "p"))["b"], state["b"])  # its one weights file
    with pytest.raises(FileNotFoundError):
        utils.load_state_dict(str(tmp_path / "absent"))


def test_module_auto_wrap_policy_counts_per_class():
    class Block(torch.nn.Linear):
        pass

    model = torch.nn.Sequential(*[Block(2, 2) for _ in range(3)], torch.nn.Linear(2, 2))
    policy = module_auto_wrap_policy(["Block__##__2", "Linear"])
    assert policy(model, True, 0) is True
    assert [policy(m, False, 0) for m in model] == [True, True, False, True]
    with pytest.raises(ValueError):
        module_auto_wrap_policy(["Block__##__x"])
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import apply_activation_checkpointing
    apply_activation_checkpointing(model, auto_wrap_policy=module_auto_wrap_policy(["Block__##__1"]))
    assert sum("CheckpointWrapper" in type(m).__name__ for m in model) == 1


class FakeStream:
    def __init__(self, text, status=0):
        self.text, self.channel = text, type("Channel", (), {"recv_exit_status": lambda s: status})()

    def read(self):
        return self.text.encode()


class FakeClient:
    def __init__(self, ip):
        self.ip, self.commands, self.closed = ip, [], False

    def exec_command(self, command):
        self.commands.append(command)
        out = f"ssh-rsa KEY{self.ip[-1]} root@{self.ip}\n" if command.endswith("cat ~/.ssh/id_rsa.pub") else ""
        return None, FakeStream(out), FakeStream("")

    def close(self):
        self.closed = True


def test_ssh_copy_id_authorizes_every_key_everywhere(monkeypatch):
    import giga_train.compat.ssh as ssh
    clients = {}
    monkeypatch.setattr(ssh, "_connect", lambda ip, user, password, port: clients.setdefault(ip, FakeClient(ip)))
    ssh_copy_id(["10.0.0.1", "10.0.0.2"], "root", "secret", 22)
    for client in clients.values():
        added = " ".join(client.commands[1:])
        assert "KEY1" in added and "KEY2" in added and "ssh-keyscan -p 22 10.0.0.2" in added
        assert client.closed


def test_ssh_copy_id_needs_paramiko_only_when_called(monkeypatch):
    monkeypatch.setitem(sys.modules, "paramiko", None)
    with pytest.raises(ImportError, match="pip install paramiko"):
        ssh_copy_id(["10.0.0.1"], "root", "pw", 22)

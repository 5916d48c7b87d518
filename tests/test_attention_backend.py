"""train.attention_backend pins SDPA's kernel for the run's forward and backward (torch's sdpa_kernel)."""
import pytest
import torch

from giga_train.engine.attention import attention_backend


def attention(q, k, v):
    out = torch.nn.functional.scaled_dot_product_attention(q, k, v)
    out.sum().backward()
    return out.detach(), q.grad.clone()


def test_a_pinned_backend_is_the_one_used_and_math_equals_the_default():
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 40, 16, requires_grad=True) for _ in range(3))
    want = attention(q, k, v)
    q.grad = None
    with attention_backend("math"):
        got = attention(q, k, v)
    assert all(torch.allclose(a, b, atol=1e-5) for a, b in zip(got, want))
    with attention_backend(None):
        attention(q, k, v)
    with pytest.raises(RuntimeError), attention_backend("efficient"):  # not built for CPU: refused, not ignored
        attention(q.detach().requires_grad_(), k, v)


def test_the_trainer_runs_under_the_backend_and_check_refuses_an_unknown_one(tmp_path, capsys):
    pytest.importorskip("diffusers")
    from examples.wan.scripts import build_dataset
    from giga_train.cli import main as cli
    data = tmp_path / "data"
    assert build_dataset.main(["--synthetic", "4", "--out", str(data), "--latent-shape", "4,1,8,8",
                               "--text-shape", "16,32"]) == 0
    sets = [f"project_dir={tmp_path}", f"dataloaders.train.data_or_config.root={data}", "train.max_steps=1",
            "train.log_with='none'", "train.progress_bar=False", "train.resume=False"]
    args = ["train", "examples/wan/configs/tiny_cpu.py", *[x for s in sets for x in ("--set", s)]]
    with pytest.raises(RuntimeError, match="scaled_dot_product_attention|No available kernel"):  # the Wan's attention ran under it
        cli(args + ["--set", "train.attention_backend='efficient'"])
    assert cli(args + ["--set", "train.attention_backend='math'"]) == 0
    assert cli(["check", "examples/wan/configs/tiny_cpu.py", "--set", "train.attention_backend='flsh'"]) == 2
    assert "train.attention_backend: 'flsh' is not one of 'flash', 'cudnn', 'efficient', 'math'" \
        in capsys.readouterr().err

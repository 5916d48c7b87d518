"""activation_checkpointing='auto': the number of blocks checkpointed follows train.checkpointing_memory_budget
(none, some, all), from plan's activation count of the tiny Wan; the gradients (here the losses and weights of
a few real steps) equal those without checkpointing."""
import pytest
import torch

pytest.importorskip("diffusers")

from examples.wan.scripts import build_dataset  # noqa: E402
from giga_train.cli import main as cli  # noqa: E402
from giga_train.tools.offline import offline_trainer  # noqa: E402
from giga_train.trainers.activation_budget import auto_checkpointing  # noqa: E402
from giga_train.trainers.memory_counts import count_activations  # noqa: E402

TINY = "examples/wan/configs/tiny_cpu.py"
BLOCKS = 4


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    out = tmp_path_factory.mktemp("wan") / "data"
    assert build_dataset.main(["--synthetic", "8", "--out", str(out), "--latent-shape", "4,3,8,8",
                               "--text-shape", "16,32"]) == 0
    return out


def overrides(project, data, **train):
    sets = [f"project_dir={project}", f"dataloaders.train.data_or_config.root={data}",
            f"models.transformer.num_layers={BLOCKS}", "train.log_with='none'", "train.progress_bar=False",
            "train.checkpoint_interval=None", "train.checkpoint_total_limit=None", "train.resume=False"]
    return sets + [f"train.{k}={v!r}" for k, v in train.items()]


def test_blocks_checkpointed_follow_the_budget(tmp_path, data):
    from giga_train.trainers.offline_copy import build as _build, offline_copy
    from torch._subclasses.fake_tensor import FakeTensorMode
    trainer = offline_trainer(TINY, overrides(tmp_path, data, activation_checkpointing="auto"), device="cpu")
    trainer.print = lambda *a: None
    model = _build(trainer, torch.device("cpu"))
    shadow = offline_copy(trainer, "cpu")
    count = count_activations(shadow, lambda mode: _build(shadow, mode), FakeTensorMode(allow_non_fake_inputs=True))
    assert count.blocks == BLOCKS and count.with_first_checkpointed(BLOCKS) == count.checkpointed
    assert count.with_first_checkpointed(0) == count.saved
    # accumulating 2 micro-batches: peak = states + gradients + the most activations backward holds (the
    # recomputed block among them); each further block checkpointed holds less
    sizes = [count.backward_peak(n, 0, accumulation=2) for n in range(BLOCKS + 1)]
    assert sizes[2] > sizes[3] > sizes[4]
    assert sizes[4] > count.checkpointed - count.largest_block  # more than what the forward keeps
    limits, reason = auto_checkpointing(trainer, model, f"{(sizes[0] + 2**20) / 2**20:.3f}MiB")
    assert limits == {} and reason.startswith(f"activation checkpointing 'auto': 0 of {BLOCKS} blocks") \
        and "within" in reason
    states_and_grads = _planned(reason) - sizes[0]  # accumulating: peak = states + gradients + activations
    between = f"{(states_and_grads + (sizes[2] + sizes[3]) / 2) / 2**20:.4f}MiB"  # fits with 3, not with 2
    limits, reason = auto_checkpointing(trainer, model, between)
    assert limits == {"WanTransformerBlock": 3} and f"3 of {BLOCKS} blocks" in reason and "within" in reason
    limits, reason = auto_checkpointing(trainer, model, "0.01MiB")
    assert limits == {"WanTransformerBlock": BLOCKS} and "ABOVE the budget" in reason


def test_auto_under_compile_counts_the_compiled_blocks(tmp_path, data):
    """Under train.dynamo_config (inductor) the blocks are counted as inductor's partitioner saves them, less
    than eager autograd saves: a budget the compiled job fits without checkpointing checkpoints none of its
    blocks, where the eager job needs some."""
    from giga_train.trainers.offline_copy import build as _build

    def auto(budget, **train):
        trainer = offline_trainer(TINY, overrides(tmp_path, data, activation_checkpointing="auto", **train),
                                  device="cpu")
        return auto_checkpointing(trainer, _build(trainer, torch.device("cpu")), budget)
    compiled, reason = auto("1GiB", dynamo_config=dict(backend="inductor"))
    assert compiled == {} and "the compiled blocks counted as inductor saves them" in reason
    eager, eager_reason = auto("1GiB")
    assert eager == {} and _planned(reason) < _planned(eager_reason)
    between = f"{(_planned(reason) + _planned(eager_reason)) / 2 / 2**20:.4f}MiB"
    limits, reason = auto(between)
    assert 0 < limits.get("WanTransformerBlock", 0) and "within" in reason


def _planned(reason):
    """The planned peak in bytes from the log line ('planned peak 2.66 MiB')."""
    value = float(reason.split("planned peak ")[1].split(" ")[0])
    return value * (2**30 if reason.split("planned peak ")[1].split(" ")[1].startswith("GiB") else 2**20)


def run(project, data, **train):
    """(the micro-batch losses, the final weights, the lines of train.log) of 3 steps of the tiny Wan."""
    from safetensors.torch import load_file
    from tests.test_wan import RecordingWanTrainer
    RecordingWanTrainer.losses = []
    rc = cli(["train", TINY, "--set", "runners=['tests.test_wan.RecordingWanTrainer']", "--set",
              "train.max_steps=3", *[x for s in overrides(project, data, **train) for x in ("--set", s)]])
    assert rc == 0
    folder = next((project / "models").glob("checkpoint_*")) / "model"
    log = (project / "logs" / "train.log").read_text().splitlines()
    return list(RecordingWanTrainer.losses), load_file(str(folder / "diffusion_pytorch_model.safetensors")), log


def test_auto_checkpointing_trains_as_without_checkpointing(tmp_path, data):
    plain_losses, plain, _ = run(tmp_path / "plain", data, activation_checkpointing=False)
    auto_losses, auto, log = run(tmp_path / "auto", data, activation_checkpointing="auto",
                                 checkpointing_memory_budget="0.01MiB")  # every block
    lines = [line for line in log if "activation checkpointing 'auto'" in line]
    assert len(lines) == 1 and f"{BLOCKS} of {BLOCKS} blocks checkpointed" in lines[0]
    assert auto_losses == pytest.approx(plain_losses, rel=1e-6, abs=1e-7)
    for name, want in plain.items():
        assert torch.allclose(auto[name], want, rtol=1e-5, atol=1e-6), name


def test_bad_budget_and_value_are_one_line(tmp_path, data, capsys):
    for key, value, message in (("activation_checkpointing", "'sometimes'", "is not one of False, True, 'auto'"),
                                ("checkpointing_memory_budget", "60", "neither a fraction"),
                                ("checkpointing_memory_budget", "'60GB'", "only used with")):
        rc = cli(["check", TINY, "--set", f"train.{key}={value}"])
        assert rc == 2 and message in capsys.readouterr().err


def test_selective_checkpointing_recomputes_no_matmul_and_keeps_the_gradients():
    """'selective': the blocks' matmul outputs are kept, so backward runs exactly the matmuls it runs without
    checkpointing (full checkpointing runs the blocks' forward matmuls again); the gradients are equal."""
    from diffusers import WanTransformer3DModel
    from torch.utils._python_dispatch import TorchDispatchMode

    from giga_train.config import load_config
    from giga_train.engine.activation_checkpointing import apply_activation_checkpointing

    class CountMatmuls(TorchDispatchMode):
        calls = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func in (torch.ops.aten.mm.default, torch.ops.aten.addmm.default, torch.ops.aten.bmm.default):
                CountMatmuls.calls += 1
            return func(*args, **(kwargs or {}))

    arch = dict(load_config(TINY).models.transformer)
    g = torch.Generator().manual_seed(1)
    latents, text, target = torch.randn(2, 4, 3, 8, 8, generator=g), torch.randn(2, 16, 32, generator=g), \
        torch.randn(2, 4, 3, 8, 8, generator=g)

    def grads(mode):
        torch.manual_seed(0)
        model = WanTransformer3DModel(**arch)
        if mode:
            assert apply_activation_checkpointing(model, ["WanTransformerBlock"], selective=mode == "selective") == 2
        out = model(hidden_states=latents, timestep=torch.tensor([500.0, 100.0]), encoder_hidden_states=text,
                    return_dict=False)[0]
        loss = torch.nn.functional.mse_loss(out, target)
        CountMatmuls.calls = 0
        with CountMatmuls():
            loss.backward()
        return {n: p.grad for n, p in model.named_parameters()}, CountMatmuls.calls

    plain, plain_calls = grads(None)
    full, full_calls = grads("full")
    selective, selective_calls = grads("selective")
    assert selective_calls == plain_calls < full_calls
    for name, want in plain.items():
        assert torch.allclose(selective[name], want, rtol=1e-5, atol=1e-7), name
        assert torch.allclose(full[name], want, rtol=1e-5, atol=1e-7), name


def test_plan_shows_the_activations_auto_leaves_on_each_row(tmp_path, data):
    from giga_train.tools.plan import plan
    sets = overrides(tmp_path, data, activation_checkpointing="auto")
    act = plan(TINY, sets, gpus=(1,), card="1GiB")["activations"]["torch"]
    roomy = plan(TINY, sets, gpus=(1,), card="1GiB")["rows"][0]
    assert roomy["strategy"] == "NO" and roomy["activations"] == act["saved"]  # nothing checkpointed
    tight = plan(TINY, sets, gpus=(1,), card="0.0001GiB")["rows"][0]
    assert tight["activations"] == act["checkpointed"] and tight["fits"] is False  # every block, still too big

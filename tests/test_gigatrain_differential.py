"""The same tiny GigaTrain client project (tests/reference/ref_client: a Trainer over two models in a
ModuleDict with per-sample losses, WarmupCosine, extra train keys) run by the real GigaTrain 1.1.0 (its own
venv, built from the registry) and by giga-train, compared number by number.

Exact: the lr of every step, the samples of every micro-batch, the scalar properties, the checkpoint folder
names and their model layout (member folders, config.json, `<name>_ema/`, which checkpoints keep optimizer
state); GigaTrain's own Trainer.load_checkpoint reads our model folders. Within 1e-5 relative: the losses (the two venvs run different torch builds, 2.14.1 and 2.13.0; on
this CPU they have agreed to the last bit). The hook sequence is GigaTrain's up to the differences listed in
DIFFERENT_HOOKS (and in docs/GIGATRAIN.md's table)."""
import os
import re

import pytest

from tests.reference import harness

# (hook, why ours differs). set_ema_models: after the optimizers (the EMA is kept on the sharded weights).
# At a save GigaTrain's Accelerate calls remove_checkpoint (before writing) and save_model_hook; ours rotates
# after the folder is complete and writes the model itself. Its resume calls get_checkpoint and
# load_model_hook inside Accelerate's load_state; ours reads the verified checkpoint through the Checkpointer.
DIFFERENT_HOOKS = {"set_ema_models", "remove_checkpoint", "save_model_hook", "load_model_hook", "get_checkpoint"}
LOSS_TAGS = ("total_loss", "mse", "aux")


@pytest.fixture(scope="module")
def ours(tmp_path_factory):
    import sys
    work = tmp_path_factory.mktemp("gigatrain-ours")
    docs = {s: harness.record(s, work, python=sys.executable) for s in ("main", "resume", "epochs_ema")}
    for s, doc in docs.items():
        doc["workdir"] = os.path.join(str(work), s)
    return docs


def trainer_runs(doc):
    return [r for phase in doc["phases"] for r in phase["runners"] if r["runner"].endswith("Trainer")]


def hooks(run):
    return [h for h in harness.hook_sequence(run) if h[1] not in DIFFERENT_HOOKS]


@pytest.mark.parametrize("scenario", ["main", "resume"])
def test_lr_samples_and_losses_per_step(reference_docs, ours, scenario):
    for ref, got in zip(trainer_runs(reference_docs[scenario]), trainer_runs(ours[scenario]), strict=True):
        assert [s["step"] for s in got["steps"]] == [s["step"] for s in ref["steps"]]
        assert [s["lr"] for s in got["steps"]] == [s["lr"] for s in ref["steps"]]  # exactly
        assert [[m["indices"] for m in s["micro_batches"]] for s in got["steps"]] == \
            [[m["indices"] for m in s["micro_batches"]] for s in ref["steps"]]
        for key in ("total_loss", "losses"):
            expected = [[m[key] for m in s["micro_batches"]] for s in ref["steps"]]
            actual = [[m[key] for m in s["micro_batches"]] for s in got["steps"]]
            assert not harness.diff(expected, actual, rtol=1e-5, atol=1e-7), harness.diff(expected, actual)


@pytest.mark.parametrize("scenario", ["main", "resume"])
def test_hook_sequence_and_properties(reference_docs, ours, scenario):
    for ref, got in zip(trainer_runs(reference_docs[scenario]), trainer_runs(ours[scenario]), strict=True):
        assert hooks(got) == hooks(ref)
        names = [h for _, h, _ in harness.hook_sequence(got)]
        assert names.index("set_ema_models") == names.index("get_optimizers") + 1  # the one reordering
        for when in ("after_load", "after_run"):
            scalars = {k: v for k, v in ref["properties"][when].items() if isinstance(v, harness.SCALAR)}
            assert {k: got["properties"][when].get(k) for k in scalars} == scalars, when
        assert {k: v for k, v in got["properties"]["after_run"]["kwargs"].items()} == \
            ref["properties"]["after_run"]["kwargs"]  # extra train keys, as GigaTrain's self.kwargs


def test_logged_losses_and_checkpoint_names(reference_docs, ours):
    ref, got = reference_docs["main"]["phases"][0], ours["main"]["phases"][0]
    for tag in LOSS_TAGS:  # GigaTrain logs the losses only (ours adds lr, grad norm, timing under train/)
        expected, actual = ref["logged"][tag], got["logged"][f"train/{tag}"]
        assert not harness.diff(expected, actual, rtol=1e-5, atol=1e-7), (tag, harness.diff(expected, actual))
    folders = re.compile(r"^models/(checkpoint_epoch_\d+_step_\d+)/$")
    names = [sorted(m.group(1) for p in phase["tree"] for m in [folders.match(p)] if m) for phase in (ref, got)]
    assert names[1] == names[0]  # GigaTrain's names and rolling limit (checkpoint_total_limit=2)


def test_every_runner_runs_and_the_tester_scores_as_gigatrains(reference_docs, ours):
    """The client's Tester loads `<checkpoint>/encoder/` and `head/` (GigaTrain's per-model folders) with
    giga_train.utils.load_state_dict: it runs on our checkpoints and scores the test set as on GigaTrain's."""
    failed = [(doc["scenario"], phase["error"]) for doc in ours.values() for phase in doc["phases"] if not phase["ok"]]
    assert not failed, failed
    for scenario in ("main", "resume"):
        testers = [[r["results"] for p in doc["phases"] for r in p["runners"] if r["runner"].endswith("Tester")]
                   for doc in (reference_docs[scenario], ours[scenario])]
        assert len(testers[0]) == len(testers[1]) == 1 and len(testers[0][0]) == 10  # the 10 test samples
        assert not harness.diff(testers[0], testers[1], rtol=1e-5, atol=1e-7), harness.diff(testers[0], testers[1])


# Files of the model layout (GigaTrain's save_model_hook, and Accelerate's model.safetensors with EMA); the
# rest of a checkpoint is each engine's own (Accelerate's optimizer.bin, scheduler.bin, *.pkl; our meta.json,
# optimizer_dcp/, training_state.pt, random_states_*.pt).
MODEL_LAYOUT = re.compile(r"^models/(checkpoint_epoch_\d+_step_\d+)/(\w+/(config\.json|diffusion_pytorch_model\."
                          r"safetensors)|ema_config\.json|model\.safetensors)$")
OPTIMIZER_STATE = {"optimizer.bin", "optimizer_dcp/"}  # Accelerate's, ours


def model_layout(tree):
    """{checkpoint: sorted model-layout paths}, weights as safetensors: GigaTrain's default is pickled .bin,
    ours safetensors unless checkpoint_safe_serialization=False (docs/GIGATRAIN.md, Coming from GigaTrain)."""
    found = {}
    for path in tree:
        m = MODEL_LAYOUT.match(path.replace(".bin", ".safetensors"))
        if m:
            found.setdefault(m.group(1), []).append(m.group(2))
    return {name: sorted(paths) for name, paths in found.items()}


def with_optimizer_state(tree):
    return sorted({p.split("/")[1] for p in tree if p.startswith("models/checkpoint")
                   and p.split("/", 2)[2] in OPTIMIZER_STATE})


@pytest.mark.parametrize("scenario", ["main", "resume", "epochs_ema"])
def test_checkpoint_model_layout_is_gigatraines(reference_docs, ours, scenario):
    """The member folders (config.json + weights), `<name>_ema/`, ema_config.json and, with EMA, the live
    weights in model.safetensors at the root: GigaTrain's tree, checkpoint by checkpoint; by epochs with
    checkpoint_save_optimizer=False and keeps [1] (epochs_ema) the same checkpoints keep optimizer state."""
    ref, got = reference_docs[scenario]["phases"][-1]["tree"], ours[scenario]["phases"][-1]["tree"]
    assert model_layout(got) == model_layout(ref) and model_layout(ref)
    assert with_optimizer_state(got) == with_optimizer_state(ref)
    if scenario == "main":
        assert "models/checkpoint_epoch_2_step_8/encoder/diffusion_pytorch_model.safetensors" in got


LOAD_WITH_GIGATRAIN = """
import sys
sys.path.insert(0, {reference!r})  # ref_client's models; never the repository root (our giga_train)
from safetensors.torch import save_file
from giga_train import Trainer
from ref_client.models import Encoder, Head
trainer = Trainer(project_dir={project!r}, max_steps=1)
encoder, head = Encoder(in_dim=4, hidden=8), Head(hidden=8)
trainer.load_checkpoint([{checkpoint!r} + '/encoder', {checkpoint!r} + '/head'], [head, encoder])
state = {{'encoder.' + k: v for k, v in encoder.state_dict().items()}}
state.update({{'head.' + k: v for k, v in head.state_dict().items()}})
save_file(state, {out!r})
"""


def test_gigatrains_load_checkpoint_reads_our_model_folders(ours, tmp_path):
    """A later stage of a GigaTrain project (the real GigaTrain 1.1.0's Trainer.load_checkpoint) starting
    from the model folders our run wrote: it finds each folder's class and loads our weights exactly."""
    import subprocess

    import torch
    from safetensors.torch import load_file

    from giga_train.checkpoint import list_checkpoints, read_weights
    project = os.path.join(ours["main"]["workdir"], "project")
    checkpoint = list_checkpoints(os.path.join(project, "models"))[-1][1]
    out = str(tmp_path / "loaded.safetensors")
    script = LOAD_WITH_GIGATRAIN.format(reference=os.path.dirname(harness.RECORD), project=str(tmp_path / "p"),
                                        checkpoint=checkpoint, out=out)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "MASTER_ADDR", "MASTER_PORT")}
    run = subprocess.run([harness.reference_python(), "-c", script], cwd=str(tmp_path), env=env,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    loaded, saved = load_file(out), read_weights(checkpoint)
    assert loaded.keys() == saved.keys() and all(torch.equal(loaded[k], saved[k]) for k in saved)

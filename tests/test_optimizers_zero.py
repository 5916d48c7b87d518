"""CAME8Bit on ZeRO-style flat partitions equals one process.

Optimizer level (no DeepSpeed, gloo ranks): the same gradients, the parameters flattened and cut as
ZeRO-1/2 cut them (one flat buffer per group in equal parts, weights cut anywhere) and as ZeRO-3 cuts
them (each weight in equal parts), at 2 and 4 ranks, against CAME8Bit on the whole tensors in one
process, with tests/test_optimizers_fsdp.py's tolerance.

Trainer level (DeepSpeed's own engine, the tiny char-LM, 4 steps, gloo ranks): ZeRO-1/2/3 at 2 ranks
and ZeRO-2/3 at 4 equal one process on the same global batch with that tolerance; a resume is exact;
checkpoints move between ZeRO and the other strategies (by parameter name); bf16 trains."""
import math
import os
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from giga_train.optimizers import CAME8Bit
from giga_train.optimizers.came_zero import layouts_of, full_state_from_pieces
from tests.test_optimizers_fsdp import assert_close_up_to_code_flips

STEPS = 4
OPT_ARGS = dict(lr=1e-2, weight_decay=0.1, block_size=256, min_8bit_size=1024)
SHAPES = {"a": (64, 128), "b": (33,), "c": (128, 64), "d": (8, 3, 5, 7), "e": (24, 16, 1, 1), "f": (40, 50),
          "g": (64,)}


def initial():
    gen = torch.Generator().manual_seed(0)
    return {k: torch.randn(s, generator=gen) * 0.1 for k, s in SHAPES.items()}


def grads(step):
    gen = torch.Generator().manual_seed(100 + step)
    # heavy-tailed rows, as CAME sees them; a zero row
    out = {}
    for k, s in SHAPES.items():
        g = torch.randn(s, generator=gen)
        if len(s) >= 2:
            g = g * torch.logspace(-2, 1, s[0]).view(-1, *([1] * (len(s) - 1)))
            g[1] = 0.0
        out[k] = g
    return out


def one_process(steps):
    params = {k: torch.nn.Parameter(v.clone()) for k, v in initial().items()}
    opt = CAME8Bit(list(params.values()), **OPT_ARGS)
    for step in range(steps):
        for k, g in grads(step).items():
            params[k].grad = g
        opt.step()
    return {k: p.detach() for k, p in params.items()}, {k: opt.state[p] for k, p in params.items()}


def _layout(style, rank, world):
    """This rank's pieces, as DeepSpeed lays them out: [(name, shape, flat offset, start, numel)] and
    the flat partition's size."""
    entries = []
    if style == "zero12":  # the group flattened in order, padded, cut in equal partitions
        total = sum(math.prod(s) for s in SHAPES.values())
        part = -(-total // world)
        lo, hi = rank * part, (rank + 1) * part
        off = 0
        for name, shape in SHAPES.items():
            n = math.prod(shape)
            a, b = max(lo, off), min(hi, off + n)
            if a < b:
                entries.append((name, shape, a - lo, a - off, b - a))
            off += n
        return entries, part
    off = 0  # zero3: every weight cut in equal parts, the rank's parts side by side
    for name, shape in SHAPES.items():
        n = math.prod(shape)
        pn = -(-n // world)
        start = rank * pn
        numel = max(0, min(pn, n - start))
        if numel:
            entries.append((name, shape, off, start, numel))
        off += pn
    return entries, off


def _worker(rank, world, port, styles, out_path):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        results = {}
        for style in styles:  # one process group for every style: each run is independent of the others
            entries, size = _layout(style, rank, world)
            flat = torch.nn.Parameter(torch.zeros(size))
            full = initial()
            for name, shape, off, start, numel in entries:
                flat.data[off:off + numel] = full[name].reshape(-1)[start:start + numel]
            opt = CAME8Bit([flat], **OPT_ARGS)
            opt._zero = layouts_of([(flat, None, entries)])
            opt._zero[id(flat)].flat = flat
            for step in range(STEPS):
                g = grads(step)
                flat.grad = torch.zeros(size)
                for name, shape, off, start, numel in entries:
                    flat.grad[off:off + numel] = g[name].reshape(-1)[start:start + numel]
                opt.step()
            pieces = {name: (flat.data[off:off + numel].clone(), start) for name, _, off, start, numel in entries}
            gathered = [None] * world
            dist.all_gather_object(gathered, (pieces, opt.state_dict()["state"][0]["came"]))
            results[style] = gathered
        if rank == 0:
            torch.save(results, out_path)
    finally:
        dist.destroy_process_group()
    os._exit(0)


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


_CUT = {}


def run_ranks(tmp_path_factory, style, world):
    """(params, states, each rank's state bytes) of `style` at `world` ranks; both styles run in one spawn
    of the ranks (once per module and world size)."""
    if world not in _CUT:
        out = str(tmp_path_factory.mktemp(f"cut{world}") / "gathered.pt")
        ctx = mp.get_context("spawn")
        port = _free_port()
        procs = [ctx.Process(target=_worker, args=(r, world, port, ("zero12", "zero3"), out)) for r in range(world)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(180)
        assert all(p.exitcode == 0 for p in procs), [p.exitcode for p in procs]
        _CUT[world] = torch.load(out, weights_only=False)
    gathered = _CUT[world][style]
    state_bytes = [sum(v.numel() * v.element_size() for st in came.values() for v in st.values()
                       if torch.is_tensor(v)) for _, came in gathered]
    params, states = {}, {}
    for name, shape in SHAPES.items():
        parts = sorted((start, v) for pieces, _ in gathered for n, (v, start) in pieces.items() if n == name)
        params[name] = torch.cat([v for _, v in parts]).view(shape)
        states[name] = full_state_from_pieces([s[name] for _, st in gathered for s in [st] if name in s], shape)
    return params, states, state_bytes


@pytest.mark.parametrize("style", ["zero12", "zero3"])
@pytest.mark.parametrize("world", [2, 4])
def test_cut_weights_equal_one_process(tmp_path_factory, style, world):
    ref_params, ref_states = one_process(STEPS)
    params, states, state_bytes = run_ranks(tmp_path_factory, style, world)
    for name in SHAPES:
        assert_close_up_to_code_flips(params[name], ref_params[name], name)
        ref = ref_states[name]
        for key in ("exp_avg_sq_row", "exp_avg_sq_col", "exp_avg_res_row", "exp_avg_res_col", "exp_avg_sq",
                    "RMS", "clip_scale", "exp_avg_scales"):
            if key in ref:
                torch.testing.assert_close(states[name][key].reshape(ref[key].shape).float(), ref[key].float(),
                                           rtol=1e-4, atol=1e-7, msg=f"{name} {key}")
        if "exp_avg_codes" in ref:  # 8-bit in global blocks, as in one process
            codes = states[name]["exp_avg_codes"].reshape(-1).int()
            assert (codes - ref["exp_avg_codes"].reshape(-1).int()).abs().max() <= 1, name
        assert float(states[name]["step"]) == STEPS
    # the state is split, not replicated: each rank holds about its share (plus the columns of the
    # weights it cuts, and a few scalars)
    whole = sum(v.numel() * v.element_size() for st in ref_states.values() for v in st.values() if torch.is_tensor(v))
    assert max(state_bytes) <= 1.3 * whole / world + 4096, (state_bytes, whole)


# -- through DeepSpeed's engine and the trainer ------------------------------------------------
CAME = dict(type="CAME8Bit", lr=3e-3, weight_decay=0.01, block_size=16, min_8bit_size=256, eps=(1e-8, 1e-16))
_RUNS = {}


def _engine_job(project, strategy, ranks, **train):
    from tests.distributed import job
    launch = None
    if strategy.startswith("ZeRO-"):
        launch = dict(deepspeed_config=dict(deepspeed_config_file=f"zero{strategy[5:]}.json"))
    dt = {"NO": "NO", "DDP": "DDP"}.get(strategy, "DEEPSPEED")
    cfg = job(project, dt, ranks=ranks, launch=launch, **train)
    cfg["optimizers"] = dict(CAME)
    return cfg


def _engine_run(tmp_path_factory, strategy, ranks, **train):
    from giga_train import launch_from_config
    key = (strategy, ranks, repr(sorted(train.items())))
    if key not in _RUNS:
        project = tmp_path_factory.mktemp(f"{strategy}_{ranks}")
        launch_from_config(_engine_job(project, strategy, ranks, **train))
        _RUNS[key] = project
    return _RUNS[key]


def _assert_equal_weights(got, expected):
    from tests.distributed import assert_equal_up_to_code_flips
    assert_equal_up_to_code_flips(got, expected, CAME["lr"])


@pytest.mark.parametrize("strategy,ranks", [("ZeRO-1", 2), ("ZeRO-2", 2), ("ZeRO-3", 2), ("ZeRO-2", 4),
                                            ("ZeRO-3", 4)], ids=lambda v: str(v))
def test_engine_equals_one_process(tmp_path_factory, strategy, ranks):
    pytest.importorskip("deepspeed")
    from tests.distributed import final_weights
    reference = final_weights(_engine_run(tmp_path_factory, "NO", 1))
    _assert_equal_weights(final_weights(_engine_run(tmp_path_factory, strategy, ranks)), reference)


@pytest.mark.parametrize("source,target", [(("ZeRO-2", 2), ("ZeRO-2", 2)), (("ZeRO-3", 2), ("ZeRO-3", 2)),
                                           (("ZeRO-2", 2), ("NO", 1)), (("NO", 1), ("ZeRO-3", 2)),
                                           (("ZeRO-3", 2), ("ZeRO-1", 4))], ids=lambda v: f"{v[0]}x{v[1]}")
def test_engine_resume(tmp_path, tmp_path_factory, source, target):
    """Steps 1-2 under `source`, 3-4 under `target` (the engine's own files when both match, else the
    state by parameter name) equal one process's 4 steps. The source is the 4-step run of
    test_engine_equals_one_process, its step-2 checkpoint (a run stopped there wrote the same one)."""
    import shutil
    pytest.importorskip("deepspeed")
    from giga_train import launch_from_config
    from giga_train.checkpoint import list_checkpoints
    from tests.distributed import final_weights
    reference = final_weights(_engine_run(tmp_path_factory, "NO", 1))
    src = _engine_run(tmp_path_factory, *source)
    step, path = list_checkpoints(os.path.join(src, "models"))[0]
    assert step == 2
    shutil.copytree(path, tmp_path / "models" / os.path.basename(path))
    launch_from_config(_engine_job(tmp_path, *target, resume=True))
    assert list_checkpoints(str(tmp_path / "models"))[-1][0] == 4
    _assert_equal_weights(final_weights(tmp_path), reference)


def test_engine_bf16_trains(tmp_path_factory):
    """bf16 under ZeRO-2 at 2 ranks (DeepSpeed's fp32 master partitions, our pieces) lands where one rank does."""
    pytest.importorskip("deepspeed")
    from tests.distributed import final_weights
    one = final_weights(_engine_run(tmp_path_factory, "ZeRO-2", 1, mixed_precision="bf16"))
    two = final_weights(_engine_run(tmp_path_factory, "ZeRO-2", 2, mixed_precision="bf16"))
    for name in one:
        assert torch.isfinite(two[name]).all(), name
        assert (two[name] - one[name]).abs().max().item() <= 2 * CAME["lr"], name


@pytest.mark.parametrize("strategy", ["NO", "DDP", "FSDP2", "ZeRO-0", "ZeRO-1", "ZeRO-2", "ZeRO-3"])
@pytest.mark.parametrize("precision", ["no", "bf16"])
def test_check_accepts_what_train_accepts(tmp_path, capsys, strategy, precision):
    """`giga-train check` and the strategy's own refusal agree for CAME8Bit: both accept every
    strategy and precision (train's runs are the tests above and tests/test_cross_resume.py)."""
    pytest.importorskip("deepspeed")
    from giga_train.cli import main
    cfg = _engine_job(tmp_path / "run", strategy if strategy != "FSDP2" else "NO", 2, mixed_precision=precision)
    if strategy == "FSDP2":
        cfg["launch"].update(distributed_type="FSDP", fsdp_config=dict(fsdp_version=2))
    path = tmp_path / "cfg.py"
    path.write_text(f"config = {cfg!r}\n")
    assert main(["check", str(path)]) == 0, capsys.readouterr().err
    if strategy.startswith("ZeRO-"):
        import torch
        CAME8Bit.check_zero_compatible(int(strategy[5:]), torch.bfloat16 if precision == "bf16" else torch.float32)


def test_fsdp1_refused_by_check_and_by_train(tmp_path, capsys):
    """FSDP1 shows the optimizer flat 1-D shards: CAME8Bit would silently keep unfactored fp32 state.
    `check` refuses it from the config, and the strategy refuses it when a trainer's own
    get_optimizers builds it (past anything check can see)."""
    from giga_train import launch_from_config
    from giga_train.cli import main
    from giga_train.errors import ConfigError
    from tests.distributed import job
    fsdp1 = dict(fsdp_config=dict(fsdp_version=1))
    cfg = job(tmp_path / "a", "FSDP", ranks=1, launch=fsdp1)
    cfg["optimizers"] = dict(CAME)
    path = tmp_path / "cfg.py"
    path.write_text(f"config = {cfg!r}\n")
    assert main(["check", str(path)]) != 0
    assert "optimizers.type=CAME8Bit: FSDP1 hands the optimizer flat 1-D shards" in capsys.readouterr().err
    cfg = job(tmp_path / "b", "FSDP", ranks=1, launch=fsdp1)
    cfg["runners"] = ["tests.tiny.SplitOptimizerTrainer"]
    with pytest.raises(ConfigError, match="optimizer CAME8Bit: FSDP1 hands the optimizer flat 1-D shards"):
        launch_from_config(cfg)
    cfg = job(tmp_path / "c", "FSDP", ranks=1, launch=dict(fsdp_config=dict(fsdp_version=2)))
    cfg["optimizers"] = dict(CAME)
    path.write_text(f"config = {cfg!r}\n")
    assert main(["check", str(path)]) == 0, capsys.readouterr().err

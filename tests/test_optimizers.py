"""CAME8Bit and FusedAdam on CPU: the torch path against came-pytorch / torch.optim, the 8-bit
map, trajectory drift, state-dict round trips, refusals and the ZeRO guard."""
import io

import pytest
import torch

from giga_train.optimizers import CAME8Bit, FusedAdam, build_optimizer
from giga_train.optimizers.kernels import qmap
from giga_train.registry import OPTIMIZERS



@pytest.fixture
def came_pytorch():
    """The fp32 reference (test extra `came-pytorch`); only the comparisons need it."""
    return pytest.importorskip("came_pytorch")


def make_params(shapes, dtype=torch.float32, seed=0, scale=1.0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter((torch.randn(s, generator=gen) * scale).to(dtype)) for s in shapes]


def grad_stream(shapes, steps, seed=1, scale=1e-3):
    gen = torch.Generator().manual_seed(seed)
    return [[torch.randn(s, generator=gen) * scale for s in shapes] for _ in range(steps)]


def run(opt, params, grads):
    for step in grads:
        for p, g in zip(params, step):
            p.grad = g.reshape(p.shape).to(p.dtype)
        opt.step()


def test_registered_and_built_by_name():
    assert OPTIMIZERS.get("CAME8Bit") is CAME8Bit and OPTIMIZERS.get("FusedAdam") is FusedAdam
    params = make_params([(4, 4)])
    opt = build_optimizer(dict(type="CAME8Bit", lr=1e-3, weight_decay=0.01), params)
    assert isinstance(opt, CAME8Bit) and opt.param_groups[0]["weight_decay"] == 0.01


@pytest.mark.parametrize("shapes", [[(48, 80), (80,)], [(6, 4, 3, 3), (128, 32)]])
def test_fp32_moment_equals_came_pytorch(shapes, came_pytorch):
    """With the 8-bit path off, the torch path is came-pytorch's CAME (also for 3x3 convs)."""
    ours, ref = make_params(shapes), make_params(shapes)
    grads = grad_stream(shapes, 12)
    run(CAME8Bit(ours, lr=1e-2, weight_decay=0.1, min_8bit_size=2 ** 62), ours, grads)
    run(came_pytorch.CAME(ref, lr=1e-2, weight_decay=0.1), ref, grads)
    for a, b in zip(ours, ref):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_1x1_conv_is_factored_as_its_matrix(came_pytorch):
    conv = make_params([(24, 16, 1, 1)])
    ref = make_params([(24, 16)])
    grads = grad_stream([(24, 16)], 8)
    opt = CAME8Bit(conv, lr=1e-2, min_8bit_size=2 ** 62)
    run(opt, conv, grads)
    run(came_pytorch.CAME(ref, lr=1e-2), ref, grads)
    torch.testing.assert_close(conv[0].view(24, 16), ref[0], rtol=1e-5, atol=1e-5)
    assert opt.state[conv[0]]["exp_avg_sq_row"].shape == (24,)
    assert opt.state[conv[0]]["exp_avg_sq_col"].shape == (16,)


def heavy_tailed_grads(shape, steps, seed=0):
    """The drift setting of bench/optimizers.py: Student-t (df=2) noise, rows 1000x apart in scale."""
    gen = torch.Generator().manual_seed(seed)
    rows = torch.logspace(0, 3, shape[0])[torch.randperm(shape[0], generator=gen)]
    torch.manual_seed(seed)
    t = torch.distributions.StudentT(torch.tensor(2.0))
    return [[t.sample(shape) * rows[:, None] * 1e-3] for _ in range(steps)]


@pytest.mark.parametrize("shape", [(4096, 64), (1024, 256)])
def test_8bit_trajectory_drift_within_3_percent(shape, came_pytorch):
    grads = heavy_tailed_grads(shape, 30)
    theta0 = make_params([shape], scale=0.02)[0].detach().clone()
    ours, ref = make_params([shape], scale=0.02), make_params([shape], scale=0.02)
    opt = CAME8Bit(ours, lr=1e-3)
    run(opt, ours, grads)
    run(came_pytorch.CAME(ref, lr=1e-3), ref, grads)
    assert opt.state[ours[0]]["exp_avg_codes"].dtype == torch.uint8  # the 8-bit path really ran
    drift = ((ours[0] - ref[0]).norm() / (ref[0] - theta0).norm()).item()
    assert drift <= 0.03, drift


def test_state_layout_and_bytes_per_param():
    params = make_params([(512, 256), (256,), (8, 8)])
    opt = CAME8Bit(params, lr=1e-3)
    run(opt, params, grad_stream([(512, 256), (256,), (8, 8)], 1))
    big = opt.state[params[0]]
    assert big["exp_avg_codes"].dtype == torch.uint8 and big["exp_avg_codes"].shape == (512, 256)
    assert big["exp_avg_scales"].dtype == torch.float32 and big["exp_avg_scales"].shape == (512 * 256 // 2048,)
    assert "exp_avg" not in big and big["RMS"].dtype == torch.float32
    assert "exp_avg_codes" not in opt.state[params[2]]  # <= min_8bit_size: fp32 first moment
    assert "exp_avg_sq" in opt.state[params[1]]          # 1-D: unfactored
    nbytes = sum(v.numel() * v.element_size() for v in big.values() if torch.is_tensor(v))
    assert nbytes / params[0].numel() <= 1.1
    torch.testing.assert_close(big["RMS"], torch.tensor(1.0), atol=0.05, rtol=0)  # rms of randn before the step


def test_all_zero_blocks_stay_exact_zeros():
    p = make_params([(64, 512)])
    opt = CAME8Bit(p, lr=1e-3)
    g = torch.randn(64, 512) * 1e-3
    g[:8] = 0.0  # the first two 2048-element blocks see no gradient
    for _ in range(3):
        p[0].grad = g.clone()
        opt.step()
    st = opt.state[p[0]]
    assert torch.all(st["exp_avg_scales"][:2] == 0) and torch.all(st["exp_avg_codes"][:8] == qmap.ZERO_CODE)
    assert torch.isfinite(p[0]).all()


def test_code_map_is_sqrt_companding():
    table = qmap.code_table()
    assert table.numel() == 256 and torch.all(table[1:] > table[:-1])
    assert table[qmap.ZERO_CODE] == 0 and table[254] == 1.0 and table[0] == -1.0
    k = torch.arange(128, dtype=torch.float64)
    torch.testing.assert_close(table[127:255].double(), (k / 127) ** 2, rtol=1e-7, atol=0)
    torch.testing.assert_close(table[:127], -table[128:255].flip(0), rtol=0, atol=0)
    gen = torch.Generator().manual_seed(0)
    heavy = torch.randn(10000, generator=gen).mul(3).exp() * torch.randn(10000, generator=gen).sign()
    for x in (torch.rand(10000, generator=gen) * 2 - 1, heavy):
        codes, absmax = qmap.quantize_blockwise(x, 2048)
        assert int(codes.max()) <= 254
        y = qmap.dequantize_blockwise(codes, absmax, 2048)
        scale = absmax.repeat_interleave(2048)[:10000]
        # the nearest code in the sqrt domain, with the sign kept
        s = (x / scale).abs().sqrt() * 127
        assert ((codes.long() - 127).abs() - s).abs().max() <= 0.5 + 1e-4
        assert torch.all((codes.long() - 127).sign() * x.sign() >= 0)
        assert ((x - y).abs() / scale).max() <= 1 / 127 + 1e-6


def test_state_dict_round_trip_changes_nothing():
    shapes = [(128, 160), (160,), (16, 8)]
    for dtype in (torch.float32, torch.bfloat16):
        grads = grad_stream(shapes, 6)
        a, b = make_params(shapes, dtype), make_params(shapes, dtype)
        oa, ob = CAME8Bit(a, lr=1e-2), CAME8Bit(b, lr=1e-2)
        run(oa, a, grads[:3])
        run(ob, b, grads[:3])
        buf = io.BytesIO()
        torch.save(ob.state_dict(), buf)
        buf.seek(0)
        ob = CAME8Bit(b, lr=1e-2)
        ob.load_state_dict(torch.load(buf, weights_only=False))
        st = ob.state[b[0]]
        assert st["exp_avg_codes"].dtype == torch.uint8 and st["exp_avg_scales"].dtype == torch.float32
        assert st["exp_avg_sq_row"].dtype == torch.float32 and ob.state[b[1]]["exp_avg"].dtype == torch.float32
        run(oa, a, grads[3:])
        run(ob, b, grads[3:])
        for x, y in zip(a, b):
            assert torch.equal(x, y), dtype


def snapshot(opt, params):
    state = {id(p): {k: v.clone() if torch.is_tensor(v) else v for k, v in opt.state[p].items()} for p in params}
    return [p.detach().clone() for p in params], state


def assert_unchanged(opt, params, snap):
    before, state = snap
    for p, b in zip(params, before):
        assert torch.equal(p.detach(), b)
        for k, v in state[id(p)].items():
            assert torch.equal(opt.state[p][k], v), k


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_found_inf_skips_the_step_on_device(dtype):
    """found_inf > 0: parameters and every state entry (step count too) stay as they were, with NaN
    gradients; found_inf 0: the step is the one an optimizer without the flag takes."""
    shapes = [(64, 512), (512,), (16, 8)]  # 8-bit moment, unfactored, fp32 moment
    assert CAME8Bit.supports_found_inf
    grads = grad_stream(shapes, 3)
    a, b = make_params(shapes, dtype), make_params(shapes, dtype)
    oa, ob = CAME8Bit(a, lr=1e-2, weight_decay=0.1), CAME8Bit(b, lr=1e-2, weight_decay=0.1)
    run(oa, a, grads[:2])
    run(ob, b, grads[:2])
    ob.found_inf = torch.ones(1)
    snap = snapshot(ob, b)
    run(ob, b, [[torch.full(s, float("nan")) for s in shapes]])
    assert_unchanged(ob, b, snap)
    assert ob.state[b[0]]["step"].item() == 2
    ob.found_inf.zero_()
    run(oa, a, grads[2:])
    run(ob, b, grads[2:])
    for x, y in zip(a, b):
        assert torch.equal(x, y)
    assert ob.state[b[0]]["step"].item() == 3


def test_bf16_small_steps_survive_stochastic_rounding():
    """Steps far below half a bf16 ulp of 1.0 (0.0039) still move the weights on average."""
    p = [torch.nn.Parameter(torch.ones(4096, dtype=torch.bfloat16))]
    ref = [torch.nn.Parameter(torch.ones(4096))]
    opt, opt_ref = CAME8Bit(p, lr=1e-3), CAME8Bit(ref, lr=1e-3)
    for _ in range(60):
        p[0].grad = torch.ones(4096, dtype=torch.bfloat16)
        ref[0].grad = torch.ones(4096)
        opt.step()
        opt_ref.step()
    moved = (1.0 - p[0].float()).mean().item()
    expected = (1.0 - ref[0]).mean().item()
    assert expected > 0.04 and abs(moved - expected) < 0.1 * expected, (moved, expected)


def test_fp16_params_follow_fp32():
    shapes = [(64, 96), (96,)]
    grads = grad_stream(shapes, 5)
    a, b = make_params(shapes, torch.float16, scale=0.1), make_params(shapes, scale=0.1)
    run(CAME8Bit(a, lr=1e-3), a, grads)
    run(CAME8Bit(b, lr=1e-3), b, grads)
    for x, y in zip(a, b):
        torch.testing.assert_close(x.float(), y, rtol=0, atol=2e-3)


def test_refusals_are_one_line():
    p = torch.nn.Parameter(torch.randn(10, 4))
    p.grad = torch.randn(10, 4).to_sparse()
    for opt in (CAME8Bit([p], lr=1e-3), FusedAdam([p])):
        with pytest.raises(RuntimeError, match="sparse") as e:
            opt.step()
        assert "\n" not in str(e.value)
    with pytest.raises(RuntimeError, match="AMSGrad"):
        FusedAdam([p], amsgrad=True)


def test_zero_flat_partitions_need_the_layout():
    for stage in (0, 1, 2, 3):  # every stage and precision is accepted (came_zero.py) ...
        CAME8Bit.check_zero_compatible(stage)
        CAME8Bit.check_zero_compatible(stage, torch.bfloat16)
    # what a ZeRO wrapper does: swap the groups' params for one flat fp32 partition
    params = make_params([(32, 16), (16,)])
    opt = CAME8Bit(params, lr=1e-3)
    flat = torch.nn.Parameter(torch.cat([p.detach().reshape(-1) for p in params]))
    flat.grad = torch.randn_like(flat)
    opt.param_groups[0]["params"] = [flat]
    with pytest.raises(RuntimeError, match="bind_deepspeed") as e:  # ... but flat partitions need bind_deepspeed
        opt.step()
    assert "\n" not in str(e.value)
    # a 1-D parameter handed over by the user is fine
    bias = torch.nn.Parameter(torch.zeros(8))
    opt.param_groups[0]["params"] = params
    opt.add_param_group(dict(params=[bias]))
    bias.grad = torch.ones(8)
    opt.step()


@pytest.mark.parametrize("adam_w_mode", [True, False])
def test_fused_adam_equals_torch(adam_w_mode):
    shapes = [(40, 30), (30,), (7, 3, 3, 3)]
    ours, ref = make_params(shapes), make_params(shapes)
    cls = torch.optim.AdamW if adam_w_mode else torch.optim.Adam
    opt = FusedAdam(ours, lr=1e-2, betas=(0.8, 0.99), eps=1e-7, weight_decay=0.1, adam_w_mode=adam_w_mode)
    grads = grad_stream(shapes, 10, scale=1.0)
    run(opt, ours, grads)
    run(cls(ref, lr=1e-2, betas=(0.8, 0.99), eps=1e-7, weight_decay=0.1), ref, grads)
    for a, b in zip(ours, ref):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)
    assert set(opt.state[ours[0]]) == {"step", "exp_avg", "exp_avg_sq"}


def test_fused_adam_master_weights():
    shapes = [(40, 30), (30,)]
    ours = make_params(shapes, torch.bfloat16)
    ref = [torch.nn.Parameter(p.detach().float().clone()) for p in ours]
    opt = FusedAdam(ours, lr=1e-3, weight_decay=0.01, master_weights=True)
    grads = grad_stream(shapes, 5, scale=1.0)
    grads = [[g.bfloat16().float() for g in step] for step in grads]
    run(opt, ours, grads)
    run(torch.optim.AdamW(ref, lr=1e-3, weight_decay=0.01), ref, grads)
    for p, r in zip(ours, ref):
        master = opt.state[p]["master_param"]
        assert master.dtype == torch.float32 and opt.state[p]["exp_avg"].dtype == torch.float32
        torch.testing.assert_close(master, r.detach(), rtol=0, atol=1e-6)
        assert torch.equal(p.detach(), master.to(torch.bfloat16))
    buf = io.BytesIO()
    torch.save(opt.state_dict(), buf)
    buf.seek(0)
    fresh = FusedAdam(ours, lr=1e-3, weight_decay=0.01, master_weights=True)
    fresh.load_state_dict(torch.load(buf, weights_only=False))
    assert fresh.state[ours[0]]["master_param"].dtype == torch.float32
    torch.testing.assert_close(fresh.state[ours[0]]["master_param"], opt.state[ours[0]]["master_param"])


def test_bench_cpu_tiny_runs(tmp_path, came_pytorch):
    import json
    import os
    import subprocess
    import sys
    out = tmp_path / "opt.json"
    script = os.path.join(os.path.dirname(__file__), "..", "bench", "optimizers.py")
    subprocess.run([sys.executable, script, "--device", "cpu", "--size", "tiny", "--steps", "5",
                    "--warmup", "1", "--out", str(out)], check=True, capture_output=True, timeout=120)
    result = json.loads(out.read_text())
    names = {r["name"] for r in result["steps"]}
    assert {"giga CAME8Bit", "giga FusedAdam", "torch AdamW foreach"} <= names
    assert result["drift"]["giga CAME8Bit"] <= 0.03


def test_lazy_state_starts_where_the_eager_one_does():
    """CAME8Bit's first step makes its state lazily (meta tensors the buckets fill, so the state is never
    held twice); what the torch path then allocates equals an eager init, entry by entry."""
    from giga_train.optimizers.kernels import came_torch
    for shape in ((64, 512), (8, 16), (96,), (4, 6, 3, 3)):  # 8-bit factored, fp32 factored, vector, conv
        p = torch.nn.Parameter(torch.randn(shape))
        eager, lazy = {}, {}
        came_torch.init_state(p, eager, block_size=256, min_8bit_size=1000)
        came_torch.init_state(p, lazy, block_size=256, min_8bit_size=1000, lazy=True)
        assert sorted(lazy) == sorted(eager) and all(v.is_meta for v in lazy.values())
        came_torch.materialize_(lazy, p.device)
        for key, value in eager.items():
            assert lazy[key].dtype == value.dtype and torch.equal(lazy[key], value), (shape, key)

"""The Triton kernels on CPU through TRITON_INTERPRET=1, against the torch path and torch.optim.

The interpreter must be switched on before triton compiles anything, and must stay off for
everything else in the session, so the checks run in one subprocess (this file run as a script)
and the tests assert on what it reports. Skipped when triton is not importable.
"""
import json
import os
import subprocess
import sys

import pytest

CAME_SHAPES = [(40, 96), (96,), (12, 600), (5, 1024), (8, 16, 1, 1), (30, 20), (3, 4, 3, 3)]


def _came_run(backend, dtype, shapes, steps=3, zero_rows=0):
    import torch
    from giga_train.optimizers import CAME8Bit
    gen = torch.Generator().manual_seed(0)
    ps = [torch.nn.Parameter((torch.randn(s, generator=gen) * 0.05).to(dtype)) for s in shapes]
    p0 = [p.detach().float().clone() for p in ps]
    opt = CAME8Bit(ps, lr=1e-2, weight_decay=0.1, block_size=256, min_8bit_size=1000)
    opt.backend = backend
    gen = torch.Generator().manual_seed(1)
    for _ in range(steps):
        for p in ps:
            g = torch.randn(p.shape, generator=gen) * 1e-3
            if zero_rows and p.dim() == 2:
                g[:zero_rows] = 0
            p.grad = g.to(dtype)
        opt.step()
    return p0, ps, opt


def _came_checks(torch, kernel_runs):
    """`kernel_runs[dtype]`: the kernel path's 3-step run, shared with _found_inf_checks."""
    out = {}
    for dtype in (torch.float32, torch.bfloat16):
        p0, pt, ot = _came_run("torch", dtype, CAME_SHAPES, zero_rows=3)
        _, pk, ok = kernel_runs[dtype]
        name = str(dtype).split(".")[-1]
        rel = [((a.float() - b.float()).norm() / (a.float() - z).norm()).item() for z, a, b in zip(p0, pt, pk)]
        out[f"{name}_rel"] = max(r for r, p in zip(rel, pt) if p.dim() >= 2)
        out[f"{name}_rel_vector"] = rel[1]
        mism = [(ot.state[a]["exp_avg_codes"] != ok.state[b]["exp_avg_codes"]).float().mean().item()
                for a, b in zip(pt, pk) if "exp_avg_codes" in ot.state[a]]
        out[f"{name}_code_mismatch"] = max(mism)
        out[f"{name}_quantized_tensors"] = len(mism)
        if dtype == torch.float32:
            stats = {}
            for key in ("exp_avg_sq_row", "exp_avg_sq_col", "exp_avg_res_row", "exp_avg_res_col", "RMS",
                        "clip_scale", "exp_avg_scales"):
                stats[key] = max(((ot.state[a][key] - ok.state[b][key]).abs() / ot.state[a][key].abs().clamp(min=1e-30))
                                 .max().item() for a, b in zip(pt, pk) if key in ot.state[a])
            out["stat_rel"] = stats
            first = ok.state[pk[2]]  # (12, 600): rows 0-2 had no gradient: block 0 is all zero
            out["zero_block_scale"] = first["exp_avg_scales"][0].item()
            out["zero_block_codes"] = sorted(set(first["exp_avg_codes"].view(-1)[:256].tolist()))
            out["kernel_layout"] = {k: [str(v.dtype), list(v.shape)] for k, v in first.items() if torch.is_tensor(v)}
            # the first step's state (made lazily) lives only in the buckets' buffers: never allocated twice
            buffers = {t.untyped_storage().data_ptr() for _, _, bucket in ok._buckets.values()
                       for t in vars(bucket).values() if torch.is_tensor(t)}
            entries = [v for p, st in ok.state.items() if p.dim() <= 2  # a 3x3 conv takes the torch path
                       for v in st.values() if torch.is_tensor(v)]
            out["fresh_state_meta"] = sum(v.is_meta for v in entries)
            out["fresh_state_outside_buckets"] = sum(v.untyped_storage().data_ptr() not in buffers for v in entries)
            out["fresh_state_entries"] = len(entries)
    return out


def _codec_checks(torch):
    global came_codec  # the kernel below resolves it among this module's globals
    import triton
    import triton.language as tl
    from giga_train.optimizers.kernels import came_codec, qmap, rounding

    @triton.jit
    def codec(X, CODES, IDS, VALUES, NOISE, key, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        tl.store(CODES + offs, came_codec.encode(tl.load(X + offs, mask=mask)), mask=mask)
        tl.store(VALUES + offs, came_codec.decode(tl.load(IDS + offs, mask=mask)), mask=mask)
        tl.store(NOISE + offs, came_codec.noise16(offs, key), mask=mask)

    table = qmap.code_table()
    gen = torch.Generator().manual_seed(0)
    heavy = torch.randn(20000, generator=gen).mul(3).exp().mul(1e-4).clamp(max=1)
    x = torch.cat([torch.rand(20000, generator=gen) * 2 - 1, heavy * torch.randn(20000, generator=gen).sign(),
                   table[:255], torch.tensor([0.0, -0.0, 1.0, -1.0, 1e-30, -1e-30])])
    n = x.numel()
    codes = torch.empty(n, dtype=torch.int32)
    ids = torch.arange(n, dtype=torch.int32) % 256
    values, noise = torch.empty(n), torch.empty(n, dtype=torch.int32)
    key = 123456789
    codec[(triton.cdiv(n, 1024),)](x, codes, ids, values, noise, key, n, BLOCK=1024)
    diff = (codes.long() - qmap.encode(x).long()).abs()
    ref_noise = rounding.noise16(n, torch.tensor(key))
    return dict(encode_mismatch=(diff > 0).float().mean().item(), encode_max_off=diff.max().item(),
                decode_max_abs=(values[:256] - table).abs().max().item(),
                noise_mismatch=(noise != ref_noise).sum().item(), noise_mean=noise.float().mean().item())


def _found_inf_checks(torch, kernel_runs):
    """Kernel path: found_inf > 0 leaves parameters and state as they were (NaN gradients); back at
    0 the run equals one that never saw the flag (`kernel_runs[dtype]`, the 3-step run)."""
    out = {}
    for dtype in (torch.float32, torch.bfloat16):
        _, ref, _ = kernel_runs[dtype]
        _, ps, opt = _came_run("triton", dtype, CAME_SHAPES, steps=2, zero_rows=3)
        opt.found_inf = torch.ones(1)
        before = [p.detach().clone() for p in ps]
        state = [{k: v.clone() for k, v in opt.state[p].items()} for p in ps]
        for p in ps:
            p.grad = torch.full_like(p, float("nan"))
        opt.step()
        same = all(torch.equal(p, b) for p, b in zip(ps, before))
        same &= all(torch.equal(opt.state[p][k], v) for p, st in zip(ps, state) for k, v in st.items())
        opt.found_inf.zero_()
        gen = torch.Generator().manual_seed(1)
        for _ in range(3):  # the third draw of _came_run's gradient stream
            grads = [torch.randn(p.shape, generator=gen) * 1e-3 for p in ps]
        for g in grads:
            if g.dim() == 2:
                g[:3] = 0  # zero_rows=3
        grads = [g.to(dtype) for g in grads]
        for p, g in zip(ps, grads):
            p.grad = g
        opt.step()
        name = str(dtype).split(".")[-1]
        out[f"found_inf_{name}_unchanged"] = bool(same)
        out[f"found_inf_{name}_then_equal"] = all(torch.equal(a, b) for a, b in zip(ref, ps))
        out[f"found_inf_{name}_steps"] = sorted({opt.state[p]["step"].item() for p in ps})
    return out


def _adam_checks(torch):
    from giga_train.optimizers import FusedAdam
    out = {}
    for adam_w_mode in (True, False):
        gen = torch.Generator().manual_seed(0)
        shapes = [(40, 96), (96,), (5000,)]
        ref = [torch.nn.Parameter(torch.randn(s, generator=gen)) for s in shapes]
        ours = [torch.nn.Parameter(p.detach().clone()) for p in ref]
        cls = torch.optim.AdamW if adam_w_mode else torch.optim.Adam
        o_ref = cls(ref, lr=1e-2, weight_decay=0.1)
        o_ours = FusedAdam(ours, lr=1e-2, weight_decay=0.1, adam_w_mode=adam_w_mode)
        o_ours.backend = "triton"
        for _ in range(6):
            for a, b in zip(ref, ours):
                a.grad = torch.randn(a.shape, generator=gen)
                b.grad = a.grad.clone()
            o_ref.step()
            o_ours.step()
        out[f"adam_w_mode={adam_w_mode}"] = max((a - b).abs().max().item() for a, b in zip(ref, ours))
    return out


def _adam_skip_checks(torch):
    """FusedAdam's kernel with `found_inf`: 1.0 leaves weights, moments, master weights and step counts
    bit-identical; 0.0 is the step without it; the run matches torch's AdamW skipping on the host."""
    from giga_train.optimizers import FusedAdam
    out = {}
    for dtype, master in ((torch.float32, False), (torch.bfloat16, True)):
        gen = torch.Generator().manual_seed(0)
        shapes = [(40, 96), (96,), (5000,)]
        ref = [torch.nn.Parameter(torch.randn(s, generator=gen).to(dtype).float()) for s in shapes]
        ours = [torch.nn.Parameter(p.detach().clone().to(dtype)) for p in ref]
        o_ref = torch.optim.AdamW(ref, lr=1e-2, weight_decay=0.1)
        o_ours = FusedAdam(ours, lr=1e-2, weight_decay=0.1, master_weights=master)
        o_ours.backend = "triton"
        untouched = True
        for skip in (0.0, 0.0, 1.0, 0.0, 1.0, 1.0, 0.0):
            grads = [torch.randn(p.shape, generator=gen).to(dtype).float() for p in ref]  # the same for both
            before = [t.clone() for p in ours for t in [p.detach(), *o_ours.state[p].values()]] if skip else None
            for a, b, g in zip(ref, ours, grads):
                a.grad, b.grad = g, (torch.full_like(g, float("nan")) if skip else g).to(dtype)
            if not skip:
                o_ref.step()
            o_ours.found_inf = torch.tensor(skip)
            o_ours.step()
            del o_ours.found_inf
            if skip:
                after = [t for p in ours for t in [p.detach(), *o_ours.state[p].values()]]
                untouched &= all(torch.equal(x, y) for x, y in zip(before, after))
        name = str(dtype).split(".")[-1]
        out[f"skip_untouched_{name}"] = untouched
        out[f"skip_steps_{name}"] = sorted({float(s["step"]) for s in o_ours.state.values()})
        ws = [o_ours.state[p]["master_param"] for p in ours] if master else list(ours)
        out[f"skip_max_diff_{name}"] = max((a - b.float()).abs().max().item() for a, b in zip(ref, ws))
    return out


def main():
    import torch
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run as a script
    from tests.triton_shim import interpreter_numpy_shim
    interpreter_numpy_shim()
    torch.set_num_threads(1)
    # the kernel path is slow under the interpreter: its 3-step runs serve both the comparison with the torch
    # path and the found_inf run's reference
    kernel_runs = {dtype: _came_run("triton", dtype, CAME_SHAPES, zero_rows=3)
                   for dtype in (torch.float32, torch.bfloat16)}
    print(json.dumps({**_came_checks(torch, kernel_runs), **_codec_checks(torch),
                      **_found_inf_checks(torch, kernel_runs), **_adam_checks(torch), **_adam_skip_checks(torch)}))


@pytest.fixture(scope="module")
def report():
    pytest.importorskip("triton")
    env = dict(os.environ, TRITON_INTERPRET="1", CUDA_VISIBLE_DEVICES="")
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    done = subprocess.run([sys.executable, os.path.abspath(__file__)], env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_came_kernels_match_torch_path_fp32(report):
    assert report["float32_quantized_tensors"] >= 3
    assert report["float32_rel"] < 1e-4 and report["float32_rel_vector"] < 1e-5
    assert report["float32_code_mismatch"] < 1e-3
    for key, rel in report["stat_rel"].items():
        assert rel < 1e-3, key


def test_came_kernels_bf16_stochastic_rounding_tracks_torch_path(report):
    # one noise stream (the same hash of step and element): only fp32 rounding differences remain
    assert report["bfloat16_rel"] < 3e-3
    assert report["bfloat16_rel_vector"] < 1e-2


def test_kernel_first_step_state_is_made_in_the_buckets(report):
    assert report["fresh_state_entries"] >= 30
    assert report["fresh_state_meta"] == 0 and report["fresh_state_outside_buckets"] == 0


def test_kernel_state_layout_and_zero_blocks(report):
    layout = report["kernel_layout"]
    assert layout["exp_avg_codes"] == ["torch.uint8", [12, 600]]
    assert layout["exp_avg_scales"][0] == "torch.float32" and layout["RMS"] == ["torch.float32", []]
    assert report["zero_block_scale"] == 0.0 and report["zero_block_codes"] == [127]


def test_kernel_encode_decode_match_the_table(report):
    assert report["decode_max_abs"] == 0.0
    assert report["encode_max_off"] <= 1 and report["encode_mismatch"] < 1e-3
    assert report["noise_mismatch"] == 0 and abs(report["noise_mean"] - 32767.5) < 500


def test_kernel_found_inf_skips_the_step(report):
    for name in ("float32", "bfloat16"):
        assert report[f"found_inf_{name}_unchanged"] and report[f"found_inf_{name}_then_equal"], name
        assert report[f"found_inf_{name}_steps"] == [3.0]


def test_adam_kernel_matches_torch(report):
    assert report["adam_w_mode=True"] < 1e-6 and report["adam_w_mode=False"] < 1e-6


def test_adam_kernel_skips_on_found_inf(report):
    for name in ("float32", "bfloat16"):
        assert report[f"skip_untouched_{name}"] and report[f"skip_steps_{name}"] == [4.0], report
    assert report["skip_max_diff_float32"] < 1e-6 and report["skip_max_diff_bfloat16"] < 1e-6


if __name__ == "__main__":
    main()

"""GPU-only checks of the fused paths (skipped without CUDA + triton): kernels against the torch
path, no host synchronisation inside step(), CUDA-graph capture."""
import pytest
import torch

from giga_train.optimizers import CAME8Bit, FusedAdam
from giga_train.optimizers.kernels import triton_available

pytestmark = pytest.mark.skipif(not (torch.cuda.is_available() and triton_available()),
                                reason="needs CUDA and triton")
SHAPES = [(512, 384), (384,), (1000, 96), (64, 64), (32, 16, 1, 1), (3, 5, 3, 3)]


def make_params(dtype, seed=0):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    return [torch.nn.Parameter((torch.randn(s, device="cuda", generator=gen) * 0.05).to(dtype)) for s in SHAPES]


def run_came(backend, dtype, steps=8, **kw):
    ps = make_params(dtype)
    p0 = [p.detach().float().clone() for p in ps]
    opt = CAME8Bit(ps, lr=1e-2, weight_decay=0.1, block_size=256, min_8bit_size=4096, **kw)
    opt.backend = backend
    gen = torch.Generator(device="cuda").manual_seed(1)
    for _ in range(steps):
        for p in ps:
            p.grad = (torch.randn(p.shape, device="cuda", generator=gen) * 1e-3).to(dtype)
        opt.step()
    return p0, ps, opt


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_came_kernels_match_torch_path(dtype):
    p0, pt, ot = run_came("torch", dtype)
    _, pk, ok = run_came("triton", dtype)
    # bf16: one noise stream (a hash of step and element) in both paths; fp16 rounds to nearest
    tol = {torch.float32: 5e-4, torch.bfloat16: 5e-3, torch.float16: 2e-2}[dtype]
    for z, a, b in zip(p0, pt, pk):
        rel = ((a.float() - b.float()).norm() / (a.float() - z).norm()).item()
        assert rel < (tol if a.dim() >= 2 or dtype != torch.bfloat16 else 2e-2), (tuple(a.shape), rel)
    codes_t, codes_k = ot.state[pt[0]]["exp_avg_codes"], ok.state[pk[0]]["exp_avg_codes"]
    assert codes_k.dtype == torch.uint8
    if dtype == torch.float32:
        assert (codes_t != codes_k).float().mean().item() < 1e-3
        for key in ("exp_avg_sq_row", "exp_avg_res_col", "exp_avg_scales", "RMS"):
            torch.testing.assert_close(ok.state[pk[0]][key], ot.state[pt[0]][key], rtol=1e-3, atol=1e-30)


def step_without_sync_then_capture(opt):
    """One warm-up step; one step under sync-debug 'error' (raises on any host sync); a side-stream
    warm-up; then one step captured in a CUDA graph, which is returned (not yet replayed)."""
    opt.step()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        opt.step()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        opt.step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        opt.step()
    return graph


def test_came_step_has_no_host_sync_and_captures_in_a_graph():
    ps = make_params(torch.float32)
    for p in ps:
        p.grad = torch.randn_like(p) * 1e-3
    opt = CAME8Bit(ps, lr=1e-3)
    graph = step_without_sync_then_capture(opt)
    before = [p.detach().clone() for p in ps]
    graph.replay()
    torch.cuda.synchronize()
    for a, b in zip(before, ps):
        assert torch.isfinite(b).all() and (a != b).any(), "a replay updates every parameter"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_came_found_inf_is_read_on_the_device_inside_a_graph(dtype):
    """A captured step replayed with found_inf = 1 changes nothing (kernels and the torch path of the
    3x3 conv alike), with 0 it steps; setting the flag needs no host sync."""
    ps = make_params(dtype)
    for p in ps:
        p.grad = (torch.randn_like(p.float()) * 1e-3).to(dtype)
    opt = CAME8Bit(ps, lr=1e-3, weight_decay=0.1, block_size=256, min_8bit_size=4096)
    opt.found_inf = torch.zeros(1, device="cuda")
    graph = step_without_sync_then_capture(opt)
    torch.cuda.synchronize()
    before = [p.detach().clone() for p in ps]
    state = [{k: v.clone() for k, v in opt.state[p].items()} for p in ps]
    opt.found_inf.fill_(1.0)
    graph.replay()
    torch.cuda.synchronize()
    for p, b, st in zip(ps, before, state):
        assert torch.equal(p, b), tuple(p.shape)
        for k, v in st.items():
            assert torch.equal(opt.state[p][k], v), (tuple(p.shape), k)
    opt.found_inf.fill_(0.0)
    graph.replay()
    torch.cuda.synchronize()
    for p, b, st in zip(ps, before, state):
        assert (p != b).any(), tuple(p.shape)
        assert opt.state[p]["step"].item() == st["step"].item() + 1


def test_fused_adam_kernel_matches_torch_adamw():
    for adam_w_mode in (True, False):
        ref = make_params(torch.float32)
        ours = [torch.nn.Parameter(p.detach().clone()) for p in ref]
        cls = torch.optim.AdamW if adam_w_mode else torch.optim.Adam
        o_ref = cls(ref, lr=1e-2, weight_decay=0.1)
        o_ours = FusedAdam(ours, lr=1e-2, weight_decay=0.1, adam_w_mode=adam_w_mode)
        o_ours.backend = "triton"
        gen = torch.Generator(device="cuda").manual_seed(2)
        for _ in range(10):
            for a, b in zip(ref, ours):
                a.grad = torch.randn(a.shape, device="cuda", generator=gen)
                b.grad = a.grad.clone()
            o_ref.step()
            o_ours.step()
        for a, b in zip(ref, ours):
            torch.testing.assert_close(b, a, rtol=0, atol=1e-6)


def test_fused_adam_master_weights_on_gpu():
    ps = make_params(torch.bfloat16)
    ref = [torch.nn.Parameter(p.detach().float().clone()) for p in ps]
    opt = FusedAdam(ps, lr=1e-3, master_weights=True)
    o_ref = torch.optim.AdamW(ref, lr=1e-3, weight_decay=0.0)
    gen = torch.Generator(device="cuda").manual_seed(3)
    for _ in range(5):
        for a, b in zip(ref, ps):
            a.grad = torch.randn(a.shape, device="cuda", generator=gen)
            b.grad = a.grad.to(torch.bfloat16)
            a.grad = b.grad.float()
        opt.step()
        o_ref.step()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for p in ps:
            p.grad = torch.zeros_like(p)
        opt.step()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    o_ref.zero_grad(set_to_none=False)
    o_ref.step()
    for a, b in zip(ref, ps):
        master = opt.state[b]["master_param"]
        assert master.dtype == torch.float32
        torch.testing.assert_close(master, a.detach(), rtol=0, atol=1e-6)
        assert torch.equal(b.detach(), master.to(torch.bfloat16))

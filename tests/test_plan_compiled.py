"""plan under train.dynamo_config (inductor): the compiled blocks counted as inductor's partitioner saves them
(each kind of block traced through it on fake tensors), against the same job compiled for real on CPU. The
saved tensors (the compiled autograd functions' saves, seen by saved-tensor hooks) within 1%, plain and
checkpointed; the peak of gradients + activations (the CPU allocator's own allocations and frees, from the
profiler: MemTracker does not see inside compiled code) within 2% without checkpointing and 6% with it (the
temporaries inside a recomputed block are not counted), eager likewise without checkpointing (with it:
tests/test_plan.py); fp8 counted after torchao's conversion; a block the trace cannot take falls back to the
eager count, said in one note. (With checkpointing 4% held on the machine this test was written on; the plan is
5.1% under the real peak on an AVX512 EPYC, whose inductor kernels hold more temporaries: 6% allowed.)"""
import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from giga_train.engine.activation_checkpointing import apply_activation_checkpointing
from giga_train.engine.compile import compile_model
from giga_train.tools.plan import plan
from tests.test_plan import NARROW, narrow_config
from tests.tiny import CharLM, TinyTrainer

# 8 narrow blocks over 4 x 32 tokens (tests/test_plan.py's): one block graph compiled, plain and checkpointed
TOKENS = (4, NARROW["block_size"])
COMPILE = dict(backend="inductor")


def real_run(checkpointed, compiled, fp8=False):
    """(bytes autograd keeps for backward, the most the CPU allocator held at once beyond the weights) of one
    forward + backward of the narrow model under bf16 autocast, its blocks checkpointed and/or compiled; the
    second of two steps (the first compiles), with no gradient before it."""
    torch.manual_seed(0)
    model = CharLM(**NARROW)
    if checkpointed:
        apply_activation_checkpointing(model, {"Block": None})
    if fp8:
        from giga_train.engine.fp8 import convert_to_float8
        convert_to_float8(model, {})
    if compiled:
        assert compile_model(model, COMPILE, ["Block"])
    tokens = torch.randint(0, 256, TOKENS)
    weights = {p.untyped_storage()._cdata for p in model.parameters()}

    def step():
        saved = {}

        def pack(t):
            if t.untyped_storage()._cdata not in weights:
                saved.setdefault(t.untyped_storage()._cdata, t.untyped_storage().nbytes())
            return t
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), torch.autocast("cpu", dtype=torch.bfloat16):
            loss = model(tokens, tokens)
        loss.backward()
        return sum(saved.values())
    try:
        step()
        model.zero_grad(set_to_none=True)
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            saved = step()
    finally:
        torch._dynamo.reset()
    held = peak = 0
    for event in sorted((e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"),
                        key=lambda e: e.start_ns()):
        held += event.nbytes()
        peak = max(peak, held)
    return saved, peak


def planned(tmp_path, checkpointing, runner="tests.tiny.TinyTrainer", **train):
    """(the activations forward keeps, the planned gradients + activations peak, the count) of plan's NO row."""
    result = plan(narrow_config(tmp_path, checkpointing, runner=runner, **train), gpus=(1,))
    row = next(r for r in result["rows"] if r["strategy"] == "NO")
    act = result["activations"]["torch"]
    kept = act["checkpointed"] - act["largest_block"] if checkpointing else act["saved"]
    return kept, row["peak"] - row["params"] - row["optimizer"], act


@pytest.mark.parametrize("checkpointing", [False, True])
def test_compiled_plan_matches_a_real_compiled_run(tmp_path, checkpointing):
    kept, peak, act = planned(tmp_path, checkpointing, dynamo_config=COMPILE)
    assert act["compiled"] and not act["note"].startswith("the compiled blocks could not be traced")
    real_saved, real_peak = real_run(checkpointing, compiled=True)
    assert kept == pytest.approx(real_saved, rel=0.01)
    assert peak == pytest.approx(real_peak, rel=0.06 if checkpointing else 0.02)
    if not checkpointing:  # the eager count of the same job: what autograd saves without compile, and its peak
        eager_kept, eager_peak, eager = planned(tmp_path, False)
        assert not eager["compiled"] and eager_kept > kept * 1.02  # compiled blocks save less
        eager_saved, eager_real_peak = real_run(False, compiled=False)
        assert eager_kept == pytest.approx(eager_saved, rel=0.01)
        assert eager_peak == pytest.approx(eager_real_peak, rel=0.02) and eager_real_peak > real_peak


def test_fp8_compiled_plan_counts_float8_saves(tmp_path):
    """torchao's float8 Linears compiled save float8 casts where bf16 ones save bf16: the plan counts them."""
    pytest.importorskip("torchao")
    kept, _, act = planned(tmp_path, False, dynamo_config=COMPILE, mixed_precision="fp8")
    bf16_kept, _, _ = planned(tmp_path, False, dynamo_config=COMPILE)
    real_saved, _ = real_run(False, compiled=True, fp8=True)
    assert act["compiled"] and kept == pytest.approx(real_saved, rel=0.01) and kept < 0.8 * bf16_kept


class UncompiledBlocksTrainer(TinyTrainer):
    """Its blocks' forward is excluded from compile (torch.compiler.disable): dynamo makes no graph of them."""

    def get_models(self, model_config):
        model = super().get_models(model_config)
        for block in model.blocks:
            block.forward = torch.compiler.disable(block.forward)
        return model


def test_a_block_the_trace_cannot_take_is_counted_eagerly(tmp_path, caplog):
    runner = "tests.test_plan_compiled.UncompiledBlocksTrainer"
    kept, _, act = planned(tmp_path, False, runner=runner, dynamo_config=COMPILE)
    eager_kept, _, _ = planned(tmp_path, False, runner=runner)
    assert not act["compiled"] and kept == eager_kept
    assert "the compiled blocks could not be traced (RuntimeError: dynamo compiled no graph of the block)" in act["note"]
    assert any("could not be traced" in r.getMessage() for r in caplog.records)

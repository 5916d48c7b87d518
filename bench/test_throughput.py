"""bench/throughput.py's own tests (bench code is tested beside it, not from tests/): at the tiny size on CPU both
paths run through the real runner (one process each), give the same losses at the same seed, and every failure
mode ends as a row, not a crash. Speed itself is the bench's to measure: nothing here asserts a timing."""
import json

import pytest
import torch

from bench import throughput as bench
from bench.llama import SHAPES


def test_both_paths_run_with_equal_losses_and_the_json_has_the_fields(tmp_path, capsys):
    out = tmp_path / "throughput.json"
    assert bench.main(["--size", "tiny", "--device", "cpu", "--precision", "no", "--steps", "4", "--warmup", "1",
                       "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert {"card", "torch", "torchao", "date", "command", "peak_flops"} <= set(result["meta"])
    rows = {r["path"]: r for r in result["rows"]}
    assert set(rows) == {"giga", "hand"} and all(r["status"] == "ok" for r in rows.values()), rows
    for r in rows.values():
        assert {"tokens_per_s", "step_ms", "compile_s", "warmup_s", "flops_per_token", "params"} <= set(r)
        assert r["tokens_per_s"] > 0 and r["finite"] and len(r["losses"]) == 4
    # fp32 on CPU, same seed, same batches, same ops: the two loops agree to rounding (rtol 1e-6).
    assert rows["giga"]["losses"] == pytest.approx(rows["hand"]["losses"], rel=1e-6)
    assert rows["giga"]["loss_max_rel_diff"] <= 1e-6
    # the comparison pairs the two rows of this run (not another row's, not step times)
    ratio = rows["giga"]["tokens_per_s"] / rows["hand"]["tokens_per_s"]
    assert rows["giga"]["ours_over_hand"] == pytest.approx(ratio, rel=1e-9), rows
    assert rows["giga"]["losses"][0] != rows["giga"]["losses"][-1], "the optimizer must have stepped"
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.startswith("| tiny | 2 | no | eager | adamw | hand-written |"), last


def test_an_oom_is_a_row_not_a_crash():
    row = bench.run_row(bench.row_spec("tiny", "giga", device="cpu", expect_oom=True, simulate="oom"))
    assert row["status"] == "OOM" and "out of memory" in row["error"]


def test_a_crashed_or_hung_child_is_a_row(tmp_path):
    env = bench.child_env(False, str(tmp_path), 0)
    crash = bench.row_spec("tiny", "hand", device="cpu", simulate="crash")
    crashed = bench.run_in_child(crash, 120, str(tmp_path), env)
    assert crashed["status"] == "failed" and "exit 3" in crashed["error"]
    # No child imports torch in half a second: this one is killed, with its process group.
    hung = bench.run_in_child(bench.row_spec("tiny", "giga", device="cpu"), 0.5, str(tmp_path), env)
    assert hung["status"] == "timeout"


def test_rows_past_the_budget_are_skipped_and_the_report_marks_expected_ooms(tmp_path, capsys):
    out = tmp_path / "t.json"
    rows = bench.run_rows([bench.row_spec("tiny", "giga", device="cpu", budget_s=10**6)], 1, 60, False, str(out),
                          dict(card="CPU"))
    assert rows[0]["status"] == "skipped"
    oom = dict(bench.row_spec("13b", "giga", expect_oom=True), status="OOM", error="CUDA out of memory")
    meta = dict(card="H200", torch="x", torchao="y", date="d")
    bench.report(rows + [oom], meta, str(out))
    printed = capsys.readouterr().out
    assert "| 13b | 1 | bf16 | eager | adamw | giga-train |" in printed and "OOM (expected)" in printed
    assert "13b with AdamW fp32 states does not fit: OOM (target OOM) PASS" in printed
    assert [r["status"] for r in json.loads(out.read_text())["rows"]] == ["skipped", "OOM"]


def test_targets_compare_ours_with_hand_and_fp8_with_bf16():
    def ok(size, path, tokens, compile=True, precision="bf16"):
        return dict(bench.row_spec(size, path, compile=compile, precision=precision), status="ok",
                    tokens_per_s=tokens, losses=[1.0], mfu=0.51)
    rows = bench.add_comparisons([ok("1b", "giga", 98.0), ok("1b", "hand", 100.0),
                                  ok("8b", "giga", 100.0), ok("8b", "giga", 131.0, precision="fp8")])
    found = {what: passed for what, _, _, passed in bench.targets(rows)}
    assert found == {"overhead 1b compiled: ours/hand tokens/s": False, "MFU 1b bf16 compiled": True,
                     "fp8 / bf16 tokens/s, 8B, adamw, batch 1": True}


def test_shapes_are_the_models_they_are_named_after():
    """Parameter counts: Llama-3-8B's published 8.03B; the 13B shape is Llama-2-13B's. FLOPs per token: PaLM's
    count, 6 per matmul parameter plus 12 x layers x dim x seq for attention, written out for the 1B shape."""
    assert SHAPES["13b"].params() == pytest.approx(13.0e9, rel=0.01)
    assert SHAPES["8b"].params() == pytest.approx(8.03e9, rel=0.01)
    d, layers, ffn, vocab, seq = 2048, 16, 5632, 32000, 2048  # 16 heads, 16 kv heads: q, k, v, o all d x d
    matmul = layers * (4 * d * d + 3 * d * ffn) + d * vocab
    assert SHAPES["1b"].linear_params() == matmul
    assert SHAPES["1b"].flops_per_token() == 6 * matmul + 12 * layers * d * seq


def test_gradient_accumulation_gives_equal_losses_in_both_paths(tmp_path):
    out = tmp_path / "throughput.json"
    assert bench.main(["--size", "tiny", "--device", "cpu", "--precision", "no", "--steps", "3", "--warmup", "1",
                       "--accumulate", "2", "--out", str(out)]) == 0
    rows = {r["path"]: r for r in json.loads(out.read_text())["rows"]}
    tiny = SHAPES["tiny"]
    for r in rows.values():
        assert r["status"] == "ok" and len(r["losses"]) == 6, r  # one per micro-batch
        assert r["tokens_per_step"] == 2 * tiny.batch * tiny.seq
    assert rows["giga"]["losses"] == pytest.approx(rows["hand"]["losses"], rel=1e-6)
    assert rows["giga"]["losses"][0] != rows["giga"]["losses"][2], "distinct batches, and a step between"


def test_metrics_row_logs_the_trainers_tokens_and_counted_flops():
    """--metrics: the trainer counts one step's FLOPs; per token they are the bench's PaLM count (6 per
    matmul parameter), with the attention term where torch's flop table has the kernel (not CPU's sdpa)."""
    row = bench.run_row(bench.row_spec("tiny", "giga", device="cpu", precision="no", steps=4, warmup=1, metrics=True,
                                       log_with="jsonl", log_interval=2))
    logged, shape = row["logged"], SHAPES["tiny"]
    assert row["status"] == "ok" and logged["tokens_per_sec"] == pytest.approx(logged["samples_per_sec"] * shape.seq)
    counted = logged["tflops_per_device"] * 1e12 / logged["tokens_per_sec"]
    assert min(abs(counted - f) / f for f in (6 * shape.linear_params(), shape.flops_per_token())) < 1e-6, counted
    assert "mfu" not in logged and logged["peak_rss_gb"] > 0  # no peak FLOP/s on CPU


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_throughput_bench_counts_one_sync_per_log_line_on_the_giga_path():
    """The bench's probe counts syncs (sync-debug "warn") over the timed steps [warmup, steps). With the
    default single log line after them the giga path syncs no more than the hand-written loop; with a
    log line every 5 steps, one more per log line inside the window (its scalars' host read).
    (Moved from tests/test_sync_free_cuda.py: it runs the bench.)"""
    spec = dict(size="tiny", device="cuda", steps=20, warmup=5)
    hand = bench.run_row(bench.row_spec(path="hand", **spec))
    giga = bench.run_row(bench.row_spec(path="giga", **spec))
    logged = bench.run_row(bench.row_spec(path="giga", log_interval=5, **spec))
    assert all(r["status"] == "ok" and r["finite"] for r in (hand, giga, logged))
    assert giga["syncs"] <= hand["syncs"], (giga["syncs"], hand["syncs"])
    in_window = len([s for s in range(spec["warmup"] + 1, spec["steps"]) if s % 5 == 0])  # logs at 10, 15
    assert logged["syncs"] <= hand["syncs"] + in_window, (logged["syncs"], hand["syncs"], in_window)

"""bench/wan.py: a row whose steps the NaN guard skipped, or whose grad norm exploded, is not "ok"."""
import math

from bench.wan import training_verdict


def test_skipped_or_exploded_rows_fail_and_finite_ones_pass():
    ok = dict(status="ok", step_s=0.4)
    assert training_verdict(ok, [7.2, 3.3], 0) == dict(ok, grad_norms=[7.2, 3.3], nan_skipped=0)
    assert training_verdict(ok, [7.2, 3.3], 5)["status"] == "nan_skipped"
    assert training_verdict(ok, [3.2e4, 3.95e4], 0)["status"] == "exploded"
    assert training_verdict(ok, [math.nan, 3.3], 0)["status"] == "exploded"
    assert training_verdict(ok, [None], 0)["status"] == "ok"  # a log line without a measured norm

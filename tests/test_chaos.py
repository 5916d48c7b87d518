"""Three random kills/preemptions of a 2-rank DDP char-LM run, resumed each time: bit-identical weights."""
from tests.chaos import run_chaos


def test_chaos_three_events_end_on_the_uninterrupted_weights(tmp_path):
    summary = run_chaos(str(tmp_path), events=3, seed=2)
    kinds = {e["kind"] for e in summary["events"]}
    assert len(summary["runs"]) >= 2 and kinds, summary  # the schedule really interrupted the run

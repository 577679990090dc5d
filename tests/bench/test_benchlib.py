"""bench/benchlib.py, the helpers every benchmark shares."""

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import benchlib  # noqa: E402


def finish_in_reverse(index, count):
    """A worker loop whose process finishes later the lower its index."""

    def ready(stop_at):
        time.sleep(0.3 * (count - 1 - index))
        return {"index": index, "done": 1}

    return ready


def test_run_processes_answers_in_index_order_not_finishing_order():
    """A benchmark labels each outcome by its position (claim_latency's
    "beside" and "alone" tables): answering in the order the processes
    finished labelled the slower one wrongly."""
    outcomes = benchlib.run_processes(finish_in_reverse, 3, 0.1, args=(3,))
    assert [item["index"] for item in outcomes] == [0, 1, 2]

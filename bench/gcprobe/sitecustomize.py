"""The garbage-collection probe of ``bench/waiters.py --gc-probe``.

Python imports ``sitecustomize`` at start-up from its path: a process started
with this folder on PYTHONPATH and SWITCHBOARD_BENCH_GC_PROBE=1 times each of
its collections (``gc.callbacks``) and writes a line to stderr for every full
(oldest-generation) collection and every other one of 20 ms or more
(``SWITCHBOARD_BENCH_GC_REPORTED_MS`` sets another bound), on one line:

    gc-probe <unix time> pid=<pid> generation=<0-2> ms=<duration> cpu_ms=<cpu>
        collected=<n>

A collection's time (``ms``) includes any thread switch during it (finalizers
run Python code) and any moment the machine gave the process no CPU, so it
bounds the pause from above; ``cpu_ms`` is the collecting thread's own CPU.
"""

import gc
import os
import sys
import time

REPORTED_MS = float(os.environ.get("SWITCHBOARD_BENCH_GC_REPORTED_MS", "20"))


def _install():
    started = {}

    def callback(phase, info):
        generation = info["generation"]
        if phase == "start":
            started[generation] = (time.perf_counter(), time.thread_time())
            return
        began = started.pop(generation, None)
        if began is None:
            return
        ms = (time.perf_counter() - began[0]) * 1000
        cpu_ms = (time.thread_time() - began[1]) * 1000
        if generation == 2 or ms >= REPORTED_MS:
            print(
                f"gc-probe {time.time():.3f} pid={os.getpid()} "
                f"generation={generation} ms={ms:.1f} cpu_ms={cpu_ms:.1f} "
                f"collected={info['collected']}",
                file=sys.stderr,
                flush=True,
            )

    gc.callbacks.append(callback)


if os.environ.get("SWITCHBOARD_BENCH_GC_PROBE"):
    _install()

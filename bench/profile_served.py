"""Where a served request's CPU goes: one gunicorn worker profiled under a path's load.

Question: under bench/peers.py's load for one served path, which parts of the
server's process (the interpreter, the kernel, psycopg, the event loop) and
which functions take its CPU?

    python bench/profile_served.py --path http
    python bench/profile_served.py --path sqs10 --tool py-spy --seconds 8

It serves Switchboard as peers.py does, but with one gunicorn worker, fills the
path's queue, starts ``--clients`` client processes running the path's loop
(peers.py's own), and records the worker for ``--seconds``:

  perf     ``perf record`` (Linux perf, sampling at 999 Hz): the share of each
           shared object and the top symbols by own time. The worker runs with
           PYTHONPERFSUPPORT=1, so Python functions appear as ``py::`` symbols.
  py-spy   ``py-spy record --nonblocking``: the top Python functions by own and
           inclusive samples. Its stacks are wall time of the non-idle thread.

The summary goes to ``--out`` (bench/results/profiles/profile-<path>.txt) with
the command, the load average and the worker's CPU per todo in the window. It
is a reading of where to cut, not a result file: bench/report.py does not
render it.
"""

import collections
import multiprocessing
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import benchlib
import peers
import psycopg

PATHS = ("http", "http10", "sqs10", "mcp")
FILL = 60_000


def count_done(url):
    with psycopg.connect(url) as conn:
        return conn.execute(
            "SELECT count(*) FROM todos WHERE state = 'done'"
        ).fetchone()[0]


def client(index, path, setup, stop_at):
    peers.worker(index, path, setup, 0)(stop_at)


def record(tool, pid, seconds, raw):
    if tool == "perf":
        command = ["perf", "record", "-F", "999", "-o", str(raw), "-p", str(pid)]
        command += ["--", "sleep", str(seconds)]
    else:
        command = [
            str(Path(sys.executable).parent / "py-spy"),
            "record",
            "--nonblocking",
        ]
        command += ["-p", str(pid), "-d", str(seconds), "-r", "400"]
        command += ["-f", "raw", "-o", str(raw)]
    subprocess.run(command, check=True, capture_output=True)


def perf_report(raw, sort, limit):
    done = subprocess.run(
        ["perf", "report", "-i", str(raw), "--no-children", "--sort", sort]
        + ["--stdio", "-g", "none"],
        check=True,
        capture_output=True,
        text=True,
    )
    rows = [
        line.strip()
        for line in done.stdout.splitlines()
        if line.strip() and not line.startswith("#")
    ]
    return rows[:limit]


def py_spy_report(raw, limit):
    own, inclusive, total = collections.Counter(), collections.Counter(), 0
    for line in Path(raw).read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        samples = int(count)
        total += samples
        frames = [_short(frame) for frame in stack.split(";")]
        own[frames[-1]] += samples
        for frame in set(frames):
            inclusive[frame] += samples
    lines = [f"samples: {total}", "", "## by own samples"]
    lines += [f"{100 * n / total:5.1f}%  {f}" for f, n in own.most_common(limit)]
    lines += ["", "## inclusive"]
    lines += [f"{100 * n / total:5.1f}%  {f}" for f, n in inclusive.most_common(limit)]
    return lines


def _short(frame):
    return re.sub(r"\(.*/(site-packages|lib/python3\.\d+|main)/", "(", frame)


def main():
    parse = benchlib.parser(__doc__)
    parse.add_argument("--path", choices=PATHS, default="http", help="(http)")
    parse.add_argument("--tool", choices=("perf", "py-spy"), default="perf")
    parse.add_argument("--seconds", type=float, default=10, help="recorded (10)")
    parse.add_argument("--clients", type=int, default=3, help="client processes (3)")
    parse.add_argument("--top", type=int, default=40, help="rows per table (40)")
    parse.add_argument("--out", type=Path, help="the summary's file")
    args = parse.parse_args()
    tool = args.tool
    if args.tool == "perf" and shutil.which("perf") is None:
        sys.exit("perf is not installed (Debian: linux-perf); try --tool py-spy")
    out = args.out or benchlib.RESULTS / "profiles" / f"profile-{args.path}.txt"
    seconds = 2 if args.quick else args.seconds
    setup = peers.Setup(args, [args.path])
    before = os.getloadavg()
    with (
        tempfile.TemporaryDirectory() as scratch,
        benchlib.serve(
            setup.urls["switchboard"], workers=1, PYTHONPERFSUPPORT="1"
        ) as server,
    ):
        setup.serving(server)
        benchlib.progress(f"filling {FILL:,} todos for {args.path}")
        peers.fill(args.path, setup, FILL)
        stop_at = time.perf_counter() + seconds + 4
        clients = [
            multiprocessing.Process(target=client, args=(i, args.path, setup, stop_at))
            for i in range(args.clients)
        ]
        for process in clients:
            process.start()
        time.sleep(2)
        (pid,) = server.worker_pids()
        done_before, cpu_before = (
            count_done(setup.urls["switchboard"]),
            server.cpu_seconds(),
        )
        benchlib.progress(f"recording worker {pid} with {tool} for {seconds:g} s")
        raw = Path(scratch) / "profile.data"
        record(args.tool, pid, seconds, raw)
        done = count_done(setup.urls["switchboard"]) - done_before
        cpu = server.cpu_seconds() - cpu_before
        for process in clients:
            process.join()
        if args.tool == "perf":
            body = ["## by shared object", *perf_report(raw, "dso", 20), ""]
            body += ["## by symbol (own time)", *perf_report(raw, "sym", args.top)]
        else:
            body = py_spy_report(raw, args.top)
    head = [
        f"# Profile of one gunicorn worker: {peers.PATHS[args.path].label}",
        "",
        "How: python " + " ".join(["bench/profile_served.py", *sys.argv[1:]]),
        f"({args.clients} client processes of bench/peers.py's {args.path} loop, one "
        f"worker, {tool} for {seconds:g} s)",
        f"Load average {before[0]:.2f} before, {os.getloadavg()[0]:.2f} after.",
        f"Server CPU in the window: {1000 * cpu / max(done, 1):.2f} ms per todo "
        f"({done:,} todos in {seconds:g} s).",
        "",
    ]
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(head + body) + "\n")
    print(f"profile: {out}")


if __name__ == "__main__":
    main()

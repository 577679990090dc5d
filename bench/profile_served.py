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
PHASES_PATH = "/__phases__"
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
        command += ["-p", str(pid), "-d", str(round(seconds)), "-r", "400"]
        command += ["-f", "raw", "-o", str(raw)]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"{command[0]} failed:\n{done.stderr[-2000:]}")


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


def toggle_meters(port, on):
    """Zero the phase meters (bench/profile_phases.py), and turn them on or off."""
    status, data = benchlib.Client(port).request("POST", PHASES_PATH, {"on": on})
    if status != 200:
        raise RuntimeError(f"{PHASES_PATH} answered {status}")
    return data


def read_meters(port):
    status, data = benchlib.Client(port).request("GET", PHASES_PATH)
    if status != 200:
        raise RuntimeError(f"{PHASES_PATH} answered {status}")
    return data


def phases(server, url, seconds, rounds):
    """Alternate windows of ``seconds`` with the meters off and on, ``rounds``
    times each; return the worker's CPU and the todos of each kind of window,
    and the meters of the metered ones."""
    (pid,) = server.worker_pids()
    totals = {False: [0.0, 0], True: [0.0, 0]}
    ns, calls, misnested = collections.Counter(), collections.Counter(), 0
    for _ in range(rounds):
        for on in (False, True):
            toggle_meters(server.port, on)
            done_before, cpu_before = count_done(url), worker_cpu(pid)
            time.sleep(seconds)
            cpu, done = worker_cpu(pid) - cpu_before, count_done(url) - done_before
            totals[on][0] += cpu
            totals[on][1] += done
            if on:
                read = read_meters(server.port)
                ns.update(read["ns"])
                calls.update(read["calls"])
                misnested += read["misnested"]
    toggle_meters(server.port, False)
    return totals, ns, calls, misnested


def worker_cpu(pid):
    return benchlib._cpu_ticks([pid]) / os.sysconf("SC_CLK_TCK")


def phases_report(totals, ns, calls, misnested):
    """The phases' own CPU per todo, then what no phase holds (uvicorn, the
    event loop: the worker's CPU less the metered), and the meters' cost."""
    (off_cpu, off_done), (on_cpu, on_done) = totals[False], totals[True]
    per_todo = {name: value / 1e6 / max(on_done, 1) for name, value in ns.items()}
    metered = sum(per_todo.values())
    on_ms = 1000 * on_cpu / max(on_done, 1)
    off_ms = 1000 * off_cpu / max(off_done, 1)
    lines = [
        f"Worker CPU, meters off: {off_ms:.3f} ms per todo ({off_done:,} todos); "
        f"on: {on_ms:.3f} ({on_done:,} todos)",
        f"misnested meter exits: {misnested}",
        "",
        "## own CPU per todo by phase, meters on (ms; calls per todo)",
    ]
    rows = sorted(per_todo.items(), key=lambda item: -item[1])
    rows.append(("uvicorn, event loop, sockets (not metered)", on_ms - metered))
    for name, value in rows:
        count = calls.get(name, 0) / max(on_done, 1)
        lines.append(f"{value:7.4f}  {100 * value / on_ms:5.1f}%  {count:5.2f}  {name}")
    return lines


def main():
    parse = benchlib.parser(__doc__)
    parse.add_argument("--path", choices=PATHS, default="http", help="(http)")
    parse.add_argument("--tool", choices=("perf", "py-spy", "phases"), default="perf")
    parse.add_argument(
        "--rounds", type=int, default=3, help="phases: windows off and on (3)"
    )
    parse.add_argument("--seconds", type=float, default=10, help="recorded (10)")
    parse.add_argument("--clients", type=int, default=3, help="client processes (3)")
    parse.add_argument("--top", type=int, default=40, help="rows per table (40)")
    parse.add_argument("--out", type=Path, help="the summary's file")
    parse.add_argument("--port", type=int, help="the server's port (a free one)")
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
            setup.urls["switchboard"],
            workers=1,
            port=args.port,
            app="bench.profile_phases:application" if tool == "phases" else None,
            **({"PYTHONPERFSUPPORT": "1"} if tool == "perf" else {}),
        ) as server,
    ):
        setup.serving(server)
        if tool == "phases":
            # The meters charge a phase rightly only one request at a time.
            args.clients = 1
            recorded = 2 * args.rounds * seconds + 2
        else:
            recorded = seconds
        fill = max(FILL, int(peers.PATHS[args.path].ceiling / 2 * (recorded + 6)))
        benchlib.progress(f"filling {fill:,} todos for {args.path}")
        peers.fill(args.path, setup, fill)
        stop_at = time.perf_counter() + recorded + 4
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
        benchlib.progress(f"recording worker {pid} with {tool} for {recorded:g} s")
        raw = Path(scratch) / "profile.data"
        if tool == "phases":
            measured = phases(server, setup.urls["switchboard"], seconds, args.rounds)
        else:
            record(args.tool, pid, seconds, raw)
        done = count_done(setup.urls["switchboard"]) - done_before
        cpu = server.cpu_seconds() - cpu_before
        for process in clients:
            process.join()
        if tool == "phases":
            body = phases_report(*measured)
        elif args.tool == "perf":
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
        f"({done:,} todos in {recorded:g} s).",
        "",
    ]
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(head + body) + "\n")
    print(f"profile: {out}")


if __name__ == "__main__":
    main()

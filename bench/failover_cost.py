"""The failover pair's cost: claim+complete on the synchronous pair, next to one server.

Question: what does "an acknowledged commit is on two machines" cost in
throughput and latency?

    scripts/ha.sh start          # the pair (Patroni, etcd), once
    python bench/failover_cost.py
    python bench/failover_cost.py --start-pair   # start it (and stop it after)

N processes drain one queue, claim the next todo and complete it, running the
store's own two statements (its constants, the parameters it binds) on bare
psycopg connections, in turns of ``--slice`` seconds switched on the wall
clock, so that all paths see the same load from the rest of the machine:

- "single": a lone server, the project-local cluster (``--database-url``);
- "pair": the primary of the pair (``--pair-url``, by default scripts/ha.sh's
  multi-host URL), each commit waiting for the synchronous standby's flush;
- "pair-local": the same primary with ``synchronous_commit=local``: a commit
  waits for the primary's own disk only, so pair/pair-local is the cost of the
  standby's round trip alone and single/pair-local the cost of the rest of the
  pair's setup (WAL hints, replication slots, the WAL sender).

Both servers run with the same fsync setting (``SB_PG_FSYNC``, on by default).
Without a pair (and without ``--start-pair``) it says how to start one and
exits 0, writing nothing. It prints todos/s of each path, the ratios
pair/single and pair-local/single, and the complete's p50 and p99 (ms).
Result: bench/results/latest/failover_cost.json (`python bench/report.py`).
"""

import contextlib
import os
import subprocess
import sys
from urllib.parse import urlsplit, urlunsplit

import benchlib


def default_pair_url():
    """The pair's bench database (scripts/ha.sh's URL with switchboard_bench),
    or "" when the pair does not answer."""
    import psycopg

    found = subprocess.run(
        [str(benchlib.ROOT / "scripts" / "ha.sh"), "url"],
        capture_output=True,
        text=True,
    )
    if found.returncode != 0 or not found.stdout.strip():
        return ""
    url = found.stdout.strip()
    try:
        psycopg.connect(url, connect_timeout=3).close()
    except psycopg.OperationalError:
        return ""
    return benchlib.sibling_url(url, name="switchboard_bench")


def with_local_commit(url):
    """The same URL, its sessions committing without waiting for a standby."""
    parts = urlsplit(url)
    option = "options=-c%20synchronous_commit%3Dlocal"
    query = f"{parts.query}&{option}" if parts.query else option
    return urlunsplit(parts._replace(query=query))


def worker(index, urls, endpoint_ids, slice_seconds):
    """Return a loop that alternates the single server and the pair."""
    name = f"w{index}"
    modes = {
        mode: benchlib.plain_step(urls[mode], endpoint_ids[mode], name)
        for mode in ("single", "pair", "pair-local")
    }
    return lambda stop_at: benchlib.alternate(stop_at, slice_seconds, modes)


def synchronous_standby(url):
    """The pair primary's synchronous standby's name; fail without one."""
    import psycopg

    with psycopg.connect(url) as conn:
        names = conn.execute("SHOW synchronous_standby_names").fetchone()[0]
        commit = conn.execute("SHOW synchronous_commit").fetchone()[0]
        streaming = conn.execute(
            "SELECT application_name FROM pg_stat_replication WHERE sync_state = 'sync'"
        ).fetchall()
    if not names or commit != "on" or not streaming:
        sys.exit(
            f"the pair has no synchronous standby (synchronous_standby_names="
            f"{names!r}, synchronous_commit={commit}, sync standbys {streaming})"
        )
    return streaming[0][0]


def main():
    parse = benchlib.parser(__doc__)
    parse.add_argument(
        "--pair-url", default=None, help="the pair (default: scripts/ha.sh url)"
    )
    parse.add_argument(
        "--start-pair",
        action="store_true",
        help="start the pair with scripts/ha.sh when it is not running, and stop "
        "it afterwards",
    )
    parse.add_argument("--workers", type=benchlib.int_list, default=[1, 4])
    parse.add_argument(
        "--seconds", type=float, default=8, help="seconds per worker count (8)"
    )
    parse.add_argument(
        "--slice", type=float, default=0.5, help="seconds per turn of one path"
    )
    args = parse.parse_args()
    benchlib.apply_quick(args, parse, workers=[2], seconds=1.5, slice=0.25)
    result = benchlib.Result("failover_cost", args)
    with pair(args) as pair_url:
        if pair_url:
            run(args, pair_url, result)


@contextlib.contextmanager
def pair(args):
    """Yield the pair's bench URL (starting the pair if asked), or None."""
    started = False
    if args.pair_url is None and args.start_pair and not default_pair_url():
        benchlib.progress("starting the failover pair: scripts/ha.sh start")
        done = subprocess.run([str(benchlib.ROOT / "scripts" / "ha.sh"), "start"])
        started = done.returncode == 0
    url = args.pair_url or default_pair_url()
    if not url:
        print(
            "failover_cost: skipped, no failover pair (start it with "
            "`scripts/ha.sh start`, or pass --start-pair or --pair-url)"
        )
    try:
        yield url
    finally:
        if started:
            subprocess.run([str(benchlib.ROOT / "scripts" / "ha.sh"), "stop"])


def run(args, pair_url, result):
    """Measure the single server, the pair and the pair with local commits."""
    args.pair_url = pair_url

    urls = {
        "single": args.database_url,
        "pair": args.pair_url,
        "pair-local": with_local_commit(args.pair_url),
    }
    endpoint_ids = {}
    for mode in ("single", "pair"):
        benchlib.prepare_database(urls[mode])
        endpoint_ids[mode], _ = benchlib.ensure_endpoint(urls[mode])
    endpoint_ids["pair-local"] = endpoint_ids["pair"]
    standby = synchronous_standby(args.pair_url)
    runs = []
    for workers in args.workers:
        fill = int(max(2_000, 3_000 * args.seconds * workers))
        for mode in ("single", "pair"):
            benchlib.reset_todos(urls[mode])
            benchlib.fill_pending(urls[mode], endpoint_ids[mode], fill)
        outcomes = benchlib.run_processes(
            worker,
            workers,
            args.seconds,
            (urls, endpoint_ids, args.slice),
        )
        figures = benchlib.merge_modes(outcomes)
        single = figures["single"]["rate"]
        run = {
            "workers": workers,
            **figures,
            "pair_over_single": figures["pair"]["rate"] / single,
            "pair_local_over_single": figures["pair-local"]["rate"] / single,
        }
        runs.append(run)
        print(
            f"  {workers} workers: single {single:,.0f}/s, "
            f"pair {figures['pair']['rate']:,.0f}/s, "
            f"pair-local {figures['pair-local']['rate']:,.0f}/s, "
            f"pair/single {run['pair_over_single']:.2f}",
            flush=True,
        )

    benchlib.print_table(
        f"claim+complete on the synchronous pair (standby {standby}) and a single "
        f"server, {args.seconds:g} s per worker count, paths alternating every "
        f"{args.slice:g} s (todos/s; ms)",
        [
            "workers",
            "single/s",
            "pair/s",
            "pair-local/s",
            "pair/single",
            "pair-local/single",
            "single complete p50",
            "pair complete p50",
            "single complete p99",
            "pair complete p99",
        ],
        [
            [
                run["workers"],
                run["single"]["rate"],
                run["pair"]["rate"],
                run["pair-local"]["rate"],
                f"{run['pair_over_single']:.2f}",
                f"{run['pair_local_over_single']:.2f}",
                run["single"]["latency_ms"]["complete"]["p50"],
                run["pair"]["latency_ms"]["complete"]["p50"],
                run["single"]["latency_ms"]["complete"]["p99"],
                run["pair"]["latency_ms"]["complete"]["p99"],
            ]
            for run in runs
        ],
    )
    dry = sum(run[mode]["dry"] for run in runs for mode in urls)
    if dry:
        print(f"warning: workers found the queue empty {dry} times; raise the fill")
    result.write(
        {
            "workers": args.workers,
            "seconds": args.seconds,
            "slice": args.slice,
            "fsync": os.environ.get("SB_PG_FSYNC", "on"),
            "standby": standby,
        },
        benchlib.rounded({"runs": runs}),
    )


if __name__ == "__main__":
    main()

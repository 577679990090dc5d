"""Claim+complete throughput on the synchronous pair, next to a single server.

    scripts/ha.sh start          # the pair (Patroni, etcd), once
    python bench/failover_cost.py --workers 1,4 --seconds 10

What the promise "an acknowledged commit is on two machines" costs: N
processes drain one queue, claim the next todo and complete it, running the
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
The ratio pair/single is the figure to compare; on a machine shared with other
work it is noise, and the result file records the machine's load.
"""

import os
import subprocess
import sys
from urllib.parse import urlsplit, urlunsplit

import benchlib
from store_throughput import plain_step


def default_pair_url():
    """The pair's bench database: scripts/ha.sh's URL with switchboard_bench."""
    found = subprocess.run(
        [str(benchlib.ROOT / "scripts" / "ha.sh"), "url"],
        capture_output=True,
        text=True,
    )
    if found.returncode != 0:
        return ""
    parts = urlsplit(found.stdout.strip())
    return urlunsplit(parts._replace(path="/switchboard_bench"))


def with_local_commit(url):
    """The same URL, its sessions committing without waiting for a standby."""
    parts = urlsplit(url)
    option = "options=-c%20synchronous_commit%3Dlocal"
    query = f"{parts.query}&{option}" if parts.query else option
    return urlunsplit(parts._replace(query=query))


def worker(index, urls, endpoint_ids, sql, slice_seconds):
    """Return a loop that alternates the single server and the pair."""
    name = f"w{index}"
    modes = {
        mode: plain_step(urls[mode], endpoint_ids[mode], name, *sql)
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
    parse = benchlib.parser(__doc__.splitlines()[0])
    parse.add_argument("--pair-url", default=default_pair_url())
    parse.add_argument("--workers", type=benchlib.int_list, default=[1, 4])
    parse.add_argument("--seconds", type=float, default=10)
    parse.add_argument(
        "--slice", type=float, default=0.5, help="seconds per turn of one path"
    )
    args = parse.parse_args()
    if not args.pair_url:
        sys.exit("no pair: start it with scripts/ha.sh start, or give --pair-url")

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
    benchlib.setup_django(args.database_url)
    from django.conf import settings

    from todos.store import lifecycle

    sql = (lifecycle.CLAIM_SQL, lifecycle.ACK_SQL, settings.SWITCHBOARD_LEASE_SECONDS)
    info = benchlib.machine(args.database_url)
    runs = []
    for workers in args.workers:
        fill = int(max(10_000, 3_000 * args.seconds * workers))
        for mode in ("single", "pair"):
            benchlib.reset_todos(urls[mode])
            benchlib.fill_pending(urls[mode], endpoint_ids[mode], fill)
        outcomes = benchlib.run_processes(
            worker,
            workers,
            args.seconds,
            (urls, endpoint_ids, sql, args.slice),
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
    benchlib.write_results(
        "failover_cost",
        {
            "benchmark": "failover_cost",
            "machine": {**info, "loadavg_at_start": list(os.getloadavg())},
            "fsync": os.environ.get("SB_PG_FSYNC", "on"),
            "seconds": args.seconds,
            "slice": args.slice,
            "runs": runs,
        },
    )


if __name__ == "__main__":
    main()

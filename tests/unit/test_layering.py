"""The architecture's dependency rules, enforced."""

import ast
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SERVICES = REPO / "services"
SERVICE_PACKAGES = ["inference", "env_server", "orchestrator", "trainer", "operator"]


@pytest.mark.parametrize("package", ["rlrun.orchestrator", "rlrun.env_server"])
def test_light_services_do_not_import_torch(package):
    """Their containers stay small: importing every module of the package must not load torch."""
    code = (
        "import importlib, pkgutil, sys\n"
        f"pkg = importlib.import_module('{package}')\n"
        "for m in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + '.'):\n"
        "    importlib.import_module(m.name)\n"
        "heavy = [m for m in ('torch', 'transformers') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert result.returncode == 0, result.stderr[-2000:]


def imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def test_services_never_import_each_other():
    offences = []
    for package in SERVICE_PACKAGES:
        for path in (SERVICES / package).rglob("*.py"):
            for name in imported_modules(path):
                parts = name.split(".")
                if (
                    parts[0] == "rlrun"
                    and len(parts) > 1
                    and parts[1] in SERVICE_PACKAGES
                    and parts[1] != package
                ):
                    offences.append(f"{path.relative_to(REPO)} imports {name}")
    assert not offences, offences


def test_common_and_v1_depend_on_nothing_else_in_the_project():
    offences = []
    for package in ("common", "v1"):
        for path in (SERVICES / package).rglob("*.py"):
            for name in imported_modules(path):
                parts = name.split(".")
                if parts[0] == "rlrun" and len(parts) > 1 and parts[1] not in ("common", "v1"):
                    offences.append(f"{path.relative_to(REPO)} imports {name}")
    assert not offences, offences


def test_stdlib_operator_is_not_shadowed_from_the_repo_root():
    result = subprocess.run(
        [sys.executable, "-c", "import operator, collections; print(operator.__file__)"],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert result.returncode == 0, result.stderr
    assert str(REPO) not in result.stdout
    assert not any((REPO / "operator").rglob("*.py"))


def test_every_package_is_listed_for_non_editable_installs():
    listed = set(tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {"rlrun"} | {
        "rlrun." + ".".join(p.parent.relative_to(SERVICES).parts)
        for p in SERVICES.rglob("__init__.py")
        if p.parent != SERVICES
    }
    assert found == listed, {"missing": sorted(found - listed), "stale": sorted(listed - found)}

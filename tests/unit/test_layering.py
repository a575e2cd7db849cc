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


# -- the wire contract has a room of its own ----------------------------------------------------

WIRE_ROOMS = ("common/wire", "v1")
"""Where proto messages are built and read: the wire's modules (one per proto file) and the
generated code."""
RAW_PROTO_ALLOWED = {
    "bench": "benchmark baselines measure the wire layer and gRPC itself, so they bypass them",
}


def _rpc_names() -> set[str]:
    import importlib
    import pkgutil

    import rlrun.v1

    names = set()
    for info in pkgutil.iter_modules(rlrun.v1.__path__):
        if info.name.endswith("_pb2"):
            module = importlib.import_module(f"rlrun.v1.{info.name}")
            for service in module.DESCRIPTOR.services_by_name.values():
                names |= {method.name for method in service.methods}
    return names


RPCS = _rpc_names()


def _checked_modules():
    for path in sorted(SERVICES.rglob("*.py")):
        where = path.relative_to(SERVICES).as_posix()
        if where.startswith(WIRE_ROOMS) or where.split("/")[0] in RAW_PROTO_ALLOWED:
            continue
        yield where, ast.parse(path.read_text())


def _imports_messages(node: ast.AST) -> list[str]:
    """The rlrun.v1 message modules (`*_pb2`, not the `*_pb2_grpc` stubs) an import names."""
    if isinstance(node, ast.ImportFrom) and node.module == "rlrun.v1":
        return [a.name for a in node.names if a.name.endswith("_pb2")]
    if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("rlrun.v1."):
        return [node.module] if node.module.endswith("_pb2") else []
    if isinstance(node, ast.Import):
        return [a.name for a in node.names if a.name.startswith("rlrun.v1.") and a.name.endswith("_pb2")]
    return []


def test_no_module_outside_the_wire_imports_proto_messages():
    """Services build and read messages only through rlrun.common.wire (from_proto -> call ->
    to_proto); a module that imports a message module could build or read one by hand."""
    offences = [
        f"services/{where}:{node.lineno} imports {name}"
        for where, tree in _checked_modules()
        for node in ast.walk(tree)
        for name in _imports_messages(node)
    ]
    assert not offences, offences


def _is_rpc_call(node: ast.AST) -> bool:
    """`x.Method(...)` or a reference to `x.Method` (handed to a retry helper) for an rlrun.v1 RPC."""
    return isinstance(node, ast.Attribute) and node.attr in RPCS


def _converted(value: ast.AST) -> bool:
    """Whether an expression is a wire conversion (`*_from_proto(...)`, awaited or not)."""
    value = value.value if isinstance(value, ast.Await) else value
    if not isinstance(value, ast.Call):
        return False
    func = value.func
    name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
    return name.endswith("_from_proto")


def _proto_names(function: ast.AST) -> set[str]:
    """Names in `function` that an RPC's reply was assigned to, as it came (not converted by
    a `*_from_proto` of the wire)."""
    names = set()
    for node in ast.walk(function):
        if not isinstance(node, ast.Assign | ast.AnnAssign) or node.value is None:
            continue
        if any(_is_rpc_call(n) for n in ast.walk(node.value)) and not _converted(node.value):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {t.id for t in targets if isinstance(t, ast.Name)}
    return names


def _servicer_requests(tree: ast.Module):
    """(method, its request parameter's name) of every RPC method of a gRPC servicer class."""
    for cls in ast.walk(tree):
        if not isinstance(cls, ast.ClassDef):
            continue
        bases = [b.attr for b in cls.bases if isinstance(b, ast.Attribute)]
        if not any(base.endswith("Servicer") for base in bases):
            continue
        for method in cls.body:
            if isinstance(method, ast.AsyncFunctionDef | ast.FunctionDef) and method.name in RPCS:
                yield method, method.args.args[1].arg


def _reads_of(function: ast.AST, names: set[str]) -> list[ast.AST]:
    """Field reads of those names (`name.field`, `name[i]`, iterating `name`), and of an RPC
    call's reply read in place (`(await stub.Method(...)).field`)."""

    def held(value: ast.AST) -> bool:
        value = value.value if isinstance(value, ast.Await) else value
        named = isinstance(value, ast.Name) and value.id in names
        return named or (isinstance(value, ast.Call) and _is_rpc_call(value.func))

    def read(node: ast.AST) -> bool:
        if isinstance(node, ast.Attribute | ast.Subscript):
            return held(node.value)
        return isinstance(node, ast.For | ast.AsyncFor | ast.comprehension) and held(node.iter)

    return [node for node in ast.walk(function) if read(node)]


def test_no_module_outside_the_wire_reads_proto_messages_field_by_field():
    """A servicer's request and an RPC's reply are only handed on (to rlrun.common.wire), never
    read field by field where they arrive."""
    offences = []
    for where, tree in _checked_modules():
        for method, request in _servicer_requests(tree):
            reads = _reads_of(method, {request})
            offences += [f"services/{where}:{n.lineno} reads the {request} of {method.name}" for n in reads]
        for function in ast.walk(tree):
            if isinstance(function, ast.AsyncFunctionDef | ast.FunctionDef):
                reads = _reads_of(function, _proto_names(function))
                offences += [f"services/{where}:{n.lineno} reads an RPC's reply" for n in reads]
    assert not offences, sorted(set(offences))

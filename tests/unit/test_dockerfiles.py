"""Static checks of Dockerfiles/ (images cannot be built on this machine): one Dockerfile per
service, multi-stage, pinned base images, every COPY source present in the repository, a
non-root user, and an ENTRYPOINT that is a real `rlrun` subcommand (its arguments parse with
the real CLI, and `rlrun <subcommand> --help` runs). The light images (orchestrator,
env-server, operator) install the package without dependencies; their requirement lists must
cover everything those services import, and must not bring in torch."""

from __future__ import annotations

import glob
import importlib.metadata
import json
import re
import shlex
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from rlrun.cli import build_parser

REPO = Path(__file__).resolve().parents[2]
DOCKERFILES = REPO / "Dockerfiles"
SERVICES = ("inference", "env-server", "orchestrator", "trainer", "operator")
ENTRYPOINTS = {
    "inference": ["rlrun", "serve", "inference"],
    "env-server": ["rlrun", "serve", "env-server"],
    "orchestrator": ["rlrun", "serve", "orchestrator"],
    "trainer": ["rlrun", "serve", "trainer"],
    "operator": ["rlrun", "operator"],
}
LIGHT = {
    "orchestrator": ("requirements-light.txt", ["rlrun.orchestrator", "rlrun.cli"]),
    "env-server": ("requirements-light.txt", ["rlrun.env_server", "rlrun.cli"]),
    "operator": (
        "requirements-operator.txt",
        ["rlrun.operator", "rlrun.cli", "rlrun.common.grpc_client", "rlrun.v1.orchestrator_pb2_grpc"],
    ),
}
# Dev-only packages that libraries import only when present (grpc tries grpc_tools, the
# kubernetes client tries kubernetes_validate): blocked while the import closure is computed, as
# they are absent from the images.
BLOCKED_MODULES = ("grpc_tools", "kubernetes_validate")
# The editable install's own finder.
OPTIONAL_DISTRIBUTIONS = {"setuptools", "rlrun"}


def instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, with continuation lines joined and comments dropped."""
    result: list[tuple[str, str]] = []
    pending = ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        full = (pending + line).strip()
        pending = ""
        keyword, _, rest = full.partition(" ")
        result.append((keyword.upper(), rest.strip()))
    assert not pending, f"{path.name}: dangling line continuation"
    return result


def stages(path: Path) -> list[list[tuple[str, str]]]:
    out: list[list[tuple[str, str]]] = []
    for keyword, rest in instructions(path):
        if keyword == "FROM":
            out.append([])
        assert out, f"{path.name}: {keyword} before FROM"
        out[-1].append((keyword, rest))
    return out


def dockerfile(service: str) -> Path:
    return DOCKERFILES / f"{service}.Dockerfile"


def exec_form(rest: str) -> list[str]:
    value = json.loads(rest)
    assert isinstance(value, list) and all(isinstance(v, str) for v in value), rest
    return value


def test_one_dockerfile_per_service():
    assert sorted(p.name for p in DOCKERFILES.glob("*.Dockerfile")) == sorted(
        f"{s}.Dockerfile" for s in SERVICES
    )


@pytest.mark.parametrize("service", SERVICES)
def test_multi_stage_with_pinned_base_images(service):
    all_stages = stages(dockerfile(service))
    assert len(all_stages) >= 2, "multi-stage: build, then a runtime stage"
    names = set()
    for stage in all_stages:
        words = stage[0][1].split()
        words = [w for w in words if not w.startswith("--platform")]
        image = words[0]
        if image in names:
            continue  # FROM an earlier stage
        if "@sha256:" in image:
            assert re.search(r"@sha256:[0-9a-f]{64}$", image), image
        else:
            assert ":" in image, f"{image} has no tag"
            tag = image.rsplit(":", 1)[1]
            assert tag != "latest" and re.search(r"\d+\.\d+(\.\d+)?", tag), (
                f"{image}: pin an exact version tag or a digest"
            )
            assert "$" not in image, f"{image}: no build-arg images"
        if len(words) >= 3 and words[1].upper() == "AS":
            names.add(words[2])


@pytest.mark.parametrize("service", SERVICES)
def test_every_copy_source_exists(service):
    for stage in stages(dockerfile(service)):
        for keyword, rest in stage:
            if keyword not in ("COPY", "ADD"):
                continue
            words = shlex.split(rest)
            if any(w.startswith("--from=") for w in words):
                continue
            paths = [w for w in words if not w.startswith("--")]
            if paths[0].startswith("["):
                paths = json.loads(rest[rest.index("[") :])
            for source in paths[:-1]:
                assert not source.startswith(("http://", "https://")), source
                assert glob.glob(str(REPO / source)), (
                    f"{service}: COPY source {source} is not in the repository"
                )


@pytest.mark.parametrize("service", SERVICES)
def test_runs_as_non_root(service):
    final = stages(dockerfile(service))[-1]
    users = [rest for keyword, rest in final if keyword == "USER"]
    assert users, "the runtime stage sets USER"
    user = users[-1].split(":")[0]
    assert user not in ("root", "0")
    assert user.isdigit() and int(user) >= 10000, "a numeric uid (Kubernetes runAsNonRoot can verify it)"


@pytest.mark.parametrize("service", SERVICES)
def test_entrypoint_is_a_real_rlrun_subcommand(service):
    final = stages(dockerfile(service))[-1]
    (entrypoint,) = [exec_form(rest) for keyword, rest in final if keyword == "ENTRYPOINT"]
    assert entrypoint == ENTRYPOINTS[service]
    cmd = [exec_form(rest) for keyword, rest in final if keyword == "CMD"]
    args = build_parser().parse_args(entrypoint[1:] + (cmd[0] if cmd else []))
    if entrypoint[1] == "serve":
        assert args.service == service and args.host == "0.0.0.0" and args.port == 50051
        assert str(args.config) == "/etc/rlrun/config.toml"


def test_entrypoint_subcommands_run_with_help():
    rlrun = Path(sys.executable).with_name("rlrun")
    if not rlrun.exists():
        pytest.skip("no rlrun console script next to this interpreter")
    processes = {
        service: subprocess.Popen(
            [str(rlrun), *ENTRYPOINTS[service][1:], "--help"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for service in SERVICES
    }
    for service, process in processes.items():
        out, err = process.communicate(timeout=120)
        assert process.returncode == 0, f"rlrun {' '.join(ENTRYPOINTS[service][1:])} --help: {err[-2000:]}"
        assert "usage: rlrun" in out


def test_inference_runs_on_cuda_with_the_vllm_extra():
    text = dockerfile("inference").read_text()
    for stage in stages(dockerfile("inference")):
        assert stage[0][1].startswith("nvidia/cuda:")
    assert re.search(r"pip install [^\n]*\.\[vllm\]", text)
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert "vllm" in extras


def _requirements(name: str) -> dict[str, Requirement]:
    out: dict[str, Requirement] = {}
    for line in (DOCKERFILES / name).read_text().splitlines():
        line = line.split("#")[0].strip()
        if not line:
            continue
        if line.startswith("-r "):
            out.update(_requirements(line[3:].strip()))
            continue
        requirement = Requirement(line)
        out[_normal(requirement.name)] = requirement
    return out


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


@pytest.mark.parametrize("service", sorted(LIGHT))
def test_light_images_install_without_torch(service):
    text = "\n".join(f"{k} {rest}" for k, rest in instructions(dockerfile(service)))
    requirements_file, _ = LIGHT[service]
    assert re.search(r"pip install --no-deps \.", text), "the package goes in without its dependencies"
    assert f"pip install -r /tmp/{requirements_file}" in text
    assert "torch" not in text.replace("'torch' not in sys.modules", "")
    pinned = _requirements(requirements_file)
    assert not {"torch", "transformers", "vllm", "safetensors"} & set(pinned)
    for requirement in pinned.values():
        assert str(requirement.specifier).startswith("=="), f"{requirement}: pin exact versions"


def _closure(requirements: dict[str, Requirement]) -> set[str]:
    """The requirement names plus their installed dependencies, transitively."""
    seen: set[str] = set()
    todo = list(requirements)
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        try:
            requires = importlib.metadata.requires(name) or []
        except importlib.metadata.PackageNotFoundError:
            continue
        for text in requires:
            requirement = Requirement(text)
            if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
                todo.append(_normal(requirement.name))
    return seen


@pytest.mark.parametrize("service", sorted(LIGHT))
def test_light_requirements_cover_what_the_service_imports(service):
    requirements_file, modules = LIGHT[service]
    code = (
        "import importlib, importlib.abc, importlib.metadata as md, json, pkgutil, sys\n"
        "class Block(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        f"        if name.split('.')[0] in {BLOCKED_MODULES!r}:\n"
        "            raise ModuleNotFoundError(name)\n"
        "sys.meta_path.insert(0, Block())\n"
        f"for name in {modules!r}:\n"
        "    module = importlib.import_module(name)\n"
        "    for info in pkgutil.walk_packages(getattr(module, '__path__', []), name + '.'):\n"
        "        importlib.import_module(info.name)\n"
        "tops = {n.split('.')[0] for n in sys.modules} - set(sys.stdlib_module_names)\n"
        "dists = md.packages_distributions()\n"
        "print(json.dumps({'torch': 'torch' in sys.modules, 'needs': sorted([dists[t] for t in tops if t in dists])}))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert not report["torch"], f"{service} imports torch"
    provided = _closure(_requirements(requirements_file))
    missing = []
    for candidates in report["needs"]:
        names = {_normal(c) for c in candidates}
        if names & (provided | {_normal(o) for o in OPTIONAL_DISTRIBUTIONS}):
            continue
        missing.append(sorted(names))
    assert not missing, f"Dockerfiles/{requirements_file} lacks what {service} imports: {missing}"


@pytest.mark.parametrize("service", SERVICES)
def test_each_dockerfile_has_an_ignore_file_keeping_the_context_small(service):
    ignore = DOCKERFILES / f"{service}.Dockerfile.dockerignore"
    lines = [
        line.strip() for line in ignore.read_text().splitlines() if line.strip() and not line.startswith("#")
    ]
    assert lines[0] == "**", "ignore everything, then allow what the build copies"
    for keyword, rest in instructions(dockerfile(service)):
        if keyword == "COPY" and "--from=" not in rest:
            for source in shlex.split(rest)[:-1]:
                top = source.split("/")[0]
                assert any(line.startswith(f"!{top}") for line in lines), (
                    f"{source} is excluded from the context"
                )

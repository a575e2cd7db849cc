"""The RLRun CRD: generated from the Python schema, committed copies fresh, structural, valid,
and agreeing with the pydantic models on what is accepted."""

from __future__ import annotations

import copy
import importlib
from pathlib import Path

import jsonschema
import kubernetes_validate.utils
import pytest
import yaml

from rlrun.operator import crd
from rlrun.operator.spec import SpecError, parse_spec

REPO = Path(__file__).resolve().parents[2]
SAMPLES = sorted((REPO / "operator" / "samples").glob("*.yaml")) + [REPO / "configs" / "k8s" / "rlrun.yaml"]


def schema() -> dict:
    return crd.crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def test_committed_crd_files_are_fresh():
    """Fails when services/operator/spec.py changed without `make crd`."""
    assert crd.main(["--check", "--root", str(REPO)]) == 0, (
        "run `make crd` (python -m rlrun.operator.crd) and commit the result"
    )
    for path in crd.outputs(REPO):
        assert path.read_text() == crd.render_crd_yaml()


def test_check_mode_reports_a_stale_copy(tmp_path, monkeypatch, capsys):
    stale = tmp_path / "crd.yaml"
    stale.write_text("old\n")
    monkeypatch.setattr(crd, "generated_files", lambda root: {stale: crd.render_crd_yaml()})
    root = ["--root", str(tmp_path)]
    assert crd.main(["--check", *root]) == 1
    assert "stale: crd.yaml" in capsys.readouterr().err
    assert crd.main(root) == 0 and stale.read_text() == crd.render_crd_yaml()
    assert crd.main(["--check", *root]) == 0


def test_generated_files_include_the_install_manifests():
    importlib.import_module("helm_python")
    names = {path.relative_to(REPO).as_posix() for path in crd.generated_files(REPO)}
    assert names == {
        "charts/rlrun/crds/rlruns.rlrun.dev.yaml",
        "operator/crd.yaml",
        "operator/install.yaml",
        "operator/rbac.yaml",
    }


def test_crd_is_a_valid_kubernetes_object():
    kubernetes_validate.utils.validate(crd.crd(), "1.30.0", strict=True)


def test_crd_shape():
    obj = crd.crd()
    spec = obj["spec"]
    assert obj["metadata"]["name"] == "rlruns.rlrun.dev"
    assert spec["group"] == "rlrun.dev" and spec["scope"] == "Namespaced"
    assert spec["names"]["kind"] == "RLRun" and spec["names"]["shortNames"] == ["rlr"]
    (version,) = spec["versions"]
    assert version["name"] == "v1alpha1" and version["served"] and version["storage"]
    assert version["subresources"] == {"status": {}}
    columns = {c["name"]: c["jsonPath"] for c in version["additionalPrinterColumns"]}
    assert columns == {
        "Phase": ".status.phase",
        "Step": ".status.step",
        "Reward": ".status.reward",
        "Version": ".status.policyVersion",
        "Age": ".metadata.creationTimestamp",
    }
    props = schema()["properties"]["spec"]["properties"]
    assert props["inference"]["properties"]["engine"]["enum"] == ["torch", "vllm"]
    assert props["inference"]["properties"]["replicas"]["minimum"] == 1
    assert props["inference"]["properties"]["replicas"]["default"] == 1
    assert props["trainer"]["properties"]["gpusPerNode"]["maximum"] == 16
    assert props["envServers"]["items"]["required"] == ["name"]
    assert props["envServers"]["x-kubernetes-list-map-keys"] == ["name"]
    assert "x-kubernetes-validations" in props["envServers"]["items"]
    assert props["configSpec"]["x-kubernetes-preserve-unknown-fields"] is True
    quantity = props["inference"]["properties"]["resources"]["properties"]["requests"]["additionalProperties"]
    assert quantity == {"x-kubernetes-int-or-string": True}
    status = schema()["properties"]["status"]["properties"]
    assert status["phase"]["enum"] == ["Pending", "Running", "Succeeded", "Failed", "Suspended"]
    condition_types = status["conditions"]["items"]["properties"]["type"]["enum"]
    assert condition_types == [
        "ConfigValid",
        "InferenceReady",
        "EnvServersReady",
        "TrainerReady",
        "Admitted",
        "Progressing",
        "Degraded",
        "Restarted",
    ]
    assert status["restarts"]["additionalProperties"] == {"type": "integer"}


def _walk(node, path="$"):
    yield path, node
    for key in ("properties",):
        for name, child in (node.get(key) or {}).items():
            yield from _walk(child, f"{path}.{name}")
    if isinstance(node.get("items"), dict):
        yield from _walk(node["items"], f"{path}[]")
    if isinstance(node.get("additionalProperties"), dict):
        yield from _walk(node["additionalProperties"], f"{path}{{}}")


def test_schema_is_structural():
    """Every node has a type (or is int-or-string / preserve-unknown), no $ref, anyOf,
    additionalProperties false, or properties beside additionalProperties."""
    for path, node in _walk(schema()):
        assert "$ref" not in node and "anyOf" not in node and "oneOf" not in node and "$defs" not in node, (
            path
        )
        assert "type" in node or node.get("x-kubernetes-int-or-string"), path
        assert node.get("additionalProperties") is not False, path
        assert not ("properties" in node and "additionalProperties" in node), path
        assert "title" not in node, path
        if "default" in node:
            assert not isinstance(node["default"], dict), path


@pytest.mark.parametrize("path", SAMPLES, ids=lambda p: p.name)
def test_samples_satisfy_the_crd_schema_and_the_model(path):
    run = yaml.safe_load(path.read_text())
    jsonschema.Draft7Validator(schema()).validate(run)
    parse_spec(run["spec"])


BAD_SPECS = [
    ("inference.replicas", 0),
    ("inference.engine", "tensorrt"),
    ("inference.gpusPerReplica", -1),
    ("trainer.nodes", 0),
    ("storage.size", "lots"),
    ("storage.accessModes", ["ReadOnlyMany"]),
    ("envServers", [{"name": "Bad_Name"}]),
    ("ttlSecondsAfterFinished", -5),
    ("placement.tolerations", [{"effect": "Sometimes"}]),
    ("suspend", "yes"),
    ("trainer.env", [{"name": "1BAD"}]),
    ("trainer.volumeMounts", [{"name": "scratch"}]),
    ("inference.volumes", [{"emptyDir": {}}]),
    ("orchestrator.envFrom", [{"secretRef": {}}]),
    ("network.allowedNamespaces", ["Not_A_Namespace"]),
]


@pytest.mark.parametrize(("where", "value"), BAD_SPECS, ids=[b[0] for b in BAD_SPECS])
def test_the_schema_and_the_model_reject_the_same_bad_values(where, value):
    run = yaml.safe_load((REPO / "configs" / "k8s" / "rlrun.yaml").read_text())
    spec = copy.deepcopy(run["spec"])
    node = spec
    *parents, last = where.split(".")
    for key in parents:
        node = node.setdefault(key, {})
    node[last] = value
    run["spec"] = spec
    errors = list(jsonschema.Draft7Validator(schema()).iter_errors(run))
    assert errors, f"the CRD schema accepts {where}={value!r}"
    with pytest.raises(SpecError) as raised:
        parse_spec(spec)
    assert raised.value.path.startswith("spec." + parents[0] if parents else "spec." + last)

"""`kubectl apply` and `kubectl get` of the sample RLRun against the API emulator.

Uses the kubectl binary when there is one (skips otherwise; the python client covers the same
ground in test_operator_e2e.py). The emulator validates RLRuns against the generated CRD schema,
so a bad manifest is refused the way an API server with the CRD would refuse it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
SAMPLE = REPO / "configs" / "k8s" / "rlrun.yaml"


async def test_kubectl_apply_and_get_the_sample(kubectl, k8s, tmp_path):
    code, out, err = await kubectl("apply", "--validate=false", "-f", str(SAMPLE))
    assert "rlrun.dev/reverse-text created" in out, (out, err)

    code, out, _ = await kubectl("get", "rlrun", "reverse-text", "-o", "json")
    run = json.loads(out)
    assert run["kind"] == "RLRun" and run["spec"]["inference"]["gpusPerReplica"] == 1
    assert run["metadata"]["uid"] and run["metadata"]["resourceVersion"]
    applied = json.loads(run["metadata"]["annotations"]["kubectl.kubernetes.io/last-applied-configuration"])
    assert applied["spec"] == yaml.safe_load(SAMPLE.read_text())["spec"]

    # The short name from the CRD resolves through discovery.
    code, out, _ = await kubectl("get", "rlr", "-o", "name")
    assert out.strip() == "rlrun.rlrun.dev/reverse-text"

    # Re-applying a changed manifest patches the object and bumps its generation.
    changed = yaml.safe_load(SAMPLE.read_text())
    changed["spec"]["suspend"] = True
    path = tmp_path / "changed.yaml"
    path.write_text(yaml.safe_dump(changed))
    code, out, err = await kubectl("apply", "--validate=false", "-f", str(path))
    assert "configured" in out, (out, err)
    code, out, _ = await kubectl(
        "get", "rlrun", "reverse-text", "-o", "jsonpath={.spec.suspend} {.metadata.generation}"
    )
    assert out.split() == ["true", "2"]


async def test_kubectl_apply_is_refused_for_a_spec_the_crd_rejects(kubectl, tmp_path):
    bad = yaml.safe_load(SAMPLE.read_text())
    bad["spec"]["inference"]["replicas"] = 0  # minimum: 1
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(bad))
    code, out, err = await kubectl("apply", "--validate=false", "-f", str(path), check=False)
    assert code != 0
    assert "is invalid: spec.inference.replicas: 0 is less than the minimum of 1" in err, err
    code, out, _ = await kubectl("get", "rlruns", "-o", "name")
    assert out.strip() == ""


async def test_python_client_create_and_get_the_sample(api_client):
    """The same round trip through the official python client (runs without a kubectl binary)."""
    import asyncio

    import kubernetes

    api = kubernetes.client.CustomObjectsApi(api_client)
    body = yaml.safe_load(SAMPLE.read_text())
    args = ("rlrun.dev", "v1alpha1", "default", "rlruns")
    await asyncio.to_thread(api.create_namespaced_custom_object, *args, body)
    run = await asyncio.to_thread(api.get_namespaced_custom_object, *args, "reverse-text")
    assert run["spec"] == body["spec"] and run["metadata"]["uid"]
    listed = await asyncio.to_thread(api.list_namespaced_custom_object, *args)
    assert [item["metadata"]["name"] for item in listed["items"]] == ["reverse-text"]
    body["spec"]["trainer"]["nodes"] = 0
    body["metadata"]["name"] = "broken"
    with pytest.raises(kubernetes.client.ApiException) as refused:
        await asyncio.to_thread(api.create_namespaced_custom_object, *args, body)
    assert refused.value.status == 422 and "spec.trainer.nodes" in refused.value.body

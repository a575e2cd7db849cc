"""The CRD in a real API server, through kubectl and the Python client as a user drives them:
the sample is accepted, `kubectl get` prints the CRD's columns and resolves its short name, and
bad RLRuns are refused by the API server itself with the CRD's messages, from the OpenAPI schema
and from its CEL rules (which only an API server evaluates)."""

from __future__ import annotations

import asyncio
import json

import pytest
import yaml

from .conftest import SAMPLE_PATH, load_sample


async def test_kubectl_apply_and_get_the_sample(kubectl, namespace):
    sample = load_sample(namespace=namespace)
    code, out, err = await kubectl("apply", "-f", "-", input=yaml.safe_dump(sample))
    assert "rlrun.dev/reverse-text created" in out, (out, err)

    code, out, _ = await kubectl("get", "rlrun", "reverse-text", "-o", "json")
    run = json.loads(out)
    assert run["kind"] == "RLRun" and run["spec"]["inference"]["replicas"] == 1
    assert run["metadata"]["uid"] and run["metadata"]["resourceVersion"]
    # The API server applied the schema's defaults (the sample sets no image pull policy etc.).
    assert run["spec"]["trainer"]["nodes"] == 1
    applied = json.loads(run["metadata"]["annotations"]["kubectl.kubernetes.io/last-applied-configuration"])
    assert applied["spec"] == sample["spec"]

    # The short name and the printer columns come from the CRD, through discovery and Table output.
    code, out, _ = await kubectl("get", "rlr", "-o", "name")
    assert out.strip() == "rlrun.rlrun.dev/reverse-text"
    code, out, _ = await kubectl("get", "rlrun")
    assert out.split("\n")[0].split() == ["NAME", "PHASE", "STEP", "REWARD", "VERSION", "AGE"]

    # Re-applying a changed manifest patches the object and bumps its generation.
    sample["spec"]["suspend"] = True
    code, out, err = await kubectl("apply", "-f", "-", input=yaml.safe_dump(sample))
    assert "configured" in out, (out, err)
    code, out, _ = await kubectl(
        "get", "rlrun", "reverse-text", "-o", "jsonpath={.spec.suspend} {.metadata.generation}"
    )
    assert out.split() == ["true", "2"]


def bad_sample(namespace: str, edit) -> str:
    run = load_sample(namespace=namespace)
    edit(run)
    return yaml.safe_dump(run)


BAD = {
    "a replica count below the minimum (schema)": (
        lambda r: r["spec"]["inference"].update(replicas=0),
        "spec.inference.replicas: Invalid value: 0: spec.inference.replicas in body should be greater than or equal to 1",
    ),
    "an unknown field (structural schema, no preservation)": (
        lambda r: r["spec"]["trainer"].update(gpus=1),
        'unknown field "spec.trainer.gpus"',
    ),
    "both config and configSpec (CEL)": (
        lambda r: r["spec"].update(configSpec={"orchestrator": {"maxSteps": 3}}),
        "set exactly one of config and configSpec",
    ),
    "a multi-node trainer on ReadWriteOnce storage (CEL, with its field path)": (
        lambda r: (
            r["spec"]["trainer"].update(nodes=2),
            r["spec"]["storage"].update(accessModes=["ReadWriteOnce"]),
        ),
        "spec.storage.accessModes: Invalid value",
    ),
    "two model sources (CEL)": (
        lambda r: r["spec"].update(model={"claim": {"claimName": "w"}, "image": {"path": "/opt/m"}}),
        "set exactly one of claim, huggingFace and image",
    ),
    "a run name that cannot name its Services (CEL on metadata)": (
        lambda r: r["metadata"].update(name="9-starts-with-a-digit"),
        "the RLRun name must be a DNS label starting with a letter",
    ),
    "a run name too long for its children (CEL on metadata)": (
        lambda r: r["metadata"].update(name="a" * 41),
        "the RLRun name must be at most 40 characters",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD))
async def test_the_api_server_refuses_a_bad_rlrun_with_the_crds_message(kubectl, namespace, case):
    edit, message = BAD[case]
    code, out, err = await kubectl("apply", "-f", "-", check=False, input=bad_sample(namespace, edit))
    assert code != 0, out
    assert message in err, err
    code, out, _ = await kubectl("get", "rlruns", "-o", "name")
    assert out.strip() == ""


async def test_python_client_create_and_get_the_sample(api_client, namespace):
    """The same round trip through the official Python client."""
    import kubernetes

    api = kubernetes.client.CustomObjectsApi(api_client)
    body = load_sample(namespace=namespace)
    args = ("rlrun.dev", "v1alpha1", namespace, "rlruns")
    await asyncio.to_thread(api.create_namespaced_custom_object, *args, body)
    run = await asyncio.to_thread(api.get_namespaced_custom_object, *args, "reverse-text")
    assert run["spec"]["config"] == body["spec"]["config"] and run["metadata"]["uid"]
    listed = await asyncio.to_thread(api.list_namespaced_custom_object, *args)
    assert [item["metadata"]["name"] for item in listed["items"]] == ["reverse-text"]
    body["spec"]["trainer"]["nodes"] = 0
    body["metadata"]["name"] = "broken"
    with pytest.raises(kubernetes.client.ApiException) as refused:
        await asyncio.to_thread(api.create_namespaced_custom_object, *args, body)
    assert refused.value.status == 422 and "spec.trainer.nodes" in refused.value.body


def test_the_sample_file_is_applied_as_is(cluster):
    """`kubectl apply -f configs/k8s/rlrun.yaml` exactly as the README says (into `default`), and
    deleted again (no operator runs in this test)."""
    out = cluster.kubectl("apply", "-f", str(SAMPLE_PATH)).stdout
    try:
        assert "rlrun.rlrun.dev/reverse-text" in out
    finally:
        cluster.kubectl("delete", "-f", str(SAMPLE_PATH), "--wait=false")

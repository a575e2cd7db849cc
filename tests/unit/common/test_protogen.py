"""The generated code in services/v1 must match proto/ (run `make proto` after editing a .proto)."""

from pathlib import Path

from rlrun.common.protogen import generate

REPO = Path(__file__).resolve().parents[3]
PROTO_DIR = REPO / "proto" / "rlrun" / "v1"
GENERATED_DIR = REPO / "services" / "v1"

EXPECTED_PROTOS = {
    "trace",
    "training",
    "weights",
    "inference",
    "env",
    "trainer",
    "orchestrator",
    "sampling",
    "plan",
}


def test_generated_code_is_fresh(tmp_path: Path):
    fresh = {p.name: p.read_bytes() for p in generate(REPO, tmp_path)}
    committed = {
        p.name: p.read_bytes() for p in GENERATED_DIR.iterdir() if p.is_file() and p.suffix in (".py", ".pyi")
    }
    stale = sorted(name for name in fresh if committed.get(name) != fresh[name])
    extra = sorted(set(committed) - set(fresh))
    assert not stale and not extra, f"run `make proto`: stale {stale}, no longer generated {extra}"


def test_every_contract_file_exists_with_unspecified_enum_zeros():
    assert {p.stem for p in PROTO_DIR.glob("*.proto")} == EXPECTED_PROTOS
    for proto in PROTO_DIR.glob("*.proto"):
        lines = proto.read_text().splitlines()
        for i, line in enumerate(lines):
            if line.startswith("enum "):
                first_value = next(v for v in lines[i + 1 :] if "=" in v and not v.strip().startswith("//"))
                assert "_UNSPECIFIED = 0" in first_value, (
                    f"{proto.name}: {line} zero value is {first_value.strip()}"
                )


def test_every_rpc_has_its_own_request_and_response():
    seen = set()
    for proto in PROTO_DIR.glob("*.proto"):
        for line in proto.read_text().splitlines():
            line = line.strip()
            if line.startswith("rpc "):
                request = line.split("(")[1].split(")")[0].replace("stream ", "")
                response = line.split("returns (")[1].split(")")[0]
                if "WeightUpdateMessage" not in request:
                    assert request not in seen, f"{request} is shared by two RPCs"
                    seen.add(request)
                assert response not in seen, f"{response} is shared by two RPCs"
                seen.add(response)

"""GenerationParams as the OpenAI layer builds them, from keyword arguments."""

from dataclasses import fields

from rlrun.inference.logits import Grammar, RequestFields, read_knobs, request_fields
from rlrun.inference.params import GenerationParams


def knobbed(json_schema: str | None = None, **kwargs) -> GenerationParams:
    """The dataclass's own fields as given; every other keyword a request field some logits
    processor reads (`logit_bias`, `presence_penalty`, `min_tokens`, ...), read by it; a
    `json_schema` for the grammar."""
    own = {f.name for f in fields(GenerationParams)}
    requested = {name: value for name, value in kwargs.items() if name not in own}
    unknown = requested.keys() - request_fields()
    assert not unknown, f"no logits processor reads {sorted(unknown)}"
    knobs = read_knobs(RequestFields(requested, "sampling"))
    if json_schema is not None:
        knobs[Grammar.name] = json_schema
    return GenerationParams(**{name: value for name, value in kwargs.items() if name in own}, knobs=knobs)

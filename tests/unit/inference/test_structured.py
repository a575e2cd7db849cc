"""Structured outputs: which tokens a JSON schema lets a sample draw, over the char tokenizers."""

import json

import pytest
import torch

from rlrun.common.errors import RequestError
from rlrun.common.tokenizer import CharTokenizer
from rlrun.inference.sampler import BatchSampler, RowSettings
from rlrun.inference.structured import GrammarCompiler, allowed_tokens, schema_text

from .conftest import REPO

CHARS = CharTokenizer.from_file(REPO / "configs/tokenizer/char")
LOWERCASE = CharTokenizer.from_file(REPO / "configs/tokenizer/lowercase")
ENUM = json.dumps({"enum": ["ab", "ac", "b"]})


def allowed_text(grammar, tokenizer, vocab: int = 128) -> set[str]:
    bitmask = torch.zeros(1, grammar.mask_words, dtype=torch.int32)
    grammar.fill_mask(bitmask[0])
    return {
        tokenizer.decode([t], skip_special_tokens=False)
        for t in allowed_tokens(bitmask, vocab)[0].nonzero()[:, 0]
    }


def test_a_sample_may_draw_only_what_keeps_its_text_a_prefix_of_a_matching_value():
    grammar = GrammarCompiler(lambda: CHARS).sample_grammar(ENUM)
    for drawn, allowed in [("", {'"'}), ('"', {"a", "b"}), ("a", {"b", "c"}), ("c", {'"'})]:
        if drawn:
            assert not grammar.accept(CHARS.encode(drawn)[0])
        assert allowed_text(grammar, CHARS) == allowed
    assert grammar.accept(CHARS.encode('"')[0])  # "ac" is complete: nothing may follow
    assert allowed_text(grammar, CHARS) == {"<|end|>"}


def test_objects_are_written_compact():
    schema = {
        "type": "object",
        "properties": {"a": {"enum": [1]}},
        "required": ["a"],
        "additionalProperties": False,
    }
    grammar = GrammarCompiler(lambda: CHARS).sample_grammar(json.dumps(schema))
    text, complete = "", False
    while not complete:
        [only] = allowed_text(grammar, CHARS)  # one way to write it: no optional whitespace
        text += only
        complete = grammar.accept(CHARS.encode(only)[0])
    assert text == '{"a": 1}'


def test_a_tokenizer_that_cannot_write_the_json_is_refused_up_front_and_ends_a_sample_with_its_end_token():
    grammars = GrammarCompiler(lambda: LOWERCASE)
    with pytest.raises(RequestError) as caught:
        grammars.check_writable('{"type": "object"}', "response_format")
    assert caught.value.field == "response_format"
    # A value the alphabet cannot finish: its sample may only end.
    grammar = GrammarCompiler(lambda: CHARS).sample_grammar(json.dumps({"enum": ["Zq\u00e9"]}))
    for char in '"Zq':
        assert not grammar.accept(CHARS.encode(char)[0])
    assert allowed_text(grammar, CHARS) == {"<|end|>"}
    GrammarCompiler(lambda: CHARS).check_writable('{"type": "object"}', "response_format")


def test_schemas_are_checked_naming_the_field():
    assert json.loads(schema_text({"type": "object"}, "f")) == {"type": "object"}
    for bad in [{"type": "nonsense"}, [1], "x"]:
        with pytest.raises(RequestError) as caught:
            schema_text(bad, "response_format.json_schema.schema")
        assert caught.value.field == "response_format.json_schema.schema"


def test_allowed_tokens_reads_bits_lowest_first_and_pads_to_the_models_vocabulary():
    bitmask = torch.tensor([[0b101, 0], [0, -(2**31)]], dtype=torch.int32)
    allowed = allowed_tokens(bitmask, 70)
    assert allowed.shape == (2, 70)
    assert allowed[0].nonzero()[:, 0].tolist() == [0, 2]
    assert allowed[1].nonzero()[:, 0].tolist() == [63]
    assert allowed_tokens(bitmask, 40).shape == (2, 40)


@pytest.mark.parametrize("temperature", [0.0, 0.7])
def test_the_sampler_masks_grammar_rows_only_and_reports_logprobs_under_the_mask(temperature):
    grammars = GrammarCompiler(lambda: CHARS)
    logits = torch.randn(3, 128, generator=torch.Generator().manual_seed(0))
    quote = CHARS.encode('"')[0]
    logits[1, quote] = -5.0  # the grammar's only choice is unlikely in the model's eyes
    rows = [
        RowSettings(temperature=0.7),
        RowSettings(temperature=temperature, knobs={"json_schema": grammars.sample_grammar(ENUM)}),
        RowSettings(temperature=0.7),
    ]
    sampler = BatchSampler(rows)
    assert sampler.rows_alike is None
    tokens, logprobs, _ = sampler.sample(logits, torch.Generator().manual_seed(1))
    assert tokens[1] == quote and logprobs[1] == pytest.approx(0.0, abs=1e-6)
    expected = torch.log_softmax(logits / 0.7, -1)
    for row in (0, 2):
        assert logprobs[row] == pytest.approx(expected[row, tokens[row]].item(), abs=1e-5)


def test_llguidance_is_imported_only_once_a_grammar_is_used():
    import subprocess
    import sys

    code = (
        "import sys\n"
        "import rlrun.inference.sampler, rlrun.inference.structured, rlrun.inference.engines.torch_core\n"
        "assert 'llguidance' not in sys.modules\n"
        "from rlrun.inference.structured import grammar\n"
        'grammar(\'{"type": "object"}\')\n'
        "assert 'llguidance' in sys.modules\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-2000:]

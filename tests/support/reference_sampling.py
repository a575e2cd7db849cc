"""The reference for what the engines sample from, written out position by position: shared by
the torch engine's unit tests and the vLLM check (which runs as a script from another venv)."""

import torch


def adjusted_logits(logits: torch.Tensor, prompt: list[int], completion: list[int], params) -> torch.Tensor:
    """`logits` [len(completion), V], the model's for each completion token, as the request's
    `params` (a GenerationParams) adjusted them: plus its logit bias, its stop tokens at -inf
    before min_tokens, then its repetition penalty over the prompt and the tokens generated
    before that one, less its presence and frequency penalties over those generated."""
    knobs = params.knobs
    penalties = knobs.get("penalties")
    presence, frequency, repetition = (
        (0.0, 0.0, 1.0)
        if penalties is None
        else (penalties.presence_penalty, penalties.frequency_penalty, penalties.repetition_penalty)
    )
    logits = logits.float().clone()
    for token, bias in knobs.get("logit_bias", {}).items():
        logits[:, token] += bias
    for position in range(min(knobs.get("min_tokens", 0), len(completion))):
        logits[position, params.stop_token_ids] = float("-inf")
    counts = torch.zeros(logits.shape[-1])
    in_prompt = torch.zeros(logits.shape[-1], dtype=torch.bool)
    in_prompt[prompt] = True
    for position, token in enumerate(completion):
        seen = in_prompt | (counts > 0)
        row = logits[position]
        factor = torch.where(row > 0, 1 / repetition, repetition)
        logits[position] = torch.where(seen, row * factor, row)
        logits[position] -= counts * frequency + (counts > 0) * presence
        counts[token] += 1
    return logits


def grammar_masked_logits(logits: torch.Tensor, completion: list[int], grammar) -> torch.Tensor:
    """`logits` [len(completion), V] with -inf wherever `grammar` (a fresh SampleGrammar),
    replayed through the completion, did not allow the token at that position."""
    from rlrun.inference.structured import allowed_tokens

    masked = logits.float().clone()
    bitmask = torch.empty(1, grammar.mask_words, dtype=torch.int32)
    for position in range(len(completion)):
        if position:
            grammar.accept(completion[position - 1])
        grammar.fill_mask(bitmask[0])
        masked[position].masked_fill_(~allowed_tokens(bitmask, masked.shape[1])[0], float("-inf"))
    return masked

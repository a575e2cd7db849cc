"""A Hugging Face checkpoint's tokenizer built offline: byte-level BPE with no merges (one
token per byte) plus special tokens. Shared by the tokenizer unit tests and the vLLM check
(which runs as a script from another venv)."""


def byte_level_tokenizer(eos_token: str, specials: list[str] = (), chat_template: str | None = None):
    """A transformers fast tokenizer: the 256 bytes, then `eos_token`, then `specials`."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {symbol: i for i, symbol in enumerate(pre_tokenizers.ByteLevel.alphabet())}
    core = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(tokenizer_object=core, chat_template=chat_template)
    fast.add_special_tokens({"eos_token": eos_token, "additional_special_tokens": list(specials)})
    return fast

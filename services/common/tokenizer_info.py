"""A tokenizer's identity (rlrun.common.wire.plan.TokenizerInfo): a name for people, a SHA-256
that two tokenizers share only when they give the same ids for the same conversation, the
vocabulary size and the chat format's end-of-message tokens. Inference reports the one it
serves; an env-server that renders ids itself declares the one it uses; the orchestrator
refuses to start when they differ (rlrun.orchestrator.run.connections)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from rlrun.common.tokenizer import CharTokenizer, Tokenizer, load_tokenizer
from rlrun.common.wire.plan import TokenizerInfo


def tokenizer_info(tokenizer: Tokenizer, source: str | Path) -> TokenizerInfo:
    """`source`: the tokenizer file (character tokenizers) or checkpoint directory it came from."""
    if isinstance(tokenizer, CharTokenizer):
        name = f"char:{Path(source).name}"
        # Ids are positions in specials + chars, and the chat format is fixed by the specials.
        spec = tokenizer.to_dict()
    else:
        hf = tokenizer.hf_tokenizer
        name = Path(source).name
        spec = {
            "vocab": sorted(hf.get_vocab().items(), key=lambda item: item[1]),
            "chat_template": hf.chat_template,
            "eos_token_id": tokenizer.eos_token_id,
        }
    digest = hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()
    return TokenizerInfo(
        name=name,
        sha256=digest,
        vocab_size=tokenizer.vocab_size,
        stop_token_ids=list(tokenizer.stop_token_ids),
    )


def load_with_info(
    tokenizer_path: Path | None, checkpoint_dir: Path | None
) -> tuple[Tokenizer, TokenizerInfo]:
    """The run's tokenizer ([model] tokenizer, else the checkpoint's) and its identity."""
    tokenizer = load_tokenizer(tokenizer_path, checkpoint_dir)
    source = tokenizer_path if tokenizer_path is not None else checkpoint_dir
    assert source is not None  # load_tokenizer refused the case with neither
    return tokenizer, tokenizer_info(tokenizer, source)


def mismatch(declared: TokenizerInfo, served: TokenizerInfo) -> list[str]:
    """The fields `declared` sets that differ from `served` ([] when it agrees or declares nothing)."""
    out = []
    if declared.name and declared.name != served.name:
        out.append(f"name {declared.name!r} != {served.name!r}")
    if declared.sha256 and declared.sha256 != served.sha256:
        out.append(f"sha256 {declared.sha256[:12]}… != {served.sha256[:12]}…")
    if declared.vocab_size and declared.vocab_size != served.vocab_size:
        out.append(f"vocab_size {declared.vocab_size} != {served.vocab_size}")
    return out

"""The tiny model definitions and character tokenizers that ship with the package.

`models/*.json` are transformers configs of the from-scratch demo models; `tokenizer/char` and
`tokenizer/lowercase` are the character tokenizers in Hugging Face's folder format. They are
package data, so installed code finds them without a checkout; the repository's
`configs/models` and `configs/tokenizer` are links to these folders (one copy of each file).
"""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parent
"""This package's folder: models/ and tokenizer/ lie under it."""
MODELS = ROOT / "models"
TOKENIZERS = ROOT / "tokenizer"


def model_config(name: str) -> Path:
    """The transformers config JSON of a shipped tiny model (`tiny-d64`, `tiny-gpt2-d64`, ...)."""
    path = MODELS / f"{name}.json"
    if not path.is_file():
        known = sorted(p.stem for p in MODELS.glob("*.json"))
        raise ValueError(f"no shipped model config {name!r}; known: {known}")
    return path


def tokenizer(name: str = "char") -> Path:
    """The folder of a shipped character tokenizer (`char` or `lowercase`)."""
    path = TOKENIZERS / name
    if not (path / "tokenizer.json").is_file():
        known = sorted(p.name for p in TOKENIZERS.iterdir() if p.is_dir())
        raise ValueError(f"no shipped tokenizer {name!r}; known: {known}")
    return path

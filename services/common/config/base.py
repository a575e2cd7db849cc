"""Shared base for every config section: unknown keys are errors, fields are documented."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Section(BaseModel):
    """A TOML table. Unknown keys fail validation so that typos never pass silently."""

    model_config = ConfigDict(extra="forbid", validate_default=True, use_attribute_docstrings=True)

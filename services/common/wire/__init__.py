"""The wire contract in process: one module per proto file of `proto/rlrun/v1`, each holding
the in-process types of its messages, their validation, and both conversions, shared by the
servicer and its clients.

Every `*_from_proto` validates what it builds and raises WireError naming the field; servers
turn that into INVALID_ARGUMENT, clients into a failed call. Malformed messages never get
further. No module outside this package (and the generated `rlrun.v1`) builds or reads a
proto message field by field (tests/unit/test_layering.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

from rlrun.common.errors import RequestError


class WireError(RequestError):
    """A message that breaks the contract; `field` is the path of the offending field."""


T = TypeVar("T")


def enum_from_proto(table: Mapping[Any, T], value: int, where: str, name: str) -> T:
    """`table[value]`, or a WireError naming `where` for a value it lacks (unknown, or the
    enum's UNSPECIFIED zero)."""
    try:
        return table[value]
    except KeyError:
        raise WireError(where, f"{where} has an unknown or unspecified {name} ({value})") from None

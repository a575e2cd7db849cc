"""Runtime registry (`rlrun.common.registry`): an env entry's `runtime = {type = ..., <options>}`
names a backend; the options are its constructor's keyword arguments. Installed backends come
from the entry point group `rlrun.runtimes`, others by import path `package.module:Class`."""

from __future__ import annotations

import inspect
from typing import Any

from rlrun.common.errors import did_you_mean
from rlrun.common.registry import Registry
from rlrun.env_server.sdk.sandbox import SandboxRuntime

RUNTIMES: Registry[type[SandboxRuntime]] = Registry("runtime", "rlrun.runtimes", SandboxRuntime)
RUNTIMES.register_path("local", "rlrun.env_server.runtimes.local:LocalRuntime")


class RuntimeOptionError(ValueError):
    """A runtime option is wrong; `field` names it (`type`, `memory_mb`, ...)."""

    def __init__(self, field: str, message: str):
        super().__init__(f"runtime.{field}: {message}")
        self.field = field
        self.message = message


def make_runtime(config: dict[str, Any]) -> SandboxRuntime:
    """The backend `config["type"]` built with the other keys; RuntimeOptionError naming the
    key that is wrong (an unknown one, or one the backend refuses)."""
    options = dict(config)
    kind = options.pop("type", None)
    if not isinstance(kind, str):
        raise RuntimeOptionError("type", f"a runtime needs a type, one of {sorted(RUNTIMES)}")
    try:
        cls = RUNTIMES.resolve(kind)
    except ValueError as error:
        raise RuntimeOptionError("type", str(error)) from None
    known = [name for name in inspect.signature(cls).parameters if name != "self"]
    for name in options:
        if name not in known:
            raise RuntimeOptionError(
                name,
                f"runtime {kind!r} takes no option {name!r}{did_you_mean(name, known)} "
                f"(its options: {', '.join(known)})",
            )
    return cls(**options)

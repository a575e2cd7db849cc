"""[[orchestrator.train.env]]: one environment, its worker pool, or an external env-server."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any, Literal

from pydantic import ConfigDict, Field, field_validator, model_validator

from rlrun.common.config.base import Section
from rlrun.common.config.deprecations import ConfigError
from rlrun.common.config.sampling import SamplingOverrides


class PoolConfig(Section):
    type: Literal["static", "elastic"] = "elastic"
    """`static`: a fixed number of worker processes. `elastic`: grows when in-flight work
    reaches 90% of capacity and shrinks when idle. Default: elastic (as the seed's)."""

    num_workers: int = Field(1, ge=1)
    """Worker processes of a static pool (the minimum of an elastic pool). Default: 1."""

    max_workers: int = Field(4, ge=1)
    """Most worker processes of an elastic pool. Default: 4 (or `num_workers` when that is
    larger)."""

    multiplex: int = Field(128, ge=1)
    """Concurrent rollouts one worker runs (its capacity). Default: 128."""

    idle_shrink_s: float = Field(30.0, gt=0)
    """An elastic pool retires a worker idle for this long. Default: 30."""

    @model_validator(mode="after")
    def _bounds(self) -> PoolConfig:
        if "max_workers" not in self.model_fields_set and self.max_workers < self.num_workers:
            self.max_workers = self.num_workers
        if self.type == "elastic" and self.max_workers < self.num_workers:
            raise ValueError("pool.max_workers must be >= pool.num_workers")
        return self


class HarnessConfig(Section):
    id: str
    """Harness id: `single-turn`, `multi-turn` (the env's `feedback` answers each turn),
    `tool-calling` (the env's `tools`), or the import path `package.module:Class` of a Harness
    subclass. Required."""

    args: dict[str, Any] = {}
    """Keyword arguments of the harness (e.g. `max_turns`). Default: {}."""


class RuntimeConfig(Section):
    """Where the env's episodes run commands: `{type = "local", memory_mb = 512, ...}`. The keys
    besides `type` are the backend's options (rlrun.env_server.runtimes), checked by
    `rlrun check-config` and the env-server as they build it."""

    model_config = ConfigDict(extra="allow")

    type: str
    """Backend: `local` (bubblewrap on the env-server's machine) or the import path
    `package.module:Class` of a SandboxRuntime subclass. Required."""


SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
"""An env entry's name goes into log and output file names and metric labels."""


def file_safe(text: str) -> str:
    """`text` with every run of characters a file name or label should not hold as one `-`:
    `letters.env:LetterShift` -> `letters.env-LetterShift`, `vf:reverse` -> `vf-reverse`."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", text).strip("-.") or "env"


class EnvConfig(Section):
    id: str
    """Environment id: a built-in (`reverse-text`, `alphabet-sort`, `arithmetic`, `tool-calc`, `code-sandbox`, `debate`,
    `dataset`: tasks from a data file or a Hugging Face dataset) or
    the import path `package.module:Class` of an Environment subclass. Required."""

    name: str | None = None
    """Name of this entry (log and output file names, metric labels): letters, digits, `_`, `.`
    and `-`. Must be unique. Default: the id with every other character run as `-`
    (`letters.env:LetterShift` -> `letters.env-LetterShift`)."""

    args: dict[str, Any] = {}
    """Keyword arguments of the environment (e.g. `min_len`, `max_len`). Default: {}."""

    harness: HarnessConfig | None = None
    """The harness that runs this env's episodes, e.g. `{id = "multi-turn", args = {max_turns =
    3}}`. Default: unset (the env's own)."""

    runtime: RuntimeConfig | None = None
    """The sandbox backend of an env that runs commands, e.g. `{type = "local", timeout_s = 5}`.
    Default: unset (the env's own, if it needs one)."""

    ratio: float = Field(1.0, gt=0)
    """Relative share of the groups this env gets. Default: 1."""

    algorithms: list[str] | None = None
    """Algorithms for this env's traces; unset means `orchestrator.algorithms`. Ids that are not
    builtin resolve to the env's own algorithms (RunAlgorithms). Default: unset."""

    sampling: SamplingOverrides = SamplingOverrides()
    """Sampling overrides for this env. Default: none."""

    pool: PoolConfig = PoolConfig()
    """Worker pool of the env-server that runs this env. Default: elastic, 1 to 4 workers of
    128 concurrent rollouts each."""

    address: str | None = None
    """host:port of an external env-server for this env; then none is started. Default: unset."""

    @field_validator("name")
    @classmethod
    def _safe_name(cls, name: str | None) -> str | None:
        if name is not None and not SAFE_NAME.fullmatch(name):
            raise ValueError(
                f"{name!r} is not a file-safe name: use letters, digits, `_`, `.` and `-` "
                f"(e.g. {file_safe(name)!r})"
            )
        return name

    @property
    def key(self) -> str:
        return self.name or file_safe(self.id)


STARTED_SERVER_KEYS = ("args", "harness", "runtime", "pool")
"""Keys of an env entry that configure the env-server rlrun starts for it."""


def check_external_envs(entries: Sequence[EnvConfig], where: str) -> None:
    """An external entry (one with `address`, as the user's run file gives it) has no
    env-server that rlrun starts, so nothing could honour its `args`, `harness`, `runtime` or `pool`: a
    ConfigError names the key. Checked where the user's file is read (rlrun.checks), not in
    the services, whose entries for started env-servers get an address from the launcher."""
    for i, entry in enumerate(entries):
        if not entry.address:
            continue
        for key in STARTED_SERVER_KEYS:
            if key in entry.model_fields_set:
                raise ConfigError(
                    f"{where}.{i}.{key}",
                    f"env {entry.key!r} is external (address = {entry.address!r}): rlrun starts no "
                    f"env-server for it, so nothing would honour its `{key}`; configure the "
                    f"env-server at {entry.address} itself and remove `{key}`",
                )

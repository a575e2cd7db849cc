"""Old spellings of config keys, translated on the raw TOML before validation.

Each translation emits exactly one warning naming the new key. Old and new spelling
together is an error, since silently preferring one would hide a mistake.
"""

from __future__ import annotations

from typing import Any


class ConfigError(ValueError):
    """A config that cannot be used. `path` is the dotted key path at fault."""

    def __init__(self, path: str, message: str):
        super().__init__(f"{path}: {message}" if path else message)
        self.path = path
        self.message = message


def _move(table: dict[str, Any], old: str, new: str, where: str, warnings: list[str]) -> None:
    if old not in table:
        return
    old_path, new_path = f"{where}.{old}".lstrip("."), f"{where}.{new}".lstrip(".")
    if new in table:
        raise ConfigError(
            old_path, f"deprecated key used together with its replacement {new_path}; keep only {new_path}"
        )
    table[new] = table.pop(old)
    warnings.append(f"{old_path} is deprecated; use {new_path}")


def _sampling_tables(raw: dict[str, Any]) -> list[tuple[dict[str, Any], str]]:
    orch = raw.get("orchestrator", {})
    tables: list[tuple[dict[str, Any], str]] = []
    train = orch.get("train", {})
    if isinstance(train.get("sampling"), dict):
        tables.append((train["sampling"], "orchestrator.train.sampling"))
    for i, env in enumerate(train.get("env", [])):
        if isinstance(env, dict) and isinstance(env.get("sampling"), dict):
            tables.append((env["sampling"], f"orchestrator.train.env.{i}.sampling"))
    ev = orch.get("eval", {})
    if isinstance(ev, dict) and isinstance(ev.get("sampling"), dict):
        tables.append((ev["sampling"], "orchestrator.eval.sampling"))
    return tables


def translate_deprecated(raw: dict[str, Any]) -> list[str]:
    """Rewrites old spellings in place; returns one warning per translated key."""
    warnings: list[str] = []
    orch = raw.get("orchestrator")
    if not isinstance(orch, dict):
        return warnings
    train = orch.setdefault("train", {}) if ("sampling" in orch or "env" in orch) else orch.get("train", {})
    if "sampling" in orch:
        if "sampling" in train:
            raise ConfigError(
                "orchestrator.sampling",
                "deprecated table used together with its replacement "
                "orchestrator.train.sampling; keep only orchestrator.train.sampling",
            )
        train["sampling"] = orch.pop("sampling")
        warnings.append("orchestrator.sampling is deprecated; use orchestrator.train.sampling")
    if "env" in orch:
        if "env" in train:
            raise ConfigError(
                "orchestrator.env",
                "deprecated table used together with its replacement "
                "orchestrator.train.env; keep only orchestrator.train.env",
            )
        train["env"] = orch.pop("env")
        warnings.append("orchestrator.env is deprecated; use orchestrator.train.env")
    for table, where in _sampling_tables(raw):
        _move(table, "max_tokens", "max_completion_tokens", where, warnings)
    for i, env in enumerate(train.get("env", []) if isinstance(train, dict) else []):
        if isinstance(env, dict):
            _translate_num_workers(env, f"orchestrator.train.env.{i}", warnings)
    ev = orch.get("eval")
    for i, env in enumerate(ev.get("env", []) if isinstance(ev, dict) else []):
        if isinstance(env, dict):
            _translate_num_workers(env, f"orchestrator.eval.env.{i}", warnings)
    return warnings


def _refuse_auto(value: Any, key: str) -> None:
    """`pool.num_workers` never had an "auto" spelling: only the legacy key maps it."""
    if value == "auto":
        raise ConfigError(
            key,
            '"auto" is the legacy `num_workers` value, not a pool size; the default pool is '
            "elastic (it grows with the work, up to pool.max_workers workers of pool.multiplex "
            f"rollouts each): remove {key}, or give a number of workers",
        )


def _translate_num_workers(env: dict[str, Any], where: str, warnings: list[str]) -> None:
    """The legacy per-env `num_workers`: "auto" becomes the default (elastic) pool; a number
    becomes a static pool of that many workers; given together with `pool`, the pool wins
    (as in the seed)."""
    pool = env.get("pool")
    if isinstance(pool, dict):
        _refuse_auto(pool.get("num_workers"), f"{where}.pool.num_workers")
    if "num_workers" not in env:
        return
    value = env.pop("num_workers")
    if "pool" in env:
        warnings.append(f"{where}.num_workers is deprecated and ignored: {where}.pool is given and wins")
        return
    if value == "auto":
        # The seed's "auto" meant "size it for me", which the default elastic pool does: the
        # entry keeps no pool key, so an external entry (no pool allowed) is not refused.
        warnings.append(
            f'{where}.num_workers = "auto" is deprecated; the default {where}.pool (elastic) '
            "is used: remove the key"
        )
        return
    env["pool"] = {"type": "static", "num_workers": value}
    warnings.append(
        f'{where}.num_workers is deprecated; use {where}.pool = {{type = "static", num_workers = N}}'
    )

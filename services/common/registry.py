"""The one registry idiom: algorithms, envs, harnesses, sampling knobs and engines are each a
`Registry` of named entries.

An entry is registered in three ways, all alike to the code that looks it up:
- built in: `registry.register(name, entry)` (or `@registry.register` on a class with a
  `name`) where rlrun defines it;
- installed: a Python entry point in the registry's group (`rlrun.<kind>`), e.g. in the
  plugin's pyproject.toml

      [project.entry-points."rlrun.knobs"]
      banned_token_ids = "my_plugin.knobs:BannedTokens"

  loaded the first time the registry is read, in every process that reads it (the torch
  engine's process too), so an out-of-tree entry needs no hand import;
- by import path, where the registry takes one: `package.module:attr` (`resolve`).
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable, Iterator, Mapping
from importlib import metadata
from typing import Any, Generic, TypeVar, overload

from rlrun.common.errors import did_you_mean

log = logging.getLogger(__name__)

T = TypeVar("T")


def import_path(path: str) -> Any:
    """The attribute `package.module:attr` names; ValueError naming what is wrong."""
    module_name, sep, attr = path.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"{path!r} is not an import path `package.module:attr`")
    try:
        return getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as error:
        raise ValueError(f"cannot import {path}: {error}") from None


class Registry(Mapping[str, T], Generic[T]):
    """Named entries of one kind, in registration order (built-in entries first, then the
    installed ones, by entry point name). An entry registered by import path, and an installed
    one, is imported the first time it is looked up, so that listing names imports nothing."""

    def __init__(self, kind: str, group: str, base: type | None = None):
        """`kind`: what an entry is, for messages ("algorithm", "sampling knob"); `group`: the
        entry point group of installed entries; `base`: the class every entry subclasses."""
        self.kind = kind
        self.group = group
        self.base = base
        self._entries: dict[str, T | _Lazy] = {}
        self._installed = False

    @overload
    def register(self, name: str, entry: T) -> T: ...

    @overload
    def register(self, name: T) -> T: ...

    def register(self, name: Any, entry: Any = None) -> Any:
        """`register(name, entry)`, or `register(cls)` (also as a class decorator) for a class
        whose `name` attribute is its name."""
        if entry is None:
            name, entry = name.name, name
        self._add(name, entry)
        return entry

    def register_path(self, name: str, path: str) -> None:
        """An entry imported from `package.module:attr` when first looked up."""
        self._add(name, _Lazy(path, lambda: import_path(path)))

    def _add(self, name: str, entry: Any) -> None:
        if name in self._entries:
            raise ValueError(f"{self.kind} {name!r} is registered already")
        self._entries[name] = entry

    def __delitem__(self, name: str) -> None:
        del self._entries[name]

    def _load_installed(self) -> None:
        """The names of the group's entry points, once per process (each loads when looked up).
        A built-in entry of the same name wins."""
        if self._installed:
            return
        self._installed = True
        for point in sorted(metadata.entry_points(group=self.group), key=lambda p: p.name):
            if point.name not in self._entries:
                self._entries[point.name] = _Lazy(
                    f"{point.value} (entry point group {self.group})", point.load
                )

    def __getitem__(self, name: str) -> T:
        self._load_installed()
        entry = self._entries[name]
        if isinstance(entry, _Lazy):
            entry = self._entries[name] = self._loaded(name, entry)
        return entry

    def _loaded(self, name: str, lazy: _Lazy) -> T:
        """An installed entry is meant to be used: one that does not load, or is not an entry,
        fails loudly naming it."""
        try:
            entry = lazy.load()
        except Exception as error:
            raise RuntimeError(f"the {self.kind} {name!r} of {lazy.source} does not load: {error}") from error
        if not self.is_entry(entry):
            raise RuntimeError(f"the {self.kind} {name!r} of {lazy.source} is not {self._what()}")
        return entry

    def is_entry(self, entry: Any) -> bool:
        return self.base is None or (isinstance(entry, type) and issubclass(entry, self.base))

    def _what(self) -> str:
        name = self.base.__name__ if self.base is not None else self.kind
        return f"{'an' if name[0].lower() in 'aeiou' else 'a'} {name} subclass"

    def __iter__(self) -> Iterator[str]:
        self._load_installed()
        return iter(list(self._entries))

    def __len__(self) -> int:
        self._load_installed()
        return len(self._entries)

    def __contains__(self, name: object) -> bool:
        self._load_installed()
        return name in self._entries

    def names(self) -> list[str]:
        return sorted(self)

    def resolve(self, ref: str) -> T:
        """A registered name, else an import path `package.module:attr` of an entry;
        ValueError naming what is wrong, with the nearest valid name."""
        if ref in self:
            return self[ref]
        module_name, sep, attr = ref.partition(":")
        if not sep or not module_name or not attr:
            raise ValueError(
                f"unknown {self.kind} {ref!r}{did_you_mean(ref, self)}; built-in ids are {self.names()}, "
                "or give an import path `package.module:Class`"
            )
        try:
            module = importlib.import_module(module_name)
        except ImportError as error:
            raise ValueError(
                f"{self.kind} {ref!r}: cannot import {module_name}: {error}; is the folder that holds "
                "it on PYTHONPATH? (`rlrun local` passes PYTHONPATH on to every service)"
            ) from None
        if not hasattr(module, attr):
            entries = [name for name, value in vars(module).items() if self.is_entry(value)]
            raise ValueError(
                f"{self.kind} {ref!r}: module {module_name} has no {attr!r}{did_you_mean(attr, entries)}"
            )
        entry = getattr(module, attr)
        if not self.is_entry(entry):
            raise ValueError(f"{self.kind} {ref!r} is not {self._what()}")
        return entry


class _Lazy:
    def __init__(self, source: str, load: Callable[[], Any]):
        self.source = source
        self.load = load

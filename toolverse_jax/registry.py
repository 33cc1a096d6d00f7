"""`Registry`: one by-name table (advantage estimators, losses, evaluations, TRACE scorers,
log-prob kernel implementations), so every table registers, refuses duplicates and names the
known entries the same way.

    LOSSES = Registry("policy loss", plural="policy losses")

    @LOSSES.register("ppo_clip")
    def ppo_clip(...): ...

    LOSSES.get("ppo_clip")     # unknown names raise UnknownNameError listing the registered ones
"""

from __future__ import annotations

from typing import Callable, Generic, Iterator, TypeVar

T = TypeVar("T")


class UnknownNameError(KeyError, ValueError):
    """A name missing from a `Registry`. Both a KeyError and a ValueError, so callers of the
    tables that raised either before keep working; prints its message unquoted."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class Registry(Generic[T]):
    """Name → entry table. `kind` names an entry in errors ("policy loss"); `hint` is appended
    to the unknown-name error and may use `{name}` (e.g. how to register one)."""

    def __init__(self, kind: str, plural: str | None = None, hint: str = ""):
        self.kind, self.plural, self.hint = kind, plural or kind + "s", hint
        self._entries: dict[str, T] = {}

    def register(self, name: str, entry: T | None = None) -> Callable[[T], T] | T:
        """Returns a decorator registering its argument as `name`; with `entry`, registers it
        and returns it. Registering the same object again is a no-op; another object under a
        taken name raises ValueError."""
        def add(obj: T) -> T:
            old = self._entries.get(name)
            if old is not None and old is not obj:
                where = getattr(old, "__module__", None)
                raise ValueError(f"{self.kind} {name!r} is already registered"
                                 f"{f' (in {where})' if where else ''}; pick another name")
            self._entries[name] = obj
            return obj
        return add if entry is None else add(entry)

    def get(self, name: str) -> T:
        """Returns the entry registered as `name`; raises `UnknownNameError` listing the names."""
        try:
            return self._entries[name]
        except (KeyError, TypeError):
            raise UnknownNameError(
                f"unknown {self.kind} {name!r} (not registered); registered {self.plural}: "
                f"{self.names()}"
                + (" " + self.hint.format(name=name) if self.hint else "")) from None

    def names(self) -> list[str]:
        """Returns the registered names, sorted."""
        return sorted(self._entries)

    __getitem__ = get

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}: {self.names()})"

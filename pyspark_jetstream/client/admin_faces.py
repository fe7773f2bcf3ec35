"""How one description of an admin action becomes a blocking call, a coroutine and a command.

An admin action is declared once, in :mod:`.admin`'s table, as an
:class:`AdminAction`: a blocking function of a
:class:`~.cluster.ClusterConnection` and the caller's arguments (its request
body, how the answer is read, its docstring), what it tells the client's
publisher when it changes a stream, and, where the ``jetstream`` command is a
plain pass-through, that command (:class:`Command`).  The faces are derived
from it and from nothing else:

- a :class:`BlockingFace` (``SyncClient``, :class:`~.admin.BlockingAdmin`) runs
  the function in the caller's thread;
- an :class:`AsyncFace` (``Client``, :class:`~.admin.Admin`) runs it in a worker
  thread, so the event loop never blocks on Flight;
- ``pyspark_jetstream.cli.admin_commands`` adds the declared commands.

An action is a descriptor: reading ``face.create_stream`` asks the face to bind
it (the face decides the thread and whom to tell), and the bound callable is
kept on the instance, so it is made once per client.  Its signature (without the
connection) and docstring are the function's, for ``help()`` and type checkers.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from typing import Any, Concatenate, Generic, ParamSpec, Protocol, TypeVar, overload

from pyspark_jetstream.protocol.flight import StreamInfo
from pyspark_jetstream.protocol.streams import StreamConfig

from .cluster import ClusterConnection

P = ParamSpec("P")
R = TypeVar("R")


class StreamListener(Protocol):
    """Who hears of a stream an admin call created, grew or deleted (the client's publisher, which
    routes by the stream's configuration)."""

    def learn(self, info: StreamInfo, config: StreamConfig) -> None: ...
    def forget(self, stream: str) -> None: ...


Tells = Callable[..., None]
"""What an action tells a :class:`StreamListener`: called as ``tells(listener, result, *args, **kwargs)``
with the action's result and the caller's arguments, after the call succeeded."""


def learns(listener: StreamListener, info: StreamInfo, *args: object, **kwargs: object) -> None:
    """Tell ``listener`` the stream ``info`` describes, as it now is."""
    listener.learn(info, StreamConfig.from_json(info.config))


def forgets(listener: StreamListener, result: None, name: str, *args: object, **kwargs: object) -> None:
    """Tell ``listener`` that stream ``name`` is gone."""
    listener.forget(name)


@dataclass(frozen=True)
class Argument:
    """One argument of a :class:`Command`: ``name`` positional, ``--name`` an option (``argparse``'s
    ``type``, ``default`` and ``help``); it is passed to the action as the keyword of its name."""

    name: str
    type: Callable[[str], Any] = str
    default: Any = None
    help: str | None = None

    @property
    def keyword(self) -> str:
        """The action's parameter it fills."""
        return self.name.lstrip("-").replace("-", "_")


@dataclass(frozen=True)
class Command:
    """An action's ``jetstream GROUP NAME`` command when it is a plain pass-through: the action is
    called with ``arguments`` and ``says(result, arguments)`` is printed."""

    group: str
    name: str
    help: str
    says: Callable[[Any, Mapping[str, Any]], str]
    arguments: tuple[Argument, ...] = ()


@dataclass(frozen=True)
class AdminAction(Generic[P, R]):
    """One admin action, declared once: ``call(cluster, *args, **kwargs)`` does it (blocking),
    ``tells`` says what the publisher hears of it, ``command`` is its CLI command, if any."""

    call: Callable[Concatenate[ClusterConnection, P], R]
    tells: Tells | None = None
    command: Command | None = None
    name: str = field(default="", init=False)

    def __set_name__(self, owner: type, name: str) -> None:
        object.__setattr__(self, "name", name)

    @overload
    def __get__(self, face: None, owner: type | None = None) -> AdminAction[P, R]: ...
    @overload
    def __get__(self, face: BlockingFace, owner: type | None = None) -> Callable[P, R]: ...
    @overload
    def __get__(self, face: AsyncFace, owner: type | None = None) -> Callable[P, Coroutine[Any, Any, R]]: ...
    def __get__(self, face: object, owner: type | None = None) -> object:
        if face is None:
            return self
        if not isinstance(face, BlockingFace | AsyncFace):
            raise TypeError(f"{type(face).__name__} is neither a blocking nor an asynchronous face")
        bound = face.bind(self)
        face.__dict__[self.name] = bound  # made once per face: later reads find it first
        return bound

    def dressed(self, run: Callable[..., Any]) -> Callable[..., Any]:
        """``run`` with the action's name, docstring and signature (without the connection)."""
        functools.update_wrapper(run, self.call)
        run.__name__ = run.__qualname__ = self.name
        signature = inspect.signature(self.call)
        run.__signature__ = signature.replace(  # type: ignore[attr-defined]
            parameters=list(signature.parameters.values())[1:]
        )
        return run


def actions_of(owner: type) -> list[AdminAction[Any, Any]]:
    """Every action ``owner`` declares or inherits, in declaration order."""
    found: dict[str, AdminAction[Any, Any]] = {}
    for klass in reversed(owner.__mro__):
        found.update((n, v) for n, v in vars(klass).items() if isinstance(v, AdminAction))
    return list(found.values())


class BlockingFace:
    """A face whose admin calls block the caller; subclasses say how to bind an action."""

    def bind(self, action: AdminAction[P, R]) -> Callable[P, R]:
        """``action`` as a blocking call of this face."""
        raise NotImplementedError


class AsyncFace:
    """A face whose admin calls are coroutines; subclasses say how to bind an action."""

    def bind(self, action: AdminAction[P, R]) -> Callable[P, Coroutine[Any, Any, R]]:
        """``action`` as a coroutine function of this face."""
        raise NotImplementedError


class InCallersThread(BlockingFace):
    """Runs each action in the caller's thread, on ``cluster`` (thread-safe, as it is);
    ``listener`` hears of streams changed, in the caller's thread; ``check`` runs before each
    call (a closed client's refusal)."""

    def __init__(
        self,
        cluster: ClusterConnection,
        listener: StreamListener,
        check: Callable[[], None] = lambda: None,
    ) -> None:
        self.cluster = cluster
        self.listener = listener
        self.check = check

    def bind(self, action: AdminAction[P, R]) -> Callable[P, R]:
        """``action`` run in the caller's thread."""

        def run(*args: P.args, **kwargs: P.kwargs) -> R:
            self.check()
            result = action.call(self.cluster, *args, **kwargs)
            if action.tells is not None:
                action.tells(self.listener, result, *args, **kwargs)
            return result

        return action.dressed(run)


class InWorkerThreads(AsyncFace):
    """Runs each action in a worker thread, on ``cluster``, so the event loop never blocks on
    Flight; ``listener`` hears of streams changed, on the event loop."""

    def __init__(self, cluster: ClusterConnection, listener: StreamListener) -> None:
        self.cluster = cluster
        self.listener = listener

    def bind(self, action: AdminAction[P, R]) -> Callable[P, Coroutine[Any, Any, R]]:
        """``action`` as a coroutine function running it in a worker thread."""

        async def run(*args: P.args, **kwargs: P.kwargs) -> R:
            result = await asyncio.to_thread(action.call, self.cluster, *args, **kwargs)
            if action.tells is not None:
                action.tells(self.listener, result, *args, **kwargs)
            return result

        return action.dressed(run)

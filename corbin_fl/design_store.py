"""Solved designs on disk: shipped with the app, else solved once and cached.

Some mechanisms release through a design solved numerically ahead of time (I-MVU's table: from
seconds to minutes per budget). Such a mechanism's module declares its kind of design
(:class:`DesignKind`: the cache's folder, the package folder of the designs shipped with the
app, each design's file name and JSON document, how one read back is checked, how one is solved);
the store here knows no mechanism. :func:`designs` gives a kind's store (one per process), and
:meth:`DesignStore.get` looks a key up, in order, in the files shipped with the app
(``corbin_fl/<shipped>/``, :attr:`DesignStore.shipped`), in the user's cache
(``$CORBIN_FL_CACHE/<folder>/``, default ``~/.cache/corbin-fl/<folder>/``), else solves it (the
kind may look other keys up through the store first) and stores it in the cache. Every file holds
its inputs; one whose inputs differ, or that the kind's ``decode`` refuses (I-MVU: a table that
is not stochastic, unbiased and exactly eps-LDP), is ignored, so a tampered file cannot weaken
the privacy. Files are written atomically and durably (:mod:`corbin_fl.fsio`); an unwritable
cache only costs the solve next time.
"""

from __future__ import annotations

import functools
import json
import logging
import threading
from collections.abc import Callable, Hashable
from pathlib import Path
from typing import Any, Generic, Protocol, TypeVar

from corbin_fl.fsio import CACHE_ENV, atomic_write_json, cache_root

__all__ = ["CACHE_ENV", "DesignKind", "DesignStore", "designs"]

logger = logging.getLogger(__name__)

K = TypeVar("K", bound=Hashable)
D = TypeVar("D")


class DesignKind(Protocol[K, D]):
    """A kind of solved design, keyed by ``K`` (hashable, checked by its constructor), of type
    ``D``: what a mechanism's module declares (``mechanisms.baselines.imvu.MVUDesigns``)."""

    @property
    def folder(self) -> str:
        """The cache's folder under :func:`corbin_fl.fsio.cache_root`."""
        ...

    @property
    def shipped(self) -> str:
        """The folder of the package ``corbin_fl`` that holds the designs solved ahead."""
        ...

    @property
    def label(self) -> str:
        """The designs' name in log messages."""
        ...

    def file_name(self, key: K) -> str:
        """The file name of ``key``'s design (in both folders)."""
        ...

    def key_of(self, design: D) -> K:
        """The key ``design`` was solved for."""
        ...

    def encode(self, design: D) -> dict[str, Any]:
        """``design`` with its inputs as plain JSON types."""
        ...

    def decode(self, doc: Any, key: K) -> D | None:
        """The checked design in ``doc`` if it is ``key``'s, else None; raises ``ValueError``,
        ``KeyError`` or ``TypeError`` for a document it refuses."""
        ...

    def solve(self, key: K, design: Callable[[K], D]) -> D:
        """Solve ``key``'s design; ``design`` looks another key up through the store."""
        ...


class DesignStore(Generic[K, D]):
    """The designs of one kind on disk (module docstring); :func:`designs` gives the process's
    store of a kind.

    Parameters
    ----------
    kind : DesignKind
        The kind of design.
    shipped : Path, optional
        The folder of the designs shipped with the app; default ``corbin_fl/<kind.shipped>/``.
    """

    def __init__(self, kind: DesignKind[K, D], shipped: Path | None = None) -> None:
        self.kind = kind
        self.shipped = Path(__file__).with_name(kind.shipped) if shipped is None else Path(shipped)
        self._memo = functools.lru_cache(maxsize=64)(self._lookup)

    def cache_dir(self) -> Path:
        """``<kind.folder>/`` under :func:`corbin_fl.fsio.cache_root` (``$CORBIN_FL_CACHE``)."""
        return cache_root() / self.kind.folder

    def read(self, path: Path, key: K) -> D | None:
        """The design stored at ``path`` if it is ``key``'s and passes the kind's check, else
        None (a warning says why, unless the file does not exist)."""
        label = self.kind.label
        try:
            doc = json.loads(Path(path).read_text())
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            logger.warning("%s table %s unreadable (%s)", label, path, exc)
            return None
        try:
            design = self.kind.decode(doc, key)
        except (ValueError, KeyError, TypeError) as exc:
            logger.warning("%s table %s refused (%s)", label, path, exc)
            return None
        if design is None:
            logger.warning("%s table %s holds other inputs", label, path)
        return design

    def write(self, design: D, folder: Path) -> Path:
        """Store ``design`` with its inputs in ``folder`` (atomic, durable); returns the file."""
        path = Path(folder) / self.kind.file_name(self.kind.key_of(design))
        atomic_write_json(path, self.kind.encode(design), allow_nan=False)
        return path

    def get(self, key: K) -> D:
        """``key``'s design, solved at most once per machine (module docstring); remembered in
        the process (the 64 most recent keys)."""
        return self._memo(key)

    def cache_clear(self) -> None:
        """Forget the designs remembered in the process (the files stay)."""
        self._memo.cache_clear()

    def _lookup(self, key: K) -> D:
        name = self.kind.file_name(key)
        for folder in (self.shipped, self.cache_dir()):
            found = self.read(folder / name, key)
            if found is not None:
                return found
        design = self.kind.solve(key, self.get)
        try:
            self.write(design, self.cache_dir())
        except OSError as exc:
            logger.warning("%s cache %s not written (%s)", self.kind.label, self.cache_dir(), exc)
        return design


_STORES: dict[object, DesignStore[Any, Any]] = {}
"""Kind -> its store (a kind is hashable: a frozen dataclass)."""
_STORES_LOCK = threading.Lock()


def designs(kind: DesignKind[K, D]) -> DesignStore[K, D]:
    """The process's store of ``kind`` (one per kind, so that its designs are remembered once)."""
    with _STORES_LOCK:
        store = _STORES.get(kind)
        if store is None:
            store = _STORES[kind] = DesignStore(kind)
    return store

"""The Flower version this project runs on, and a check that fails early, naming both versions.

Flower refuses a peer of another ``major.minor`` release (a SuperNode, SuperExec, ClientApp or
CLI of 1.41 against a 1.42 SuperLink exits with code 606, Flower's
``RUNTIME_VERSION_INCOMPATIBLE``), and a mismatch shows up late, as a gRPC error or a run that
never starts. This module says it at the start instead: :func:`check_flower` is called where the
running Flower version can be read (the ``corbin-fl`` command, the ServerApp's ``main``, the
ClientApp's ``lifespan``), and :func:`check_app_requirement` where an app's own ``flwr``
requirement can be read (the ``pyproject.toml`` of the app ``corbin-fl`` starts, which is the
FAB's). Both raise :class:`FlowerVersionError` with a message naming the two versions.

``FLOWER_SERIES`` is the one place the supported series is written in the code; pyproject.toml's
``flwr`` pins, docker/requirements.txt and the Dockerfiles' ``FLWR_VERSION`` must agree with it
(tests/unit/test_flower_version.py checks).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from importlib import metadata
from typing import Final

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

logger = logging.getLogger(__name__)

FLOWER_SERIES: Final[str] = "1.42"
"""The ``major.minor`` Flower release every component of a deployment must share."""

FLOWER_REQUIREMENT: Final[str] = f"flwr=={FLOWER_SERIES}.*"
"""The pip requirement that installs it (as pyproject.toml writes it)."""


class FlowerVersionError(RuntimeError):
    """The Flower version found is not the one this project runs on; the message names both."""


def installed_flower_version() -> str:
    """The version of the ``flwr`` distribution installed for this interpreter.

    Raises
    ------
    FlowerVersionError
        If flwr is not installed.
    """
    try:
        return metadata.version("flwr")
    except metadata.PackageNotFoundError:
        raise FlowerVersionError(
            f"flwr is not installed; this project runs on Flower {FLOWER_SERIES} "
            f"(pip install '{FLOWER_REQUIREMENT}')"
        ) from None


def _series(version: str, what: str) -> tuple[int, int]:
    """``(major, minor)`` of ``version``; :class:`FlowerVersionError` naming ``what`` if invalid."""
    if not isinstance(version, str):
        raise FlowerVersionError(f"{what}: a version must be a string, not {type(version)!r}")
    try:
        parsed = Version(version)
    except InvalidVersion:
        raise FlowerVersionError(f"{what}: {version!r} is not a version") from None
    return parsed.major, parsed.minor


def supported(version: str) -> bool:
    """Whether ``version`` is of the supported series (same ``major.minor`` as
    :data:`FLOWER_SERIES`; Flower's own rule for peers, so any patch release is accepted)."""
    return _series(version, "Flower version") == _series(f"{FLOWER_SERIES}.0", "FLOWER_SERIES")


def check_flower(component: str, version: str | None = None) -> str:
    """Check that ``component`` runs on the supported Flower series; return its version.

    ``version`` defaults to the installed flwr's (:func:`installed_flower_version`).

    Raises
    ------
    FlowerVersionError
        If it is of another ``major.minor`` release, with both versions and what to do.
    ValueError
        If ``component`` is empty.
    """
    if not isinstance(component, str) or not component.strip():
        raise ValueError("component must be a non-empty string naming what runs on Flower")
    found = installed_flower_version() if version is None else version
    if not supported(found):
        raise FlowerVersionError(
            f"{component} runs on flwr {found}, but CorBin-FL needs Flower {FLOWER_SERIES} "
            f"({FLOWER_REQUIREMENT}); every component of a deployment must be of the same "
            f"major.minor release (Flower refuses the others with exit code 606): "
            f"pip install '{FLOWER_REQUIREMENT}', or rebuild the images (docker/build-images.sh)"
        )
    logger.debug("%s: flwr %s (supported series %s)", component, found, FLOWER_SERIES)
    return found


def check_app_requirement(dependencies: Iterable[str], source: str, version: str) -> None:
    """Check that an app's ``flwr`` requirement admits Flower ``version`` (the one installed).

    ``dependencies`` are the PEP 508 strings of the app's ``[project].dependencies``, ``source``
    names where they come from (its pyproject.toml). An app without a ``flwr`` requirement is
    accepted.

    Raises
    ------
    FlowerVersionError
        If the requirement excludes ``version``, naming the requirement, the file and ``version``.
    """
    for text in dependencies:
        try:
            requirement = Requirement(text)
        except InvalidRequirement as exc:
            raise FlowerVersionError(f"{source}: invalid dependency {text!r} ({exc})") from None
        if canonicalize_name(requirement.name) != "flwr":
            continue
        if not requirement.specifier.contains(version, prereleases=True):
            raise FlowerVersionError(
                f"{source} requires {text!r}, but flwr {version} is installed (CorBin-FL runs "
                f"on Flower {FLOWER_SERIES}, {FLOWER_REQUIREMENT}): change the app's "
                f"requirement to {FLOWER_REQUIREMENT!r}, or install the Flower it asks for"
            )

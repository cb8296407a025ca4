"""What tests of the privacy report need to look into it: every key of a nested JSON object."""

from __future__ import annotations


def keys(obj: object) -> set[str]:
    """Every key of a nested JSON object (dicts inside dicts and lists, at any depth)."""
    if isinstance(obj, dict):
        return set(obj) | set().union(*(keys(v) for v in obj.values()))
    if isinstance(obj, list):
        return set().union(*(keys(v) for v in obj))
    return set()

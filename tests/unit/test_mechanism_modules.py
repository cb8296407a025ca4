"""One module per mechanism: the code that carries a shipped mechanism's name (issue 41, item 1).

For every registered mechanism, the product files whose code names it (identifiers, keys,
strings; not docstrings, not comments) are its own module (:data:`MODULES`: its math, and what
of its encoder, aggregator and secure-sum form is its own) and the one registration list
(``corbin_fl/registry.py``: the declarative entries, the parameters' wire order): 2 files. The
rest of the product derives what it needs from the registered entry (the config's keys, the
wire's key sets, ``CorBin``'s keywords, the node policy's default, the accounting's category,
the secure sum's levels and trials, the encoder's and aggregator's steps).

A name is matched as a run of whole words: identifiers and strings are split into words at
anything not a letter or digit and at case changes (``FedCADAggregator`` is ``fed``, ``cad``,
``aggregator``), so ``cq`` matches ``CQAggregator`` and ``cq_seed`` but not ``acquire``, and
``central-gaussian`` matches ``central_gaussian`` but not ``gaussian`` alone. A mechanism's
parameter keys (``pbm-trials``, ``central-clip``) count as its name.

:data:`ALLOWED` lists the files that still name a mechanism beyond those two, each with its
reason; it can only shrink: an entry whose file no longer names the mechanism fails too.
"""

from __future__ import annotations

import ast
import functools
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_import_graph import ROOT, product_modules

from corbin_fl import registry

REGISTRATION_LIST = "corbin_fl.registry"
"""The one registration list: every mechanism's declarative entry, in registration order."""

MODULES: dict[str, str] = {
    "augcorbin": "corbin_fl.mechanisms.augcorbin",
    "ldpfl": "corbin_fl.mechanisms.quantizers",
    "gaussian": "corbin_fl.mechanisms.baselines.gaussian",
    "laplace": "corbin_fl.mechanisms.baselines.laplace",
    "fedavg": "corbin_fl.mechanisms.baselines.vanilla",
    "cq": "corbin_fl.mechanisms.baselines.cq",
    "ternary": "corbin_fl.mechanisms.baselines.ternary",
    "fedcad": "corbin_fl.mechanisms.baselines.fedcad",
    "pbm": "corbin_fl.mechanisms.baselines.pbm",
    "rqm": "corbin_fl.mechanisms.baselines.rqm",
    "imvu": "corbin_fl.mechanisms.baselines.imvu",
    "signsgd": "corbin_fl.mechanisms.baselines.signsgd",
    "central-gaussian": "corbin_fl.mechanisms.baselines.central_gaussian",
}
"""Each shipped mechanism's own module."""

PROTOCOL: frozenset[str] = frozenset({"corbin"})
"""Not checked: ``corbin`` is the protocol itself and the installed name (``corbin_fl``)."""

ALLOWED: dict[str, dict[str, str]] = {}
"""Mechanism -> module still naming it beyond its module and the registration list -> why."""

FIELD_TERMS: dict[str, str] = {
    "gaussian": "the Gaussian distribution and the DP primitive that adds it (the analytic "
    "Gaussian mechanism, mechanisms/analytic_gaussian.py; GDP composition), which the gaussian, "
    "fedcad and central-gaussian mechanisms and the accounting all use",
    "fedavg": "FedAvg, the federated averaging algorithm (McMahan et al. 2017): Flower's strategy "
    "class that CorBin wraps (app/server_app.py), and DP-FedAvg, the central mechanism's "
    "algorithm (threat_models.py)",
}
"""Mechanisms whose name is also a term of the field -> what else the word means there.

Such a name counts only where the code means the mechanism: a text that *is* its name (the run
config's value, a registry key, a dispatch ``mechanism == "gaussian"``, a variable or an import
named so) or its module (an import of it, a ``"module:function"`` hook of it); not the term
inside a longer identifier or sentence (``analytic_gaussian_sigma``, ``gaussian_epsilon``,
``"analytic Gaussian noise"``), which names the mathematics, not this mechanism. Identifiers
named after the mechanism in another module would slip through this rule: keep such names to the
mechanism's module."""

_WORD = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|\d+")


def words(text: str) -> list[str]:
    """``text`` split into lower-case words (at non-alphanumerics and case changes)."""
    return [w.lower() for w in _WORD.findall(text)]


def carries(text: list[str], name: list[str]) -> bool:
    """Whether a run of consecutive words of ``text`` spells ``name`` (its words joined)."""
    target = "".join(name)
    for i in range(len(text)):
        spelled = ""
        for word in text[i:]:
            spelled += word
            if spelled == target:
                return True
            if not target.startswith(spelled):
                break
    return False


def _docstrings(tree: ast.Module) -> set[int]:
    """``id`` of every docstring constant: a string statement in a body (the first one of a
    module, class or function, and an attribute's docstring after its assignment)."""
    out: set[int] = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        for stmt in body if isinstance(body, list) else ():
            if (
                isinstance(stmt, ast.Expr)
                and isinstance(stmt.value, ast.Constant)
                and isinstance(stmt.value.value, str)
            ):
                out.add(id(stmt.value))
    return out


def code_texts(source: str) -> Iterator[str]:
    """Every identifier and every string constant of ``source`` that is not a docstring."""
    tree = ast.parse(source)
    docs = _docstrings(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            if id(node) not in docs:
                yield node.value
        elif isinstance(node, ast.Name):
            yield node.id
        elif isinstance(node, ast.Attribute):
            yield node.attr
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            yield node.name
        elif isinstance(node, ast.arg) or (isinstance(node, ast.keyword) and node.arg):
            yield node.arg
        elif isinstance(node, ast.alias):
            yield node.name
            if node.asname:
                yield node.asname
        elif isinstance(node, ast.ImportFrom) and node.module:
            yield node.module


@functools.cache
def _product_words() -> dict[str, list[list[str]]]:
    """Product module -> the words of each of its code texts."""
    return {
        name: [words(t) for t in code_texts(path.read_text(encoding="utf-8"))]
        for name, path in product_modules(ROOT).items()
    }


def names_term(text: str, mechanism: str) -> bool:
    """Whether ``text`` names the mechanism ``mechanism`` of :data:`FIELD_TERMS`: it is the name
    or the mechanism's module (an import of it, a ``"module:function"`` of it)."""
    module = MODULES[mechanism]
    return text in (mechanism, module) or text.startswith((f"{module}:", f"{module}."))


@functools.cache
def _product_texts() -> dict[str, list[str]]:
    """Product module -> its code texts."""
    return {
        name: list(code_texts(path.read_text(encoding="utf-8")))
        for name, path in product_modules(ROOT).items()
    }


def naming_modules(mechanism: str) -> set[str]:
    """The product modules whose code names ``mechanism`` or one of its parameter keys (a name
    of :data:`FIELD_TERMS` by :func:`names_term`)."""
    keys = [words(p.key) for p in registry.get(mechanism).params]
    if mechanism not in FIELD_TERMS:
        keys.append(words(mechanism))
    found = {
        module
        for module, texts in _product_words().items()
        if any(carries(text, name) for text in texts for name in keys)
    }
    if mechanism in FIELD_TERMS:
        found |= {
            module
            for module, texts in _product_texts().items()
            if any(names_term(text, mechanism) for text in texts)
        }
    return found


SHIPPED = [name for name in registry.REGISTRY if name not in PROTOCOL]


def test_the_word_matching() -> None:
    assert words("FedCADAggregator") == ["fed", "cad", "aggregator"]
    assert carries(words("FedCADAggregator"), words("fedcad"))
    assert carries(words("CQAggregator"), words("cq"))
    assert carries(words("_pbm_levels"), words("pbm"))
    assert carries(words("pbm(M=2)"), words("pbm"))
    assert carries(words("central_clip"), words("central-clip"))
    assert not carries(words("acquire"), words("cq"))
    assert not carries(words("analytic_gaussian"), words("central-gaussian"))
    assert not carries(words("mvu_table"), words("imvu"))
    docs = list(code_texts('"""pbm"""\nX = 1\n"""pbm again"""\ndef f(a):\n    """pbm"""\n'))
    assert not any("pbm" in t for t in docs)
    assert "pbm" in list(code_texts('x = {"pbm": f"pbm(M={m})"}  # pbm\n'))


def test_a_term_of_the_field_counts_where_it_names_the_mechanism() -> None:
    assert set(FIELD_TERMS) <= set(MODULES)
    module = MODULES["gaussian"]
    for text in ("gaussian", module, f"{module}:block_release"):
        assert names_term(text, "gaussian"), text
    for text in ("analytic_gaussian_sigma", "gaussian_epsilon", "analytic Gaussian noise", "gdp"):
        assert not names_term(text, "gaussian"), text
    assert not names_term(f"{MODULES['central-gaussian']}", "gaussian")
    assert names_term("fedavg", "fedavg")
    assert not any(names_term(t, "fedavg") for t in ("FedAvg", "SeededFedAvg", "DP-FedAvg's"))


def test_every_shipped_mechanism_names_its_module() -> None:
    assert set(MODULES) == set(SHIPPED), "name each mechanism's own module in MODULES"
    modules = product_modules(ROOT)
    assert all(module in modules for module in MODULES.values())
    assert set(ALLOWED) <= set(MODULES)


@pytest.mark.parametrize("mechanism", SHIPPED)
def test_a_mechanism_is_named_in_its_module_and_the_registration_list_only(
    mechanism: str,
) -> None:
    extra = naming_modules(mechanism) - {MODULES[mechanism], REGISTRATION_LIST}
    allowed = ALLOWED.get(mechanism, {})
    new = sorted(extra - set(allowed))
    assert not new, (
        f"{mechanism} is named in {new} besides {MODULES[mechanism]} and {REGISTRATION_LIST}: "
        "derive it from the registered entry, or move the code into the mechanism's module"
    )
    stale = sorted(set(allowed) - extra)
    assert not stale, f"{mechanism} is no longer named in {stale}: take them off ALLOWED"


def test_the_registration_list_is_one_file() -> None:
    """Every entry of the registry is declared in the registration list's file."""
    path = product_modules(ROOT)[REGISTRATION_LIST]
    assert isinstance(path, Path)
    texts = [words(t) for t in code_texts(path.read_text(encoding="utf-8"))]
    for name in SHIPPED:
        assert any(carries(text, words(name)) for text in texts), name

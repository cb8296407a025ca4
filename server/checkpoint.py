"""Server checkpoints: what a crashed run needs to resume, written atomically after every round.

Layout under ``<out-dir>/checkpoint/``:

- ``state.json``: the commit point. Format version, the last completed round ``t``, the run
  configuration (to refuse a resume with a different mechanism, model, data, seed, ...), the
  number of parameters, the file name and SHA-256 of the global model after round ``t`` and of
  the best-validation model, the patience counter of the paper's checkpoint rule (Section V.3),
  the ``metrics.jsonl`` rows of rounds ``1..t``, the privacy ledger
  (:class:`mechanisms.accounting.PrivacyLedger`: one event per released update) and the Flower
  run ids that contributed.
- ``model-<t>.npy`` / ``best-<t>.npy``: float32 ``[m]`` vectors (``np.save``, no pickle).
- ``releases.jsonl``: journal of the releases of the round in flight (one fsynced line per
  accepted update), so that updates released in a round that a crash aborted are still counted
  by the ledger when the run resumes (a released update costs privacy whether or not its round
  completed).

Every file is written to a temporary file in the same folder, flushed, ``fsync``-ed and renamed
over the old one (``os.replace``), and the folder is ``fsync``-ed; ``state.json`` is written
last and names the model files by round, so a crash at any instant leaves either the previous
or the new checkpoint, never a mix. Model files that no commit references any more are removed
after the commit.

What the server's public random choices need is stateless: every generator of a round is
``numpy.random.default_rng([seed, round, purpose])`` (:meth:`server.round.ServerRuntime.rng`), so a
resumed round ``t`` samples, splits and pairs exactly as the uninterrupted run would have (given
the same connected node ids). X25519 public keys known for the next round are NOT kept: a resumed
round runs the ``keygen`` stage again. Nothing secret is ever written: the server never sees a pair
seed, a private key, a pair key or a role (lead/follow), and the checkpoint holds no public key
or relayed ciphertext either.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import io
import json
import logging
import math
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import numpy as np
import torch

from corbin_fl import registry
from corbin_fl.config import RunConfig
from corbin_fl.fsio import atomic_write_bytes, atomic_write_text
from corbin_fl.mechanisms.accounting import PrivacyEvent, PrivacyLedger
from corbin_fl.server.metrics import jsonable

logger = logging.getLogger(__name__)

CHECKPOINT_DIR: Final[str] = "checkpoint"
STATE_FILE: Final[str] = "state.json"
JOURNAL_FILE: Final[str] = "releases.jsonl"
FORMAT_VERSION: Final[int] = 1

MAY_DIFFER_ON_RESUME: Final[frozenset[str]] = RunConfig.resumable_keys()
"""The protocol's run-config keys a resumed run may change (declared on the ``RunConfig`` fields):
the run length, the smallest cohort, and every key that cannot change the result (timeouts, where
the server computes, test instrumentation). Every other key (mechanism, privacy parameters, seeds,
aggregation; an app's model, data and training) must equal the checkpoint's, or the resumed run
would not continue the same experiment. A run's own config may declare more (an app's config that
extends ``RunConfig``: its :meth:`~corbin_fl.config.RunConfig.resumable_keys`), and the
checkpoint uses that."""


class CheckpointError(ValueError):
    """No usable checkpoint: missing, corrupt, or written by a run with another configuration."""


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _npy_bytes(vec: torch.Tensor) -> bytes:
    buf = io.BytesIO()
    np.save(buf, vec.detach().to("cpu", torch.float32).contiguous().numpy(), allow_pickle=False)
    return buf.getvalue()


# ============================================================================ ledger events
def release_event(
    cfg: RunConfig, rnd: int, node: int, num_params: int, *, paired: bool
) -> PrivacyEvent:
    """The ledger event of one released update (one client, one round).

    Parameters
    ----------
    cfg : RunConfig
        Run configuration: mechanism, per-parameter budget ``eps_p`` (``epsilon``), ``d`` and
        the mechanism ``delta`` of the Gaussian / FedCAD baselines.
    rnd : int
        Round of the release, ``>= 1``.
    node : int
        Flower node id of the client.
    num_params : int
        Released parameters ``m`` (one value per model parameter).
    paired : bool
        Whether the client quantized with its pair's common randomness (CorBinQ, Alg. 2); such
        releases are also accounted in the pair-joint view (threat model B). Ignored (False) for
        the mechanisms that do not pair.

    Returns
    -------
    PrivacyEvent
        The registered mechanism's event (:meth:`corbin_fl.registry.Mechanism.release`):
        ``eps_p = epsilon`` (``None`` for cq/fedavg, which give no DP), ``d`` for a paired
        release, ``delta`` for gaussian/fedcad.
    """
    return registry.get(cfg.mechanism).release(cfg, rnd, node, num_params, paired=paired)


# ============================================================================ state
@dataclass
class TrainingState:
    """What the round loop carries from round to round (and a checkpoint restores).

    Attributes
    ----------
    round : int
        Last completed round ``t`` (0 before round 1).
    weights : torch.Tensor
        Global model after round ``t``, float32 ``[m]``.
    best : dict[str, Any]
        Best-validation round and its evaluation: ``round``, ``val_accuracy``, ``val_loss``,
        ``test_accuracy``, ``test_loss`` (model selection on validation only, paper Sec. V.3).
    best_weights : torch.Tensor
        The model of ``best["round"]``, float32 ``[m]``.
    since_best : int
        Rounds since validation accuracy last improved (the patience counter).
    history : list[dict[str, Any]]
        The ``metrics.jsonl`` rows of rounds ``1..t``.
    ledger : PrivacyLedger
        Every released update so far.
    run_ids : list[int]
        Flower run ids that contributed rounds (one per start or resume).
    aborted_releases : list[dict[str, Any]]
        Releases of rounds a crash aborted (already in ``ledger``): ``{"run_id", "round",
        "node"}``.
    """

    round: int
    weights: torch.Tensor
    best: dict[str, Any]
    best_weights: torch.Tensor
    since_best: int = 0
    history: list[dict[str, Any]] = field(default_factory=list)
    ledger: PrivacyLedger = field(default_factory=PrivacyLedger)
    run_ids: list[int] = field(default_factory=list)
    aborted_releases: list[dict[str, Any]] = field(default_factory=list)


def config_mismatches(
    saved: Mapping[str, Any],
    current: Mapping[str, Any],
    may_differ: frozenset[str] = MAY_DIFFER_ON_RESUME,
) -> dict[str, str]:
    """Keys whose value differs between a checkpoint's config and the current one.

    Keys in ``may_differ`` (the run config's resumable keys; default
    :data:`MAY_DIFFER_ON_RESUME`) are ignored; a key missing on one side counts as a difference
    (a checkpoint of another version of the app).

    Returns
    -------
    dict[str, str]
        Key -> ``"checkpoint X, now Y"``, sorted by key; empty when the runs match.
    """
    out: dict[str, str] = {}
    missing = object()

    def fmt(value: Any) -> str:
        return "<absent>" if value is missing else repr(value)

    for key in sorted(set(saved) | set(current)):
        if key in may_differ:
            continue
        a, b = saved.get(key, missing), current.get(key, missing)
        if a is missing or b is missing or not _same(a, b):
            out[key] = f"checkpoint {fmt(a)}, now {fmt(b)}"
    return out


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    if isinstance(a, int | float) and isinstance(b, int | float):
        return math.isclose(float(a), float(b), rel_tol=1e-12, abs_tol=0.0)
    return bool(a == b)


class Checkpointer:
    """Writes and reads the checkpoint of one run in ``<out_dir>/checkpoint/``.

    Parameters
    ----------
    out_dir : str or Path
        The run's ``out-dir`` (must be non-empty).
    cfg : RunConfig
        The current run configuration (recorded on save, compared on load).
    num_params : int
        Model size ``m``.
    """

    def __init__(self, out_dir: str | Path, cfg: RunConfig, num_params: int) -> None:
        if not str(out_dir):
            raise ValueError("a checkpoint needs an out-dir")
        if not isinstance(cfg, RunConfig):
            raise TypeError(f"cfg must be a RunConfig, got {type(cfg).__name__}")
        if isinstance(num_params, bool) or not isinstance(num_params, int) or num_params < 1:
            raise ValueError(f"num_params must be an int >= 1, got {num_params!r}")
        self.directory = Path(out_dir) / CHECKPOINT_DIR
        self.cfg = cfg
        self.num_params = num_params

    @property
    def state_path(self) -> Path:
        """``<out-dir>/checkpoint/state.json``."""
        return self.directory / STATE_FILE

    @property
    def journal_path(self) -> Path:
        """``<out-dir>/checkpoint/releases.jsonl``."""
        return self.directory / JOURNAL_FILE

    def exists(self) -> bool:
        """Whether a committed checkpoint is there."""
        return self.state_path.is_file()

    # ------------------------------------------------------------------ journal
    def journal_release(self, run_id: int, event: PrivacyEvent) -> None:
        """Append one release of the round in flight to the journal and ``fsync`` it.

        Called as each update is accepted, so that a crash later in the round cannot lose it.
        """
        if not isinstance(event, PrivacyEvent):
            raise TypeError(f"expected a PrivacyEvent, got {type(event).__name__}")
        self.directory.mkdir(parents=True, exist_ok=True)
        line = json.dumps({"run_id": int(run_id), "event": dataclasses.asdict(event)})
        with open(self.journal_path, "a", encoding="utf-8") as fh:
            fh.write(line + "\n")
            fh.flush()
            os.fsync(fh.fileno())

    def _read_journal(self) -> list[tuple[int, PrivacyEvent]]:
        try:
            text = self.journal_path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return []
        out: list[tuple[int, PrivacyEvent]] = []
        lines = text.splitlines()
        for i, line in enumerate(lines):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
                out.append((int(obj["run_id"]), PrivacyEvent(**obj["event"])))
            except (ValueError, TypeError, KeyError) as exc:
                if i == len(lines) - 1 and not text.endswith("\n"):
                    # a line torn by the crash: its fsync never returned, so the update was
                    # never accepted (and never aggregated) either
                    logger.warning("ignoring a torn last line of %s", self.journal_path)
                    break
                raise CheckpointError(f"{self.journal_path}: bad line {i + 1}: {exc}") from exc
        return out

    # ------------------------------------------------------------------ save
    def save(self, state: TrainingState) -> Path:
        """Commit ``state`` (after round ``state.round``) atomically; returns ``state.json``.

        Writes the model files that are new, then ``state.json`` (the commit), then empties the
        release journal (its releases are in the committed ledger now) and removes model files
        no longer referenced.
        """
        self._check_vector(state.weights, "weights")
        self._check_vector(state.best_weights, "best_weights")
        self.directory.mkdir(parents=True, exist_ok=True)
        t0 = time.monotonic()
        model_name = f"model-{state.round:06d}.npy"
        model_bytes = _npy_bytes(state.weights)
        atomic_write_bytes(self.directory / model_name, model_bytes)
        best_round = int(state.best["round"])
        best_name = f"best-{best_round:06d}.npy"
        best_bytes = _npy_bytes(state.best_weights)
        best_path = self.directory / best_name
        if not best_path.is_file() or best_path.read_bytes() != best_bytes:
            atomic_write_bytes(best_path, best_bytes)
        doc = {
            "version": FORMAT_VERSION,
            "round": state.round,
            "time": time.time(),
            "num_params": self.num_params,
            "config": self.cfg.to_flower(),
            "model": {"file": model_name, "sha256": _sha256(model_bytes)},
            "best": {**state.best, "file": best_name, "sha256": _sha256(best_bytes)},
            "since_best": state.since_best,
            "history": state.history,
            "ledger": json.loads(state.ledger.to_json()),
            "run_ids": state.run_ids,
            "aborted_releases": state.aborted_releases,
        }
        text = json.dumps(jsonable(doc), allow_nan=False, sort_keys=True)
        atomic_write_text(self.state_path, text + "\n")
        atomic_write_bytes(self.journal_path, b"")
        keep = {STATE_FILE, JOURNAL_FILE, model_name, best_name}
        for entry in self.directory.iterdir():
            if entry.name not in keep and entry.is_file():
                with contextlib.suppress(OSError):
                    entry.unlink()
        logger.debug("checkpoint of round %d in %.2f s", state.round, time.monotonic() - t0)
        return self.state_path

    def _check_vector(self, vec: torch.Tensor, name: str) -> None:
        if not isinstance(vec, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(vec).__name__}")
        if vec.dim() != 1 or vec.numel() != self.num_params:
            raise ValueError(f"{name} must have shape [{self.num_params}], got {tuple(vec.shape)}")

    # ------------------------------------------------------------------ load
    def load(self) -> TrainingState:
        """Read and validate the checkpoint and fold in the releases of an aborted round.

        Returns
        -------
        TrainingState
            The state after the checkpoint's round (tensors on the CPU). Releases journaled in
            a round the crash aborted are appended to the ledger and to ``aborted_releases``.

        Raises
        ------
        CheckpointError
            If there is no checkpoint, it is corrupt (bad JSON, wrong version, wrong size,
            digest mismatch, non-finite weights), or its configuration differs from the current
            one in a key outside :data:`MAY_DIFFER_ON_RESUME`.
        """
        if not self.exists():
            raise CheckpointError(
                f"resume = true, but {self.state_path} does not exist: no completed round was "
                "checkpointed in this out-dir (start a new run with resume = false)"
            )
        try:
            doc = json.loads(self.state_path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise CheckpointError(f"{self.state_path} is unreadable: {exc}") from exc
        if not isinstance(doc, dict) or doc.get("version") != FORMAT_VERSION:
            raise CheckpointError(
                f"{self.state_path}: not a version-{FORMAT_VERSION} checkpoint of this app"
            )
        try:
            return self._from_doc(doc)
        except CheckpointError:
            raise
        except (KeyError, TypeError, ValueError) as exc:
            raise CheckpointError(f"{self.state_path} is malformed: {exc!r}") from exc

    def _from_doc(self, doc: dict[str, Any]) -> TrainingState:
        saved_cfg = doc["config"]
        if not isinstance(saved_cfg, dict):
            raise CheckpointError(f"{self.state_path}: 'config' must be an object")
        diff = config_mismatches(saved_cfg, self.cfg.to_flower(), self.cfg.resumable_keys())
        if diff:
            lines = "\n".join(f"  - {k}: {why}" for k, why in diff.items())
            raise CheckpointError(
                f"cannot resume: the checkpoint in {self.directory} was written by a run with "
                f"another configuration ({len(diff)} key(s) differ):\n{lines}"
            )
        if int(doc["num_params"]) != self.num_params:
            raise CheckpointError(
                f"cannot resume: the checkpoint has {doc['num_params']} parameters, the model "
                f"has {self.num_params}"
            )
        rnd = int(doc["round"])
        if rnd < 0:
            raise CheckpointError(f"{self.state_path}: bad round {rnd}")
        if rnd > self.cfg.num_rounds:
            raise CheckpointError(
                f"cannot resume: the checkpoint is at round {rnd}, after num-rounds = "
                f"{self.cfg.num_rounds}"
            )
        weights = self._load_vector(doc["model"])
        best = {k: v for k, v in doc["best"].items() if k not in ("file", "sha256")}
        best_weights = self._load_vector(doc["best"])
        history = doc["history"]
        if not isinstance(history, list) or [int(r["round"]) for r in history] != list(
            range(1, rnd + 1)
        ):
            raise CheckpointError(f"{self.state_path}: history must hold rounds 1..{rnd} once")
        ledger = PrivacyLedger.from_json(json.dumps(doc["ledger"]))
        if any(e.round > rnd for e in ledger):
            raise CheckpointError(f"{self.state_path}: ledger has releases after round {rnd}")
        aborted = [dict(a) for a in doc.get("aborted_releases", [])]
        for run_id, event in self._read_journal():
            if event.round <= rnd:
                continue  # committed already (the crash came between commit and truncation)
            ledger.add(event)
            aborted.append({"run_id": run_id, "round": event.round, "node": event.node})
            logger.warning(
                "node %s released an update in round %d of run %d, which a crash aborted; the "
                "ledger keeps it (the round is redone)",
                event.node,
                event.round,
                run_id,
            )
        return TrainingState(
            round=rnd,
            weights=weights,
            best=best,
            best_weights=best_weights,
            since_best=int(doc["since_best"]),
            history=history,
            ledger=ledger,
            run_ids=[int(r) for r in doc["run_ids"]],
            aborted_releases=aborted,
        )

    def _load_vector(self, ref: Mapping[str, Any]) -> torch.Tensor:
        name = str(ref["file"])
        if Path(name).name != name:
            raise CheckpointError(f"{self.state_path}: bad model file name {name!r}")
        path = self.directory / name
        try:
            data = path.read_bytes()
        except OSError as exc:
            raise CheckpointError(f"checkpoint file {path} is missing: {exc}") from exc
        if _sha256(data) != ref["sha256"]:
            raise CheckpointError(f"checkpoint file {path} is corrupt (SHA-256 mismatch)")
        arr = np.load(io.BytesIO(data), allow_pickle=False)
        if arr.dtype != np.float32 or arr.shape != (self.num_params,):
            raise CheckpointError(
                f"checkpoint file {path}: expected float32 [{self.num_params}], got "
                f"{arr.dtype} {arr.shape}"
            )
        if not np.isfinite(arr).all():
            raise CheckpointError(f"checkpoint file {path} has non-finite weights")
        return torch.from_numpy(arr.copy())


def ledger_counts(ledger: PrivacyLedger) -> dict[str, Any]:
    """Summary of a ledger for ``summary.json``: releases, clients, releases per client.

    Returns
    -------
    dict
        ``{"releases": n, "nodes": k, "per_node": {node: n_node}}``.
    """
    per_node: dict[str, int] = {}
    for event in ledger:
        per_node[event.node] = per_node.get(event.node, 0) + 1
    return {"releases": len(ledger), "nodes": len(per_node), "per_node": per_node}

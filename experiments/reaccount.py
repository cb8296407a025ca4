"""Recompute finished runs' privacy reports with the current accountant (``summary.json``).

A run's ``summary.json -> privacy`` is computed once, by the ServerApp at the run's end
(:func:`corbin_fl.server.records.ledger_privacy`). When the accountant improves (a tighter
composition, a bound withdrawn: issue 38), the committed runs still carry the old figures, and
the reports built from them would print them. This recomputes each run's privacy section from
that run's own records, exactly as the ServerApp does: the configuration in ``summary.json``,
the rounds of ``metrics.jsonl`` (clients, the largest radius, secure aggregation's sums), and the
privacy ledger's count of releases per node (``privacy -> ledger``; a run from before the
ledger: ``privacy -> rounds``). Nothing else in the summary changes.

Usage::

    python -m corbin_fl.experiments.reaccount docs/results/quick/runs/*/        # what changes
    python -m corbin_fl.experiments.reaccount --write docs/results/quick/runs/*/

It prints, per run, every key of the privacy section that changes (``~``), appears (``+``) or
goes (``-``). Then regenerate the reports (``corbin-fl experiment report <spec>``).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from corbin_fl.app.config import AppConfig
from corbin_fl.deploy.follow import read_jsonl
from corbin_fl.fsio import atomic_write_json
from corbin_fl.server import records
from corbin_fl.server.metrics import jsonable

logger = logging.getLogger(__name__)


def _metrics_file(run_dir: Path) -> Path:
    """The run's ``metrics.jsonl``: in its ``app/`` out-dir, or beside ``summary.json``."""
    for path in (run_dir / "app" / "metrics.jsonl", run_dir / "metrics.jsonl"):
        if path.is_file():
            return path
    raise FileNotFoundError(f"{run_dir}: no metrics.jsonl (in app/ or beside summary.json)")


def recompute(run_dir: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(summary, new privacy section)`` of the finished run in ``run_dir``."""
    summary = json.loads((run_dir / "summary.json").read_text(encoding="utf-8"))
    old = summary.get("privacy")
    if not isinstance(old, Mapping) or "threat_models" not in old:
        raise ValueError(f"{run_dir}: summary.json has no privacy report to recompute")
    cfg = AppConfig.from_flower(summary["config"])
    history = read_jsonl(_metrics_file(run_dir))
    clients = max((int(r["participants"]) for r in history), default=0)
    r_max = max((float(r["max_radius"]) for r in history), default=None)
    ledger = old.get("ledger")
    rounds = int(ledger["max_releases_per_node"]) if ledger else int(old["rounds"])
    secure = records.sum_view(cfg, history, clients or None)
    new = records.privacy_summary(
        cfg, rounds, int(summary["num_params"]), clients, r_max, secure=secure
    )
    if ledger is not None:
        new["ledger"] = ledger
    return summary, new


def changes(old: Any, new: Any, path: str = "") -> Iterator[str]:
    """One line per key that changes (``~``), appears (``+``) or goes (``-``)."""
    if isinstance(old, Mapping) and isinstance(new, Mapping):
        for key in sorted(set(old) | set(new)):
            where = f"{path}.{key}"
            if key not in old:
                yield f"+ {where}: {str(new[key])[:120]}"
            elif key not in new:
                yield f"- {where}: {str(old[key])[:120]}"
            else:
                yield from changes(old[key], new[key], where)
    elif old != new:
        yield f"~ {path}: {str(old)[:60]} -> {str(new)[:60]}"


def main(argv: Sequence[str] | None = None) -> int:
    """Print (and with ``--write`` apply) each run's changes; exit 1 if a run fails."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path, help="run folders (with summary.json)")
    parser.add_argument("--write", action="store_true", help="rewrite each summary.json")
    args = parser.parse_args(argv)
    failed = 0
    for run_dir in args.runs:
        try:
            summary, new = recompute(run_dir)
        except (OSError, ValueError, KeyError) as exc:
            print(f"{run_dir}: {exc}", file=sys.stderr)
            failed += 1
            continue
        lines = list(changes(summary["privacy"], new, "privacy"))
        print(f"{run_dir}: {len(lines)} change(s)")
        for line in lines:
            print(f"  {line}")
        if args.write and lines:
            summary["privacy"] = new
            atomic_write_json(run_dir / "summary.json", jsonable(summary), allow_nan=False)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

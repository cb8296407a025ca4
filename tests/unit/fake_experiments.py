"""A fake experiment backend and app for the experiments tests: runs that finish in
milliseconds with a deterministic accuracy derived from their config."""

from __future__ import annotations

import functools
import hashlib
import json
import tomllib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from corbin_fl.app.config import AppConfig
from corbin_fl.experiments.spec import (
    ExperimentSpec,
    parse_spec,
)
from corbin_fl.experiments.sweep import Run, Submission
from corbin_fl.mechanisms.report import privacy_report

FAKE_M = 1000


def spec_from(text: str, source: str = "<test>") -> ExperimentSpec:
    return parse_spec(tomllib.loads(text), source=source)


TINY = """
seeds = [0, 1]
lambda-grid = [0.5, 1.0]

[experiment]
name = "tiny"
retry-delay-s = 0

[base]
clients = 4
num-rounds = 4
d = 5

[grid]
mechanism = ["ldpfl", "corbin"]
epsilon = [0.5, 1.0]

[[extra-grid]]
mechanism = ["fedavg"]

[plots]
figures = ["accuracy-vs-round", "accuracy-bar", "accuracy-vs-epsilon"]
"""


def fake_app_dir(tmp_path: Path) -> Path:
    """An app folder whose pyproject declares every AppConfig key (what flwr run checks)."""
    app = tmp_path / "app"
    app.mkdir()
    lines = ["[tool.flwr.app]", 'publisher = "t"', "[tool.flwr.app.config]"]
    for key, value in AppConfig.defaults().items():
        lines.append(f"{key} = {json.dumps(value)}")
    (app / "pyproject.toml").write_text("\n".join(lines) + "\n")
    return app


@functools.cache
def cached_privacy_report(
    mechanism: str,
    eps: float,
    delta: float,
    rounds: int,
    d: int | None,
    gamma: float | None,
    n: int | None,
) -> dict[str, Any]:
    """The real accountant's report, as the ServerApp computes it (memoised: same inputs)."""
    return privacy_report(mechanism, eps, delta, FAKE_M, rounds, d=d, gamma=gamma, n=n, r=0.1)


def _u(run_config: Mapping[str, Any], salt: str) -> float:
    """A deterministic uniform [0, 1) number of a config (stands in for training noise)."""
    payload = json.dumps({k: run_config[k] for k in sorted(run_config)}) + salt
    return int(hashlib.sha256(payload.encode()).hexdigest()[:8], 16) / 2**32


class FakeBackend:
    """Writes contract-format outputs instead of running Flower (fast, deterministic).

    Accuracy rises with the round, is higher for corbin than ldpfl and for larger eps, and
    gets seed noise; ``fail`` lists run ids to fail, ``truncate`` ids to stop after 1 round.
    """

    def __init__(
        self,
        fail: set[str] | None = None,
        truncate: set[str] | None = None,
        flaky: set[str] | None = None,
    ) -> None:
        self.calls: list[str] = []
        self.fail = fail or set()
        self.truncate = truncate or set()
        self.flaky = set(flaky or ())  # fail once, then work (a transient start-up failure)

    def __call__(
        self,
        run: Run,
        run_config: Mapping[str, Any],
        out_dir: Path,
        *,
        timeout_s: float,
        on_round: Callable[[int], None],
    ) -> Submission:
        self.calls.append(run.run_id)
        if run.run_id in self.fail:
            return Submission(False, "boom", 7, "finished:failed")
        if run.run_id in self.flaky:
            self.flaky.discard(run.run_id)
            return Submission(False, "Simulation Runtime crashed", 8, "finished:failed")
        mech = run_config["mechanism"]
        eps = float(run_config.get("epsilon", 1.0))
        level = {"fedavg": 0.93, "corbin": 0.92, "ldpfl": 0.70}.get(mech, 0.6)
        level -= 0.1 / (1.0 + 4 * eps) if mech != "fedavg" else 0.0
        rounds = int(run_config["num-rounds"])
        if run.run_id in self.truncate:
            rounds = 1
        rows = []
        for t in range(1, rounds + 1):
            base = level * (1 - 0.5**t) + 0.02 * (_u(run_config, f"s{t}") - 0.5)
            rows.append(
                {
                    "round": t,
                    "test_accuracy": base + 0.01 * (_u(run_config, f"t{t}") - 0.5),
                    "val_accuracy": base + 0.01 * (_u(run_config, f"v{t}") - 0.5),
                    "test_loss": 1 - base,
                    "participants": run.clients,
                    "dropped": {},
                    "bytes_up": {
                        "update": 900 * (run.clients or 1),
                        "total": 1000 * (run.clients or 1),
                    },
                    "round_seconds": 0.1,
                }
            )
            on_round(t)
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        cfg = AppConfig.from_flower(dict(run_config))
        summary = {
            "config": cfg.to_flower(),
            "num_params": FAKE_M,
            "rounds": rounds,
            "final_test_accuracy": rows[-1]["test_accuracy"],
            "privacy": cached_privacy_report(
                cfg.mechanism,
                cfg.epsilon,
                cfg.delta,
                rounds,
                cfg.d if cfg.paired else None,
                cfg.gamma if cfg.mechanism == "augcorbin" else None,
                run.clients,
            ),
        }
        (out_dir / "summary.json").write_text(json.dumps(summary))
        return Submission(True, "completed", 1, "finished:completed")

    def close(self) -> None:
        pass

"""The one glue of secure aggregation: CorBin-FL carries the building block's records under its
own names, and nothing else (corbin_fl.secure.SECAGG_RECORDS, corbin_fl.secagg.wire.renamed)."""

from __future__ import annotations

import re
from pathlib import Path

from flwr.app import ConfigRecord, RecordDict

from corbin_fl import secure
from corbin_fl.secagg import wire


def test_corbin_names_every_record_of_the_building_block_once() -> None:
    assert set(secure.SECAGG_RECORDS) == {wire.RECORD, wire.NEXT_RECORD, wire.MASKED_RECORD}
    assert len(set(secure.SECAGG_RECORDS.values())) == 3
    assert set(secure.SECAGG_RECORDS.values()) == {
        secure.SECAGG_REC,
        secure.NEXT_REC,
        secure.MASKED_REC,
    }


def test_renamed_maps_there_and_back_and_leaves_other_records_out() -> None:
    content = wire.with_next(wire.advertise_request(3), wire.advertise_request(4))
    content["app"] = ConfigRecord({"lr": 0.1})
    hosted = wire.renamed(content, secure.SECAGG_RECORDS)
    assert set(hosted) == {secure.SECAGG_REC, secure.NEXT_REC}
    back = wire.renamed(hosted, {v: k for k, v in secure.SECAGG_RECORDS.items()})
    assert set(back) == {wire.RECORD, wire.NEXT_RECORD}
    assert wire.stage_of(back) == ("advertise", 3)
    assert wire.split_next(back)[1] is not None
    assert wire.renamed(RecordDict(), secure.SECAGG_RECORDS) == RecordDict()


ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ("corbin_fl", "server", "client", "mechanisms", "app", "deploy", "experiments")
ROLE_CALLS = re.compile(
    r"\b(SecAggServer|SecAggClient)\(|\.(receive_adverts|receive_shares|receive_masked|"
    r"receive_unmask|advertise_targets|share_requests|mask_requests|unmask_requests|share_keys)\("
)
"""Constructing a role, or calling a stage method of one."""
GLUE = {
    "corbin_fl/secagg/driver.py": "the one server round driver",
    "corbin_fl/secagg/node.py": "the one client glue",
    "corbin_fl/secagg/simulate.py": "a round in memory, no Flower",
}


def test_only_the_one_glue_drives_the_roles() -> None:
    """Both hosts (SecAggPlus / secagg_mod and CorBin-FL's SecureRound / corbin_mod) go through
    the driver and the node glue: no second sequence of stages anywhere in the product."""
    found = {}
    for folder in PRODUCT:
        for path in sorted((ROOT / folder).rglob("*.py")):
            rel = str(path.relative_to(ROOT))
            if rel in GLUE or rel.startswith(
                ("corbin_fl/secagg/client", "corbin_fl/secagg/server")
            ):
                continue
            hits = ROLE_CALLS.findall(path.read_text(encoding="utf-8"))
            if hits:
                found[rel] = hits
    assert not found, f"SecAgg+ roles driven outside {sorted(GLUE)}: {found}"

"""The one glue of secure aggregation: CorBin-FL carries the building block's records under its
own names, and nothing else (corbin_fl.secure.SECAGG_RECORDS, corbin_fl.secagg.wire.renamed)."""

from __future__ import annotations

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

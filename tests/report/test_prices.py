"""The price book: tiers, minimum sizes, request classes, overrides, errors. Figures by hand."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tiering.cost.prices import DAYS_PER_MONTH, GB, default_prices, load_prices
from tiering.errors import ConfigError


def test_the_defaults_say_where_and_when_they_come_from() -> None:
    doc = default_prices()
    assert "aws.amazon.com/s3/pricing" in doc["source"]
    assert doc["as_of"]
    book = load_prices("us-east-1")
    assert book.describe()["as_of"] == doc["as_of"]
    assert pytest.approx(730 / 24) == DAYS_PER_MONTH
    assert GB == 1073741824


def test_standard_volume_tiers_are_cumulative() -> None:
    std = load_prices("us-east-1").of("STANDARD")
    assert std.monthly(100) == pytest.approx(100 * 0.023)
    assert std.monthly(51_200) == pytest.approx(51_200 * 0.023)  # exactly 50 TB: all in the first tier
    assert std.monthly(60_000) == pytest.approx(51_200 * 0.023 + 8_800 * 0.022)
    assert std.monthly(600_000) == pytest.approx(51_200 * 0.023 + (512_000 - 51_200) * 0.022 + 88_000 * 0.021)
    assert std.rate(0) == 0.023
    assert std.rate(51_199.9) == 0.023
    assert std.rate(51_200) == 0.022
    assert std.rate(512_000) == 0.021


def test_minimum_billable_size_of_infrequent_access_classes() -> None:
    book = load_prices("us-east-1")
    ia = book.of("STANDARD_IA")
    assert ia.billed_bytes(1) == 128 * 1024
    assert ia.billed_bytes(200_000) == 200_000
    assert book.of("STANDARD").billed_bytes(1) == 1
    assert (ia.min_days, book.of("GLACIER_IR").min_days, book.of("DEEP_ARCHIVE").min_days) == (30, 90, 180)


def test_request_classes() -> None:
    book = load_prices("us-east-1")
    assert book.request_usd("PutObject", 1000) == pytest.approx(0.005)
    assert book.request_usd("CopyObject", 1000) == pytest.approx(0.005)
    assert book.request_usd("ListObjectsV2", 2000) == pytest.approx(0.01)
    assert book.request_usd("GetObject", 1000) == pytest.approx(0.0004)
    assert book.request_usd("HeadObject", 1000) == pytest.approx(0.0004)  # "all other requests"
    assert book.request_usd("DeleteObject", 10**6) == 0
    assert book.request_usd("AbortMultipartUpload", 10) == 0
    assert book.request_usd("PutObject", 1000, "STANDARD_IA") == pytest.approx(0.01)
    assert book.request_usd("GetObject", 1000, "GLACIER_IR") == pytest.approx(0.01)


def test_a_user_file_overrides_one_price_and_keeps_the_rest(tmp_path: Path) -> None:
    f = tmp_path / "prices.json"
    f.write_text(json.dumps({"regions": {"us-east-1": {"s3": {"STANDARD_IA": {"gb_month_tiers": [[None, 0.011]]}},
                                                       "compute": {"vcpu_hour": 0.04, "gb_hour": 0}}}}))
    book = load_prices("us-east-1", f)
    assert book.of("STANDARD_IA").rate() == 0.011
    assert book.of("STANDARD_IA").min_days == 30  # kept from the defaults
    assert book.of("STANDARD").rate() == 0.023
    assert book.vcpu_hour == pytest.approx(0.04)
    assert book.overridden_by == str(f)


def test_a_user_file_can_add_a_region(tmp_path: Path) -> None:
    region = default_prices()["regions"]["us-east-1"]
    f = tmp_path / "prices.json"
    f.write_text(json.dumps({"regions": {"ap-south-9": region}}))
    assert load_prices("ap-south-9", f).of("STANDARD").rate() == 0.023


@pytest.mark.parametrize(("doc", "message"), [
    ({"regions": {"us-east-1": {"s3": {"STANDARD": {"gb_month_tiers": [[100, 0.02]]}}}}}, "gb_month_tiers"),
    ({"regions": {"us-east-1": {"s3": {"STANDARD": {"gb_month_tiers": [[200, 0.02], [100, 0.01], [None, 0.0]]}}}}},
     "limits must increase"),
    ({"regions": {"us-east-1": {"s3": {"STANDARD_IA": {"put_per_1000": -1}}}}}, "put_per_1000"),
    ({"regions": {"us-east-1": {"kms_per_10000_requests": "cheap"}}}, "kms_per_10000_requests"),
    ([1, 2], "JSON object"),
])
def test_a_bad_prices_file_is_a_clear_error(tmp_path: Path, doc: object, message: str) -> None:
    f = tmp_path / "prices.json"
    f.write_text(json.dumps(doc))
    with pytest.raises(ConfigError, match=message):
        load_prices("us-east-1", f)


def test_unknown_region_and_class_name_what_is_known(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no prices for region mars-1") as e:
        load_prices("mars-1")
    assert "us-east-1" in str(e.value)
    with pytest.raises(ConfigError, match="REDUCED_REDUNDANCY"):
        load_prices().of("REDUCED_REDUNDANCY")
    with pytest.raises(ConfigError, match="cannot read"):
        load_prices("us-east-1", tmp_path / "missing.json")

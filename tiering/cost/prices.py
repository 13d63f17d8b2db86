"""S3, KMS and compute prices: a data file in the package, overridable by the user's own file.

The defaults (``data/aws_s3_prices.json``) say where and when they were read; every figure in a report
names the region and that date. A user file has the same shape and is merged over the defaults key by
key, so it can change one price, add a region, or replace a whole storage class.

Units, as AWS bills: a GB is 2^30 bytes, a month is 730 hours; Standard's volume tiers are given by their
upper limits in GB (50 TB = 51,200 GB), the last tier without a limit.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Final

from tiering.errors import ConfigError
from tiering.lifecycle.vocabulary import StorageClass

GB: Final = 1 << 30
HOURS_PER_MONTH: Final = 730
DAYS_PER_MONTH: Final = HOURS_PER_MONTH / 24
DEFAULT_REGION: Final = "us-east-1"
PRICES_SCHEMA_VERSION: Final = 1

# S3 request classes as priced: "PUT, COPY, POST, LIST" and "GET, SELECT and all other"; DELETE and the
# cancellation of an upload are free. Names are boto3 operation names (what S3Store counts).
TIER1_OPERATIONS: Final = frozenset({
    "PutObject", "CopyObject", "CreateMultipartUpload", "UploadPart", "UploadPartCopy", "CompleteMultipartUpload",
    "ListObjectsV2", "ListObjects", "ListMultipartUploads", "ListParts", "PutObjectTagging", "ListBuckets",
    "PutBucketLifecycleConfiguration", "RestoreObject",
})
FREE_OPERATIONS: Final = frozenset({"DeleteObject", "DeleteObjects", "AbortMultipartUpload"})


@dataclass(frozen=True, slots=True)
class StoragePrice:
    """One storage class in one region."""

    storage_class: str
    tiers: tuple[tuple[float | None, float], ...]  # (upper limit in GB or None, $ per GB-month)
    min_days: int  # minimum storage duration: deleting earlier bills the remaining days
    min_object_bytes: int  # smaller objects are billed as this size
    put_per_1000: float
    get_per_1000: float
    retrieval_per_gb: float
    transition_per_1000: float | None
    overhead_bytes_class: int = 0  # GLACIER / DEEP_ARCHIVE: per-object metadata billed at this class's rate
    overhead_bytes_standard: int = 0  # ... and at S3 Standard's

    def rate(self, volume_gb: float = 0.0) -> float:
        """$ per GB-month of the tier that the account's ``volume_gb``-th GB falls in (the marginal rate)."""
        for limit, usd in self.tiers:
            if limit is None or volume_gb < limit:
                return usd
        return self.tiers[-1][1]

    def monthly(self, gb: float) -> float:
        """$ per month for ``gb`` GB stored in this class in one account and region (tiers cumulative)."""
        usd, below = 0.0, 0.0
        for limit, price in self.tiers:
            top = gb if limit is None else min(gb, limit)
            if top > below:
                usd += (top - below) * price
            if limit is None or gb <= limit:
                break
            below = limit
        return usd

    def billed_bytes(self, size: int) -> int:
        return max(size, self.min_object_bytes)


@dataclass(frozen=True, slots=True)
class PriceBook:
    region: str
    source: str
    as_of: str
    overridden_by: str | None
    storage: Mapping[str, StoragePrice]
    kms_per_10000: float
    vcpu_hour: float  # compute, memory included (gb_per_vcpu GB at gb_hour)
    compute_what: str

    def of(self, storage_class: str) -> StoragePrice:
        try:
            return self.storage[storage_class]
        except KeyError:
            raise ConfigError(f"no prices for storage class {storage_class} in {self.region}",
                              expected=", ".join(sorted(self.storage)), found=storage_class) from None

    def request_usd(self, operation: str, count: int, storage_class: str = StorageClass.STANDARD) -> float:
        if operation in FREE_OPERATIONS:
            return 0.0
        p = self.of(storage_class)
        return count * (p.put_per_1000 if operation in TIER1_OPERATIONS else p.get_per_1000) / 1000

    def describe(self) -> dict[str, Any]:
        return {"region": self.region, "source": self.source, "as_of": self.as_of, "overridden_by": self.overridden_by,
                "vcpu_hour_usd": self.vcpu_hour, "compute": self.compute_what}


def _merge(base: Any, over: Any) -> Any:
    if isinstance(base, dict) and isinstance(over, dict):
        return {k: _merge(base[k], v) if k in base else v for k, v in over.items()} | {
            k: v for k, v in base.items() if k not in over}
    return over


def default_prices() -> dict[str, Any]:
    text = resources.files("tiering.cost").joinpath("data/aws_s3_prices.json").read_text(encoding="utf-8")
    doc: dict[str, Any] = json.loads(text)
    return doc


def _number(doc: Mapping[str, Any], key: str, where: str, *, optional: bool = False) -> float | None:
    value = doc.get(key)
    if value is None and optional:
        return None
    if not isinstance(value, int | float) or isinstance(value, bool) or value < 0:
        raise ConfigError(f"bad price {where}.{key}", expected="a number >= 0", found=value)
    return float(value)


def _storage(name: str, doc: Mapping[str, Any], where: str) -> StoragePrice:
    tiers = doc.get("gb_month_tiers")
    if not isinstance(tiers, list) or not tiers or tiers[-1][0] is not None:
        raise ConfigError(f"bad price {where}.gb_month_tiers", expected="[[limit_gb, usd], ..., [null, usd]]",
                          found=tiers)
    limits = [t[0] for t in tiers[:-1]]
    if any(not isinstance(x, int | float) for x in limits) or limits != sorted(limits):
        raise ConfigError(f"bad price {where}.gb_month_tiers: limits must increase", found=limits)

    def num(key: str) -> float:
        value = _number(doc, key, where)
        assert value is not None
        return value

    return StoragePrice(name, tuple((None if lim is None else float(lim), float(usd)) for lim, usd in tiers),
                        int(num("min_days")), int(num("min_object_bytes")), num("put_per_1000"),
                        num("get_per_1000"), num("retrieval_per_gb"),
                        _number(doc, "transition_per_1000", where, optional=True),
                        int(_number(doc, "overhead_bytes_class", where, optional=True) or 0),
                        int(_number(doc, "overhead_bytes_standard", where, optional=True) or 0))


def load_prices(region: str = DEFAULT_REGION, override: str | Path | None = None) -> PriceBook:
    """The price book of ``region``: the package's defaults, merged with ``override`` (a JSON file)."""
    doc = default_prices()
    if override is not None:
        try:
            user = json.loads(Path(override).read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            raise ConfigError(f"cannot read the prices file: {e}", path=str(override)) from None
        if not isinstance(user, dict):
            raise ConfigError("a prices file is a JSON object", path=str(override), found=type(user).__name__)
        doc = _merge(doc, user)
    regions = doc.get("regions", {})
    if region not in regions:
        raise ConfigError(f"no prices for region {region}; give them in a prices file",
                          expected=", ".join(sorted(regions)), found=region)
    r = regions[region]
    where = f"regions.{region}"
    compute = r.get("compute", {})
    vcpu = _number(compute, "vcpu_hour", f"{where}.compute") or 0.0
    memory = (_number(compute, "gb_hour", f"{where}.compute") or 0.0) * (
        _number(compute, "gb_per_vcpu", f"{where}.compute") or 0.0)
    kms = _number(r, "kms_per_10000_requests", where)
    return PriceBook(region, str(doc.get("source", "")), str(doc.get("as_of", "")),
                     None if override is None else str(override),
                     {name: _storage(name, p, f"{where}.s3.{name}") for name, p in r.get("s3", {}).items()},
                     kms or 0.0, vcpu + memory, str(compute.get("what", "")))

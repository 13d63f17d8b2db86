"""``tiering report``: a run's cost savings report, as a table, JSON, Markdown, CSV or an HTML page.

By default it prints the report the run published (``PREFIX/_tiering/reports/<run>/report.json``). With
any pricing option (``--prices``, ``--price-region``, ``--account-standard-tb``, ``--grace-days``) it prices
the run again from its run documents and prints that instead, writing nothing.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from tiering.cost.model import with_ledger
from tiering.report.publish import LATEST, assemble, cost_config, load_report, read_ledger
from tiering.report.render import FORMATS, render
from tiering.run.cleanup import DEFAULT_GRACE_DAYS


def add_cost_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--price-region", default=None, metavar="REGION",
                   help="region whose prices apply (default: TIERING_PRICE_REGION, else the AWS region, else "
                        "us-east-1)")
    p.add_argument("--prices", default=None, metavar="FILE",
                   help="a JSON prices file merged over the built-in list prices (same shape; see docs/cost-report.md)")
    p.add_argument("--account-standard-tb", type=float, default=None, metavar="TB",
                   help="the account's current S3 Standard volume in the region, in TB (2^40 bytes); decides "
                        "which volume tier the savings come off (default: the first tier)")


def cost_from_args(args: argparse.Namespace, grace_days: float = DEFAULT_GRACE_DAYS) -> Any:
    return cost_config(region=args.price_region, prices_file=args.prices, account_standard_tb=args.account_standard_tb,
                       grace_days=grace_days)


def _cmd_report(args: argparse.Namespace) -> int:
    from tiering.storage.s3 import S3Store, make_client  # noqa: PLC0415 - boto3 loads only for S3 commands

    store = S3Store(make_client(endpoint_url=args.endpoint_url, region=args.region), args.bucket)
    prefix = args.prefix.strip("/")
    reprice = any(v is not None for v in (args.prices, args.price_region, args.account_standard_tb, args.grace_days))
    report = load_report(store, prefix, args.run_id)
    if reprice:
        prices, options = cost_from_args(args, DEFAULT_GRACE_DAYS if args.grace_days is None else args.grace_days)
        ledger, _ = read_ledger(store, prefix)
        report = with_ledger(assemble(store, prefix, report.run_id, prices, options, []), ledger)
    text = render(report, "json" if args.json else args.format)
    if args.output:
        Path(args.output).write_text(text, encoding="utf-8")
        print(f"wrote {args.output}", file=sys.stderr)
    else:
        args.stdout.write(text)
    return 0


def add_report_command(verbs: Any, parser_class: type[argparse.ArgumentParser]) -> None:
    p = verbs.add_parser("report", help="a run's cost savings report (table, json, md, csv, html)",
                         description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bucket", required=True, help="the bucket holding the logdir tree")
    p.add_argument("--prefix", required=True, help="PREFIX of s3://BUCKET/PREFIX/<topic>-<partition>/...")
    p.add_argument("--endpoint-url", default=None, help="S3 endpoint (default: AWS_ENDPOINT_URL or AWS's)")
    p.add_argument("--region", default=None, help="region (default: AWS_REGION / AWS_DEFAULT_REGION)")
    p.add_argument("--run-id", default=LATEST, help="the run (default: the latest report)")
    p.add_argument("--format", choices=FORMATS, default="table", help="output format (default %(default)s)")
    p.add_argument("--json", action="store_true", help="same as --format json")
    p.add_argument("--output", "-o", default=None, metavar="FILE", help="write to FILE instead of stdout")
    add_cost_args(p)
    p.add_argument("--grace-days", type=float, default=None,
                   help=f"days the originals are kept, for pricing (default {DEFAULT_GRACE_DAYS:g})")
    p.set_defaults(func=_cmd_report)

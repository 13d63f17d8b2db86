"""``tiering policy ...``: check a policy file and show a topic's effective settings with their sources."""

from __future__ import annotations

import argparse
import json
from typing import Any

from tiering.plan.policy import load_policy


def _cmd_resolve(args: argparse.Namespace) -> int:
    doc = load_policy(args.policy).resolve(args.topic).to_json()
    if args.json:
        args.stdout.write(json.dumps(doc, indent=2) + "\n")
        return 0
    sources = doc.pop("sources")
    topic = doc.pop("topic")
    args.stdout.write(f"effective policy of topic {topic} ({args.policy}):\n")
    width = max(len(k) for k in doc)
    for key, value in doc.items():
        shown = json.dumps(value) if not isinstance(value, str) else value
        args.stdout.write(f"  {key.ljust(width)}  {shown}  [{sources.get(key, 'derived')}]\n")
    return 0


def _cmd_check(args: argparse.Namespace) -> int:
    policy = load_policy(args.policy)
    args.stdout.write(f"{args.policy}: valid ({len(policy.topics)} topic entries)\n")
    return 0


def add_policy_commands(verbs: Any, parser_class: type[argparse.ArgumentParser]) -> None:
    p = verbs.add_parser("policy", help="per-topic policies: check a file, resolve a topic",
                         description="Per-topic policies (codec, level, minimum savings and age, storage "
                                     "tiers) in one YAML file; see tiering/plan/policy.py for the format.")
    sub = p.add_subparsers(title="commands", metavar="COMMAND", parser_class=parser_class)
    r = sub.add_parser("resolve", help="the effective settings of a topic, and where each came from",
                       description="Print a topic's effective settings: exact entry, then the first regex "
                                   "entry (file order) that matches the whole name, then cluster, then the "
                                   "built-in default, key by key.")
    r.add_argument("--policy", required=True, metavar="FILE", help="the policy YAML file")
    r.add_argument("--topic", required=True, help="the topic name")
    r.add_argument("--json", action="store_true", help="one JSON document on stdout")
    r.set_defaults(func=_cmd_resolve)
    c = sub.add_parser("check", help="validate a policy file (exit 2 with the key and problem if invalid)")
    c.add_argument("--policy", required=True, metavar="FILE", help="the policy YAML file")
    c.add_argument("--json", action="store_true", help="errors as JSON too")
    c.set_defaults(func=_cmd_check)

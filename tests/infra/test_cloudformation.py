"""infra/cloudformation/tiering.yaml: cfn-lint clean, least-privilege IAM, lifecycle rules that respect the
commit protocol. No AWS account is used: the template is decoded with cfn-lint's decoder and its intrinsic
functions are evaluated here for each combination of the parameters that change what it creates."""

from __future__ import annotations

import itertools
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from cfnlint.api import lint_file
from cfnlint.decode import decode

from tiering.run.cleanup import DEFAULT_GRACE_DAYS
from tiering.storage.layout import BACKUP_DIR, JOURNAL_DIR, LEASES_DIR, RESERVED_DIR, STAGING_DIR, STATE_DIR

ROOT = Path(__file__).resolve().parents[2]
TEMPLATE = ROOT / "infra" / "cloudformation" / "tiering.yaml"
PACKAGE = ROOT / "tiering"

ACCOUNT, REGION = "123456789012", "eu-west-1"
BUCKET, PREFIX, ARTIFACTS = "acme-kafka-tiered", "prod/kafka/logs", "tiering-artifacts"
KEY_ARN = f"arn:aws:kms:{REGION}:{ACCOUNT}:key/1234abcd-12ab-34cd-56ef-1234567890ab"
AIRFLOW_PRINCIPAL = f"arn:aws:iam::{ACCOUNT}:role/airflow-workers"
APP_ARN = f"arn:aws:emr-serverless:{REGION}:{ACCOUNT}:/applications/APPID"
BUCKET_ARN, OBJECTS_ARN = f"arn:aws:s3:::{BUCKET}", f"arn:aws:s3:::{BUCKET}/{PREFIX}/*"
MARGIN_DAYS = 30  # reserved-prefix leftovers expire no sooner than grace + this

# Every boto3 S3 operation the package may call, and the IAM actions it needs. A call found in tiering/
# that is missing here fails test_the_policy_grants_exactly_what_the_code_calls: decide its permission first.
OPERATION_ACTIONS: dict[str, set[str]] = {
    "get_object": {"s3:GetObject"},
    "head_object": {"s3:GetObject"},
    "put_object": {"s3:PutObject", "s3:PutObjectTagging"},  # PutObject with Tagging= (tags carried over)
    "copy_object": {"s3:GetObject", "s3:GetObjectTagging", "s3:PutObject", "s3:PutObjectTagging"},
    "get_object_tagging": {"s3:GetObjectTagging"},
    "delete_object": {"s3:DeleteObject"},
    "delete_objects": {"s3:DeleteObject"},  # DeleteObjects is authorised per key as s3:DeleteObject
    "create_multipart_upload": {"s3:PutObject"},
    "upload_part": {"s3:PutObject"},
    "complete_multipart_upload": {"s3:PutObject"},
    "abort_multipart_upload": {"s3:AbortMultipartUpload"},
    "list_objects_v2": {"s3:ListBucket"},
    "head_bucket": {"s3:ListBucket"},
    "list_multipart_uploads": {"s3:ListBucketMultipartUploads"},
    "get_bucket_versioning": {"s3:GetBucketVersioning"},
    "get_bucket_lifecycle_configuration": {"s3:GetLifecycleConfiguration"},
    "create_bucket": set(),  # tiering/demo/s3.py only, against the embedded moto server; never on AWS
}
COST_REPORT_ACTIONS = {"s3:GetBucketVersioning", "s3:GetLifecycleConfiguration"}
OBJECT_ACTIONS = {"s3:GetObject", "s3:PutObject", "s3:DeleteObject", "s3:GetObjectTagging", "s3:PutObjectTagging",
                  "s3:AbortMultipartUpload"}
BUCKET_ACTIONS = {"s3:ListBucket", "s3:ListBucketMultipartUploads", "s3:GetBucketVersioning",
                  "s3:GetLifecycleConfiguration"}
KMS_ACTIONS = {"kms:Decrypt", "kms:GenerateDataKey"}
EMR_ACTIONS = {"emr-serverless:GetApplication", "emr-serverless:StartApplication", "emr-serverless:StartJobRun",
               "emr-serverless:GetJobRun", "emr-serverless:CancelJobRun", "emr-serverless:GetDashboardForJobRun"}
PSEUDO = {"AWS::Partition": "aws", "AWS::Region": REGION, "AWS::AccountId": ACCOUNT, "AWS::StackName": "tiering",
          "AWS::URLSuffix": "amazonaws.com"}
NO_VALUE = object()


@dataclass
class Stack:
    """The template rendered for one set of parameter values: intrinsic functions evaluated, resources and
    outputs whose Condition is false dropped, AWS::NoValue removed."""

    params: dict[str, str]
    template: dict[str, Any]
    conditions: dict[str, bool] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name, spec in self.template["Parameters"].items():
            self.params.setdefault(name, spec.get("Default", ""))
        for name in self.template["Conditions"]:
            self.conditions[name] = self.resolve({"Condition": name})
        self.resources = {name: self.resolve(res) for name, res in self.template["Resources"].items()
                          if self.conditions.get(res.get("Condition", ""), True)}
        self.outputs = {name: self.resolve(out["Value"]) for name, out in self.template["Outputs"].items()
                        if self.conditions.get(out.get("Condition", ""), True)}

    def ref(self, name: str) -> Any:
        if name == "AWS::NoValue":
            return NO_VALUE
        if name in PSEUDO:
            return PSEUDO[name]
        if name in self.params:
            return self.params[name]
        return {"LogBucket": BUCKET, "TieringS3Policy": f"arn:aws:iam::{ACCOUNT}:policy/TieringS3Policy",
                "Application": "APPID"}[name]

    def get_att(self, resource: str, attribute: str) -> str:
        return {("LogBucket", "Arn"): BUCKET_ARN, ("Application", "Arn"): APP_ARN,
                ("Application", "ApplicationId"): "APPID",
                ("JobRole", "Arn"): f"arn:aws:iam::{ACCOUNT}:role/JobRole",
                ("AirflowRole", "Arn"): f"arn:aws:iam::{ACCOUNT}:role/AirflowRole"}[(resource, attribute)]

    def sub(self, text: str) -> str:
        def one(match: re.Match[str]) -> str:
            name = match.group(1)
            if "." in name and name not in PSEUDO:
                return self.get_att(*name.split(".", 1))
            return str(self.ref(name))

        return re.sub(r"\$\{([^}!]+)\}", one, text)

    def resolve(self, node: Any) -> Any:
        if isinstance(node, dict):
            if len(node) == 1:
                [(key, value)] = node.items()
                if key == "Ref":
                    return self.ref(value)
                if key == "Condition" and isinstance(value, str):
                    if value in self.conditions:
                        return self.conditions[value]
                    return self.resolve(self.template["Conditions"][value])
                if key == "Fn::Sub":
                    assert isinstance(value, str), "only the one-argument Fn::Sub is evaluated here"
                    return self.sub(value)
                if key == "Fn::If":
                    name, yes, no = value
                    return self.resolve(yes if self.conditions[name] else no)
                if key == "Fn::Equals":
                    left, right = (self.resolve(v) for v in value)
                    return str(left) == str(right)
                if key == "Fn::Not":
                    return not self.resolve(value[0])
                if key == "Fn::FindInMap":
                    mapping, top, second = (self.resolve(v) for v in value)
                    return self.template["Mappings"][mapping][str(top)][second]
                if key == "Fn::GetAtt":
                    resource, attribute = value if isinstance(value, list) else value.split(".", 1)
                    return self.get_att(resource, attribute)
            out = {}
            for key, value in node.items():
                resolved = self.resolve(value)
                if resolved is not NO_VALUE:
                    out[str(key)] = resolved
            return out
        if isinstance(node, list):
            return [r for r in (self.resolve(v) for v in node) if r is not NO_VALUE]
        return node

    def props(self, resource: str) -> dict[str, Any]:
        found: dict[str, Any] = self.resources[resource]["Properties"]
        return found


@pytest.fixture(scope="module")
def template() -> dict[str, Any]:
    decoded, matches = decode(str(TEMPLATE))
    assert not matches, matches
    assert decoded is not None
    return decoded


def stacks(template: dict[str, Any]) -> list[Stack]:
    """Every combination of the parameters that change which statements and rules exist."""
    out = []
    for kms, versioning, airflow in itertools.product(["", KEY_ARN], ["true", "false"], ["", AIRFLOW_PRINCIPAL]):
        params = {"BucketName": BUCKET, "Prefix": PREFIX, "KmsKeyArn": kms, "Versioning": versioning,
                  "AirflowPrincipalArn": airflow, "ArtifactsPrefix": ARTIFACTS}
        out.append(Stack(params, template))
    return out


def statements(policy_document: dict[str, Any]) -> list[dict[str, Any]]:
    found = policy_document["Statement"]
    return found if isinstance(found, list) else [found]


def as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def test_cfn_lint_finds_nothing() -> None:
    """cfn-lint from the venv, its default rules (errors and warnings): zero findings."""
    matches = lint_file(TEMPLATE)
    assert matches == [], "\n".join(str(m) for m in matches)


def code_operations() -> set[str]:
    """Every boto3 operation called in the package: S3Store._call("op", ...), get_paginator("op"),
    and direct client.op(...) calls."""
    ops: set[str] = set()
    for path in PACKAGE.rglob("*.py"):
        text = path.read_text()
        ops |= set(re.findall(r"_call\(\s*\"([a-z0-9_]+)\"", text))
        ops |= set(re.findall(r"get_paginator\(\s*\"([a-z0-9_]+)\"", text))
        ops |= {op for op in re.findall(r"\bclient\.([a-z0-9_]+)\(", text) if op != "get_paginator"}
        services = set(re.findall(r"\.client\(\s*\"([a-z0-9-]+)\"", text))
        assert services <= {"s3"}, f"{path}: a boto3 client for {services}: the IAM policy knows only S3"
    return ops


def test_the_policy_grants_exactly_what_the_code_calls(template: dict[str, Any]) -> None:
    ops = code_operations()
    assert {"get_object", "put_object", "copy_object", "list_objects_v2", "head_bucket"} <= ops  # the scan works
    unknown = ops - set(OPERATION_ACTIONS)
    assert not unknown, f"S3 operations without an IAM decision (add them to OPERATION_ACTIONS): {unknown}"
    needed = set().union(*(OPERATION_ACTIONS[op] for op in ops)) | COST_REPORT_ACTIONS
    for stack in stacks(template):
        doc = stack.props("TieringS3Policy")["PolicyDocument"]
        granted = {a for s in statements(doc) for a in as_list(s["Action"]) if a.startswith("s3:")}
        assert granted == needed, (granted - needed, needed - granted)


def allowed_resources(stack: Stack) -> dict[str, set[str]]:
    """Every (action, resource) pair any policy of the stack may contain."""
    allowed: dict[str, set[str]] = {a: {OBJECTS_ARN} for a in OBJECT_ACTIONS}
    allowed |= {a: {BUCKET_ARN} for a in BUCKET_ACTIONS}
    allowed["s3:GetObject"] = {OBJECTS_ARN, f"arn:aws:s3:::{BUCKET}/{ARTIFACTS}/*"}
    if stack.params["KmsKeyArn"]:
        allowed |= {a: {KEY_ARN} for a in KMS_ACTIONS}
    allowed |= {a: {APP_ARN, f"{APP_ARN}/jobruns/*"} for a in EMR_ACTIONS}
    allowed["iam:PassRole"] = {stack.get_att("JobRole", "Arn")}
    return allowed


def policies(stack: Stack) -> dict[str, list[dict[str, Any]]]:
    """Each identity policy of the stack by name, as its list of statements."""
    out = {"TieringS3Policy": statements(stack.props("TieringS3Policy")["PolicyDocument"])}
    for role in ("JobRole", "AirflowRole"):
        if role in stack.resources:
            for inline in stack.props(role).get("Policies", []):
                out[f"{role}/{inline['PolicyName']}"] = statements(inline["PolicyDocument"])
    return out


def test_no_statement_grants_more_than_the_allowed_actions_on_the_allowed_resources(
        template: dict[str, Any]) -> None:
    for stack in stacks(template):
        allowed = allowed_resources(stack)
        for name, stmts in policies(stack).items():
            for s in stmts:
                assert s["Effect"] == "Allow", (name, s)
                assert not {"NotAction", "NotResource", "NotPrincipal"} & set(s), (name, s)
                for action in as_list(s["Action"]):
                    assert "*" not in action, (name, action)
                    assert action in allowed, (name, action)
                    for resource in as_list(s["Resource"]):
                        assert resource in allowed[action], (name, action, resource)


def test_listing_is_limited_to_the_prefix(template: dict[str, Any]) -> None:
    for stack in stacks(template):
        listing = [s for s in policies(stack)["TieringS3Policy"] if "s3:ListBucket" in as_list(s["Action"])]
        assert len(listing) == 2
        by_sid = {s["Sid"]: s for s in listing}
        for s in listing:
            assert as_list(s["Action"]) == ["s3:ListBucket"]
            assert s["Resource"] == BUCKET_ARN
        # every listing the code makes has Prefix=PREFIX/...: only those are allowed
        assert by_sid["ListUnderPrefix"]["Condition"] == {"StringLike": {"s3:prefix": f"{PREFIX}/*"}}
        # HeadBucket is s3:ListBucket without a prefix; allowed only for requests that carry none
        assert by_sid["HeadBucketForS3Clock"]["Condition"] == {"Null": {"s3:prefix": "true"}}
        # nothing else grants a bucket-level action with a condition we did not look at
        for s in policies(stack)["TieringS3Policy"]:
            if set(as_list(s["Action"])) & (BUCKET_ACTIONS - {"s3:ListBucket"}):
                assert "Condition" not in s
                assert s["Resource"] == BUCKET_ARN


def test_kms_permissions_only_on_the_given_key_and_only_through_s3(template: dict[str, Any]) -> None:
    for stack in stacks(template):
        kms = [s for stmts in policies(stack).values() for s in stmts
               if any(a.startswith("kms:") for a in as_list(s["Action"]))]
        if not stack.params["KmsKeyArn"]:
            assert kms == []
            continue
        [statement] = kms
        assert set(statement["Action"]) == KMS_ACTIONS
        assert statement["Resource"] == KEY_ARN
        assert statement["Condition"] == {"StringEquals": {"kms:ViaService": f"s3.{REGION}.amazonaws.com"}}


def test_roles_trust_only_emr_serverless_and_the_named_airflow_principal(template: dict[str, Any]) -> None:
    for stack in stacks(template):
        [trust] = statements(stack.props("JobRole")["AssumeRolePolicyDocument"])
        assert trust == {"Effect": "Allow", "Principal": {"Service": "emr-serverless.amazonaws.com"},
                         "Action": "sts:AssumeRole"}
        assert stack.props("JobRole")["ManagedPolicyArns"] == [stack.ref("TieringS3Policy")]
        if not stack.params["AirflowPrincipalArn"]:
            assert "AirflowRole" not in stack.resources
            assert "AirflowRoleArn" not in stack.outputs
            continue
        [trust] = statements(stack.props("AirflowRole")["AssumeRolePolicyDocument"])
        assert trust["Principal"] == {"AWS": AIRFLOW_PRINCIPAL}
        [pass_role] = [s for s in policies(stack)["AirflowRole/run-compaction-jobs"]
                       if s["Action"] == "iam:PassRole"]
        assert pass_role["Condition"] == {"StringEquals": {"iam:PassedToService": "emr-serverless.amazonaws.com"}}


def bucket(stack: Stack) -> dict[str, Any]:
    return stack.props("LogBucket")


def rules(stack: Stack) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = bucket(stack)["LifecycleConfiguration"]["Rules"]
    return found


def rule_prefix(rule: dict[str, Any]) -> str:
    """The key prefix a rule applies to ("" = the whole bucket); tag or size filters are not used here."""
    assert set(rule.get("Filter", {})) <= {"Prefix"}, rule
    assert not {"TagFilters", "ObjectSizeGreaterThan", "ObjectSizeLessThan"} & set(rule), rule
    prefix: str = rule.get("Prefix", rule.get("Filter", {}).get("Prefix", ""))
    return prefix


def reserved(sub: str) -> str:
    return f"{PREFIX}/{RESERVED_DIR}/{sub}/"


@pytest.mark.parametrize("grace", ["1", "3", "7", "14", "30", "60", "90"])
def test_lifecycle_rules_respect_the_commit_protocol(template: dict[str, Any], grace: str) -> None:
    assert template["Parameters"]["GraceDays"]["AllowedValues"] == ["1", "3", "7", "14", "30", "60", "90"]
    for variant in stacks(template):
        stack = Stack({**variant.params, "GraceDays": grace}, template)
        by_id = {r["Id"]: r for r in rules(stack)}
        assert len(by_id) == len(rules(stack))
        assert all(r["Status"] == "Enabled" for r in by_id.values())

        abort = [r for r in by_id.values() if "AbortIncompleteMultipartUpload" in r]
        assert len(abort) == 1
        assert rule_prefix(abort[0]) == ""
        assert 1 <= abort[0]["AbortIncompleteMultipartUpload"]["DaysAfterInitiation"] <= 7

        expiring = {rule_prefix(r): r["ExpirationInDays"] for r in by_id.values() if "ExpirationInDays" in r}
        assert expiring.keys() == {reserved(STAGING_DIR), reserved(BACKUP_DIR)}
        assert all(days >= int(grace) + MARGIN_DAYS for days in expiring.values()), (grace, expiring)
        assert not any("ExpirationDate" in r or "Transitions" in r or "Transition" in r for r in by_id.values())

        for r in by_id.values():
            where = rule_prefix(r)
            for keep in (JOURNAL_DIR, STATE_DIR, LEASES_DIR):
                # no rule aimed at (or inside) journal/, state/, leases/; and no rule covering them may
                # expire a current version
                assert not where.startswith(reserved(keep)), (keep, r["Id"])
                if reserved(keep).startswith(where):
                    assert "ExpirationInDays" not in r, (keep, r["Id"])

        noncurrent = [r for r in by_id.values() if "NoncurrentVersionExpiration" in r]
        if stack.params["Versioning"] == "true":
            assert bucket(stack)["VersioningConfiguration"] == {"Status": "Enabled"}
            [rule] = noncurrent
            assert PREFIX.startswith(rule_prefix(rule))  # covers every replaced segment
            assert rule["NoncurrentVersionExpiration"]["NoncurrentDays"] == int(grace)
        else:
            assert "VersioningConfiguration" not in bucket(stack)
            assert noncurrent == []


def test_the_default_grace_period_is_the_codes(template: dict[str, Any]) -> None:
    assert int(template["Parameters"]["GraceDays"]["Default"]) == DEFAULT_GRACE_DAYS


def test_the_bucket_is_encrypted_private_and_retained(template: dict[str, Any]) -> None:
    assert template["Resources"]["LogBucket"]["DeletionPolicy"] == "Retain"
    for stack in stacks(template):
        [sse] = bucket(stack)["BucketEncryption"]["ServerSideEncryptionConfiguration"]
        if stack.params["KmsKeyArn"]:
            assert sse["ServerSideEncryptionByDefault"] == {"SSEAlgorithm": "aws:kms", "KMSMasterKeyID": KEY_ARN}
            assert sse["BucketKeyEnabled"] is True
        else:
            assert sse["ServerSideEncryptionByDefault"] == {"SSEAlgorithm": "AES256"}
        assert bucket(stack)["PublicAccessBlockConfiguration"] == {
            "BlockPublicAcls": True, "BlockPublicPolicy": True, "IgnorePublicAcls": True, "RestrictPublicBuckets": True}
        [deny] = statements(stack.props("LogBucketPolicy")["PolicyDocument"])
        assert deny["Effect"] == "Deny"
        assert deny["Condition"] == {"Bool": {"aws:SecureTransport": "false"}}


def test_the_emr_serverless_application_runs_spark_4(template: dict[str, Any]) -> None:
    """emr-spark-8.0.0 ships Spark 4.0.2 (AWS release notes); the lock's pyspark is 4.x: same major."""
    spark_of_release = {"emr-spark-8.0.0": "4.0.2"}
    lock = (ROOT / "requirements.lock").read_text()
    pyspark = re.search(r"^pyspark==(\d+)\.", lock, re.MULTILINE)
    assert pyspark is not None
    for stack in stacks(template):
        app = stack.props("Application")
        assert app["Type"] == "SPARK"
        assert app["ReleaseLabel"] in spark_of_release
        assert spark_of_release[app["ReleaseLabel"]].split(".")[0] == pyspark.group(1)
        assert app["AutoStopConfiguration"] == {"Enabled": True, "IdleTimeoutMinutes": 15}


def test_the_outputs_give_airflow_what_it_needs(template: dict[str, Any]) -> None:
    for stack in stacks(template):
        out = stack.outputs
        assert (out["BucketName"], out["Prefix"]) == (BUCKET, PREFIX)
        assert out["EmrServerlessApplicationId"] == "APPID"
        assert out["JobRoleArn"] == stack.get_att("JobRole", "Arn")
        conn = json.loads(out["AirflowConnAwsDefault"])
        assert conn["conn_type"] == "aws"
        assert conn["extra"]["region_name"] == REGION
        if stack.params["AirflowPrincipalArn"]:
            assert conn["extra"]["role_arn"] == out["AirflowRoleArn"] == stack.get_att("AirflowRole", "Arn")
        else:
            assert "role_arn" not in conn["extra"]
        assert out["AirflowEnvironment"].split() == [f"TIERING_BUCKET={BUCKET}", f"TIERING_PREFIX={PREFIX}",
                                                     f"AWS_DEFAULT_REGION={REGION}"]
        assert out["ArtifactsUri"] == f"s3://{BUCKET}/{ARTIFACTS}/"

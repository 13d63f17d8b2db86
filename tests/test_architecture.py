"""The house rules that keep the package's layers apart, checked on the source."""

from __future__ import annotations

import ast
import re
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

PACKAGE = Path(__file__).parents[1] / "tiering"


def _imports(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module.split(".")[0])
    return found


def test_only_the_store_module_imports_boto3() -> None:
    users = sorted(str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py") if _imports(p) & {"boto3", "botocore"})
    assert users == ["storage/s3.py"]


def _modules(path: Path) -> set[str]:
    """Every module this file imports, by its full name."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
    return found


# Who builds an S3 store, and so imports the boto3 implementation: the entry points (here the CLI, the demo
# and the Spark jobs' drivers and tasks; outside the package the DAGs). Everything else speaks to
# tiering.storage.objects and is handed a store; a thread that needs its own asks the store for another.
STORE_BUILDERS = {"cli/report.py", "cli/s3.py", "demo/s3.py", "spark/jobs.py"}


def test_only_the_entry_points_import_the_boto3_store() -> None:
    users = {str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py") if "tiering.storage.s3" in _modules(p)}
    assert users == STORE_BUILDERS


def test_the_store_interface_and_the_memory_store_know_no_s3_client() -> None:
    """The interface, its values, errors and the streamed upload import no S3 client and no implementation;
    the memory store and the dry run's store depend on the interface only."""
    for name in ("objects.py", "memory.py", "aside.py", "layout.py"):
        imports = _modules(PACKAGE / "storage" / name)
        assert not {m for m in imports if m.split(".")[0] in ("boto3", "botocore", "urllib3")}, name
        assert "tiering.storage.s3" not in imports, name


def test_the_format_package_is_pure() -> None:
    """tiering.kafka: bytes and streams in, bytes and dataclasses out; no S3, Spark, Airflow or other layers."""
    for path in (PACKAGE / "kafka").rglob("*.py"):
        imports = _imports(path)
        assert not imports & {"boto3", "botocore", "pyspark", "airflow", "rich"}, path
        assert "tiering" not in imports or all(
            m.startswith(("tiering.kafka", "tiering.errors"))
            for m in (n.module or "" for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.ImportFrom))
            if m.startswith("tiering")), path


def test_full_pyspark_is_installed_without_the_pyspark_client_that_would_overwrite_it() -> None:
    """The Spark provider pulls pyspark-client 4.2.0, whose install overwrote pyspark/__init__.py of the full
    pyspark 4.3.0. We submit with the full pyspark's spark-submit and keep pyspark-client out."""
    from importlib import metadata

    import pyspark

    assert pyspark.__version__ == metadata.version("pyspark")
    assert (Path(pyspark.__file__).parent / "bin" / "spark-submit").exists()
    with pytest.raises(metadata.PackageNotFoundError):
        metadata.version("pyspark-client")


# The layers, lowest first: a module may import from its own layer and the layers below it, never above.
# What each holds: docs/architecture.md.
LAYERS: dict[str, int] = {
    "errors": 0, "documents": 0,
    "options": 0,  # the kinds' options, each declared once (the DAG files import it when Airflow parses them)
    "lifecycle/vocabulary": 0,  # the lifecycle's words (enums only): every layer may speak them, the cost model too
    "kafka": 1, "cost": 1,  # the format; prices and the cost model (both pure)
    "storage": 2, "local": 2,  # the object store and key naming; segment files on a local disk
    "lifecycle": 3,  # the journal entry and the partition's state document
    "plan": 4,  # the plan document, scan, inventory, policy, the plan's chunks, estimates
    "commit": 5,  # the commit protocol and partition leases
    "run": 6,  # runs over a bucket: the pipeline's steps, compact, rollback, cleanup, tiering
    "report": 7, "spark": 7,
    "steps": 8,  # the DAGs' tasks: each a call from typed params to a typed step document
    "demo": 9,  # demos and their generated data: apart from the product
    "cli": 10,
    "__main__": 11,
}


def _layer(path: Path) -> str:
    """The layer's name: the module's own where LAYERS names it (``lifecycle/vocabulary``), else its package's."""
    rel = path.relative_to(PACKAGE)
    module = "/".join(rel.with_suffix("").parts[:2])
    return module if module in LAYERS else rel.parts[0].removesuffix(".py")


def _tiering_imports(path: Path) -> set[str]:
    """The top-level parts (``tiering.<part>``) this module imports, at any depth of the file."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                 [node.module] if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 else [])
        for name in names:
            parts = name.split(".")
            if parts[0] == "tiering" and len(parts) > 1:
                module = "/".join(parts[1:3])
                found.add(module if module in LAYERS else parts[1])
    return found


def test_every_module_has_a_layer() -> None:
    unplaced = sorted(str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py")
                      if p.name != "__init__.py" or p.parent != PACKAGE if _layer(p) not in LAYERS)
    assert unplaced == []


def test_no_layer_imports_one_above_it() -> None:
    upward = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.parent == PACKAGE and path.name == "__init__.py":
            continue
        own = LAYERS[_layer(path)]
        for target in _tiering_imports(path):
            if target in LAYERS and LAYERS[target] > own:
                upward.append(f"{path.relative_to(PACKAGE)} imports tiering.{target}")
    assert upward == []


# The run engine's kinds (tiering/run/engine.py): each supplies only its own work and reaches what runs share
# through the engine and the modules below it; no kind imports another, and the engine imports no kind.
KINDS = ("run/compaction.py", "run/keycompact.py", "run/merge.py", "run/rollback.py", "run/tier.py",
         "run/cleanup.py")
SHARED_BY_KINDS = {"tiering.run.engine", "tiering.run.documents", "tiering.run.segment"}


def _run_modules(path: Path) -> set[str]:
    """The modules of ``tiering.run`` this file imports (``from tiering.run import engine`` included)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module == "tiering.run":
            found |= {f"tiering.run.{alias.name}" for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("tiering.run."):
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("tiering.run.")}
    return found


def test_kinds_import_the_engine_never_each_other() -> None:
    kinds = {f"tiering.{k.removesuffix('.py').replace('/', '.')}" for k in KINDS}
    crossing = {k: sorted(_run_modules(PACKAGE / k) - SHARED_BY_KINDS) for k in KINDS}
    assert crossing == {k: [] for k in KINDS}
    assert not _run_modules(PACKAGE / "run" / "engine.py") & kinds


# The commit state machine has one way in for every kind of operation: an entry is finished or abandoned through
# tiering.commit.finish, which takes it in place (swap.py) or through .swap files (regroup.py) as its kind says,
# and folds what stops either the same way. Outside those three modules nothing reaches the two strategies but
# by the names below (each kind stages its own operation; the run learns its swap mode): no module import of
# them, no other name, whatever the spelling of the import.
STRATEGIES = {"tiering.commit.swap", "tiering.commit.regroup"}
STRATEGY_NAMES_OUTSIDE = {"stage_merge", "stage_cleaned_group", "stage_unmerge", "swap_mode"}


def _absolute(module: str | None, level: int, path: Path) -> str:
    """An ImportFrom's module as an absolute name (a relative import resolved against ``path``'s package)."""
    if not level:
        return module or ""
    package = ["tiering", *path.relative_to(PACKAGE).parent.parts]
    base = package[:len(package) - level + 1]
    return ".".join([*base, *([module] if module else [])])


def test_journals_are_finished_only_through_the_one_entry_point() -> None:
    taken = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        if str(path.relative_to(PACKAGE)) in ("commit/finish.py", "commit/swap.py", "commit/regroup.py"):
            continue
        reached = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                reached |= {a.name for a in node.names if a.name in STRATEGIES}
            elif isinstance(node, ast.ImportFrom):
                module = _absolute(node.module, node.level, path)
                if module in STRATEGIES:
                    reached |= {f"{module}.{a.name}" for a in node.names if a.name not in STRATEGY_NAMES_OUTSIDE}
                reached |= {f"{module}.{a.name}" for a in node.names if f"{module}.{a.name}" in STRATEGIES}
        if reached:
            taken[str(path.relative_to(PACKAGE))] = sorted(reached)
    assert taken == {}
    finish = ast.parse((PACKAGE / "commit" / "finish.py").read_text())
    called = {f"{node.func.value.id}.{node.func.attr}" for node in ast.walk(finish) if isinstance(node, ast.Call)
              and isinstance(node.func, ast.Attribute) and isinstance(node.func.value, ast.Name)}
    assert {f"{m}.{step}" for m in ("swap", "regroup") for step in ("roll_forward", "take_out")} <= called


# What a caller (the CLI, the DAG's steps, the kinds' registry, compaction's scan and plan) may take from a
# kind's module: the kind, its options, what a dry run gives (plan_merges folds engine.preview) and a run's
# documents (tiering's plan and report, its results), and the undo of a kind whose runs keep no backup (tiering).
# The work on a partition is reached only through the engine (engine.run, engine.run_unit), never called beside it.
KIND_EXPORTS = {"KeyCompaction", "KeyCompactOptions", "KeyPartition", "Merging", "MergeOptions", "PlannedMerges",
                "plan_merges", "Tiering", "TierOptions", "TierPartition", "SegmentTiering", "TierTally", "TierPlan",
                "plan_document", "run_results", "tier_report", "tier_table", "lifecycle_configuration",
                "Rollback", "RollbackOptions", "rollback", "Compaction", "CompactionOptions",
                "Cleanup", "CleanupOptions", "CleanupPartition", "CleanupFigures", "cleanup", "DEFAULT_GRACE_DAYS"}


def test_callers_reach_a_kinds_work_only_through_the_engine() -> None:
    kinds = {f"tiering.{k.removesuffix('.py').replace('/', '.')}" for k in KINDS}
    taken: dict[str, set[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        if str(path.relative_to(PACKAGE)) in KINDS:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module in kinds:
                taken.setdefault(str(path.relative_to(PACKAGE)), set()).update(a.name for a in node.names)
    beyond = {k: sorted(v - KIND_EXPORTS) for k, v in taken.items()}
    assert beyond == {k: [] for k in taken}
    assert "run/kinds.py" in taken


def test_the_spark_jobs_reach_kinds_by_name_and_never_the_command_line() -> None:
    """A Spark job reads a kind's options as the JSON they write (``tiering.run.kinds``): it imports no kind
    module and nothing of ``tiering.cli`` (whose parsers would read the options a second way)."""
    jobs = Path(__file__).parents[1] / "spark_jobs"
    kinds = {f"tiering.{k.removesuffix('.py').replace('/', '.')}" for k in KINDS}
    reached = {p.name: sorted(m for m in _modules(p) | _run_modules(p) if m.startswith("tiering.cli") or m in kinds)
               for p in sorted(jobs.glob("*.py"))}
    assert reached == {name: [] for name in reached}
    assert "run_kind.py" in reached


def test_the_demo_is_apart_from_the_product() -> None:
    """Only the command line (and the demo itself) may import tiering.demo."""
    users = sorted(str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py")
                   if "demo" in _tiering_imports(p) and _layer(p) not in ("demo", "cli"))
    assert users == []



def _names(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    return ({n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
            | {a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) for a in n.names})


def test_our_keys_are_named_in_one_module() -> None:
    """Every key under PREFIX/_tiering/ is built by a function of storage/layout.py: no other module of the
    package, the DAGs or the Spark job reaches for the reserved prefix itself."""
    root = PACKAGE.parent
    sources = [*PACKAGE.rglob("*.py"), *(root / "dags").glob("*.py"), *(root / "spark_jobs").glob("*.py")]
    naming = sorted(str(p.relative_to(root)) for p in sources if p != PACKAGE / "storage" / "layout.py"
                    and _names(p) & {"reserved_key", "RESERVED_DIR"})
    assert naming == []


# What our keys are made of below PREFIX/_tiering/: the reserved directory, a run's step directories and plan
# files, and its documents' names. Docstrings may show them; code builds them with storage/layout.py.
KEY_PARTS = re.compile(r"(?<![\w.])_tiering\b|(^|/)(runs|stage|commit|usage|keys|staging|backup|journal|leases)/"
                       r"|^part-|\.jsonl\.gz|tier-plan\.json|compact-keys\.json|(^|/)plan\.json")


def _literals(path: Path, wanted: Callable[[str], bool]) -> list[str]:
    """The string literals of ``path`` (docstrings aside) that ``wanted`` picks, with their line."""
    tree = ast.parse(path.read_text())
    docs = {id(node.body[0].value) for node in ast.walk(tree)
            if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and node.body
            and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
    return [f"{path.name}:{node.lineno}: {node.value!r}" for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs
            and wanted(node.value)]


def _key_literals(path: Path) -> list[str]:
    return _literals(path, lambda text: KEY_PARTS.search(text) is not None)


def test_no_module_spells_out_a_key_below_a_run() -> None:
    """The parts of our keys (``_tiering``, ``runs/``, ``stage/``, ``part-00000``, ``.jsonl.gz``, the run
    documents' names) appear as literals in storage/layout.py only."""
    root = PACKAGE.parent
    sources = [*PACKAGE.rglob("*.py"), *(root / "dags").glob("*.py"), *(root / "spark_jobs").glob("*.py")]
    found = [hit for p in sorted(sources) if p != PACKAGE / "storage" / "layout.py" for hit in _key_literals(p)]
    assert found == []
    seen = " ".join(_key_literals(PACKAGE / "storage" / "layout.py"))  # the rule sees them where they are
    assert all(part in seen for part in ("'_tiering'", "'part-'", "'.jsonl.gz'", "'tier-plan.json'")), seen


def test_no_module_spells_out_a_storage_class() -> None:
    """Storage classes are :class:`~tiering.lifecycle.vocabulary.StorageClass` members; their names appear as
    literals in lifecycle/vocabulary.py only."""
    from tiering.lifecycle.vocabulary import StorageClass

    names = {c.value for c in StorageClass}
    root = PACKAGE.parent
    sources = [*PACKAGE.rglob("*.py"), *(root / "dags").glob("*.py"), *(root / "spark_jobs").glob("*.py")]
    vocabulary = PACKAGE / "lifecycle" / "vocabulary.py"
    found = [hit for p in sorted(sources) if p != vocabulary for hit in _literals(p, names.__contains__)]
    assert found == []
    assert len(_literals(vocabulary, names.__contains__)) == len(names)  # the rule sees them where they are


def test_the_commit_plan_run_and_lifecycle_layers_name_a_segments_files_by_their_role() -> None:
    """A segment's files (``log``, ``index``, ``timeindex``, ``txnindex``) are
    :class:`~tiering.lifecycle.vocabulary.FileRole` members in the layers that plan, commit and run work on
    them; their names appear as literals in lifecycle/vocabulary.py only there."""
    from tiering.lifecycle.vocabulary import FileRole

    names = {r.value for r in FileRole}
    vocabulary = PACKAGE / "lifecycle" / "vocabulary.py"
    sources = [p for layer in ("commit", "lifecycle", "plan", "run") for p in sorted((PACKAGE / layer).rglob("*.py"))]
    found = [hit for p in sources if p != vocabulary for hit in _literals(p, names.__contains__)]
    assert found == []
    assert len(_literals(vocabulary, names.__contains__)) == len(names)


# Where a JSON document is read or written, an untyped mapping is what there is: these functions (besides every
# to_json / from_json / *_json) take or give one, each for the reason given.
JSON_BOUNDARIES: dict[str, str] = {
    "run/engine.py:unit_task": "the Spark executor's entry: the unit as the driver sent it",
    "run/tier.py:lifecycle_configuration": "writes S3's PutBucketLifecycleConfiguration document",
    "run/tier.py:rule": "one rule of that S3 document",
    "steps/compaction.py:from_params": "the DAG's params, as Airflow validated them against their schema",
    "steps/storage_classes.py:from_params": "the DAG's params, as Airflow validated them against their schema",
    "steps/rollback.py:from_params": "the DAG's params, as Airflow validated them against their schema",
}
TYPED_LAYERS = ("run", "report", "steps", "cli", "demo")


def _untyped_signatures() -> list[str]:
    """Functions of the typed layers whose parameters or return mention ``dict[str, Any]`` or
    ``Mapping[str, Any]`` (a JSON document), outside the (de)serialisation functions."""
    found = []
    for layer in TYPED_LAYERS:
        for path in sorted((PACKAGE / layer).rglob("*.py")):
            tree = ast.parse(path.read_text())
            # an options class's conversions to and from its declared values (tiering.options.Options)
            conversions = {id(f) for c in ast.walk(tree) if isinstance(c, ast.ClassDef)
                           and any(ast.unparse(b) == "Options" for b in c.bases)
                           for f in c.body if isinstance(f, ast.FunctionDef) and f.name in ("values", "from_values")}
            for node in ast.walk(tree):
                if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    continue
                args = node.args
                hints = [a.annotation for a in [*args.posonlyargs, *args.args, *args.kwonlyargs,
                                                *filter(None, [args.vararg, args.kwarg])] if a.annotation]
                hints += [node.returns] if node.returns is not None else []
                if not any("str, Any]" in ast.unparse(h) for h in hints):
                    continue
                name = f"{path.relative_to(PACKAGE)}:{node.name}"
                if (node.name in ("to_json", "from_json") or node.name.endswith("_json") or id(node) in conversions
                        or name in JSON_BOUNDARIES):
                    continue
                found.append(f"{name} (line {node.lineno})")
    return found


def test_documents_cross_the_typed_layers_typed() -> None:
    """run, report, cli and demo hand typed documents to each other (Report, RunResult, the plan's steps, the
    forecast), never a JSON mapping read back; only the (de)serialisation functions see one."""
    assert _untyped_signatures() == []
    for name in JSON_BOUNDARIES:
        module, _, function = name.partition(":")
        assert f"def {function}(" in (PACKAGE / module).read_text(), f"{name}: no such function (stale entry)"


def test_the_signature_rule_sees_what_it_forbids(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The control: a printer taking a report as a dict is found, however its signature is laid out."""
    fake = tmp_path / "tiering"
    (fake / "cli").mkdir(parents=True)
    (fake / "cli" / "bad.py").write_text(
        "from typing import Any\n\n\ndef to_table(\n    report: 'dict[str, Any]',\n) -> str:\n    return ''\n\n\n"
        "def fine(report: object) -> dict[str, int]:\n    return {}\n")
    monkeypatch.setattr(sys.modules[__name__], "PACKAGE", fake)
    assert _untyped_signatures() == ["cli/bad.py:to_table (line 4)"]


def _third_party_users(module: str) -> list[str]:
    root = PACKAGE.parent
    sources = [*PACKAGE.rglob("*.py"), *(root / "dags").glob("*.py"), *(root / "spark_jobs").glob("*.py")]
    return sorted(str(p.relative_to(root)) for p in sources if module in _imports(p))


def test_airflow_is_imported_by_the_dags_only() -> None:
    assert _third_party_users("airflow") == ["dags/kafka_segment_compaction.py", "dags/kafka_segment_rollback.py",
                                             "dags/kafka_segment_tiering.py"]


def test_pyspark_is_imported_where_spark_is_run_only() -> None:
    """A job's driver starts the session, spark-submit is found in the pyspark package, Spark's Python
    daemon is ours; the job files and everything else only hand functions to them."""
    assert _third_party_users("pyspark") == ["tiering/spark/daemon.py", "tiering/spark/driver.py",
                                             "tiering/spark/submit.py"]


def _body(node: ast.FunctionDef | ast.Module) -> list[ast.stmt]:
    """The statements that do something: not a docstring, an import, or a nested function's definition."""
    body = node.body[1:] if node.body and isinstance(node.body[0], ast.Expr) and isinstance(
        getattr(node.body[0], "value", None), ast.Constant) else node.body
    return [s for s in body if not isinstance(s, ast.Import | ast.ImportFrom | ast.FunctionDef)]


MAX_TASK_STATEMENTS = 6


def _root(decorator: ast.expr) -> str:
    """The name a decorator starts from (``task`` of ``@task``, ``@task(...)``, ``@task.branch``)."""
    node = decorator.func if isinstance(decorator, ast.Call) else decorator
    while isinstance(node, ast.Attribute):
        node = node.value
    return node.id if isinstance(node, ast.Name) else ""


def test_a_dag_task_is_one_call_of_a_step() -> None:
    """The DAG files declare tasks and params: a task reads its typed params and calls one step function of
    tiering.steps (with the Airflow-only parts: failing without retries, the asset's extra), no loop or
    decision of the run's own."""
    tasks = []
    for path in sorted((PACKAGE.parent / "dags").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef) and any(_root(d) == "task" for d in node.decorator_list):
                statements = _body(node)
                loops = [s for s in ast.walk(node) if isinstance(s, ast.For | ast.While | ast.comprehension)]
                steps = [c for c in ast.walk(node) if isinstance(c, ast.Call) and isinstance(c.func, ast.Attribute)
                         and isinstance(c.func.value, ast.Name) and c.func.value.id in ("compaction", "storage_classes",
                                                                                        "steps")]
                tasks.append((f"{path.name}:{node.name}", len(statements) <= MAX_TASK_STATEMENTS, len(loops) <= 1,
                              len(steps) >= 1))
    assert len(tasks) == 10
    assert [t for t in tasks if not all(t[1:])] == []


def test_a_spark_job_file_parses_its_arguments_and_calls_one_driver_function() -> None:
    for path in sorted((PACKAGE.parent / "spark_jobs").glob("*.py")):
        tree = ast.parse(path.read_text())
        loops = [n.lineno for n in ast.walk(tree) if isinstance(n, ast.For | ast.While)]
        assert loops == [], path.name
        assert "tiering.spark.jobs" in _modules(path), path.name
        assert "tiering.storage.s3" not in _modules(path), path.name
        from_run = {a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and (n.module or "").startswith(
            "tiering.run.") for a in n.names}
        assert all(name[0].isupper() for name in from_run), f"{path.name} calls into tiering.run: {from_run}"


# a segment's work done (or staged for its commit)
DONE = {"COMPACTED", "ROLLED_BACK", "MERGED", "REPAIRED", "STAGED", "MOVED", "EXPIRED"}


def test_a_segment_left_as_it_was_names_its_cause() -> None:
    """Outcomes are counted by cause, never by the reason's words: every SegmentResult the package makes for a
    segment skipped, failed, aborted or superseded says its Cause."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.Call) and getattr(node.func, "id", None) == "SegmentResult"):
                continue
            status = ast.unparse(node.args[2]) if len(node.args) > 2 else ""
            if not any(done in status for done in DONE) and "cause" not in {k.arg for k in node.keywords}:
                found.append(f"{path.relative_to(PACKAGE)}:{node.lineno}: {status}")
    assert found == []


def test_no_module_groups_by_the_words_of_a_reason() -> None:
    splitting = [f"{p.relative_to(PACKAGE)}:{n.lineno}" for p in sorted(PACKAGE.rglob("*.py"))
                 for n in ast.walk(ast.parse(p.read_text())) if isinstance(n, ast.Call)
                 and isinstance(n.func, ast.Attribute) and n.func.attr in ("split", "partition")
                 and "reason" in ast.unparse(n.func.value)]
    assert splitting == []

"""The house rules that keep the package's layers apart, checked on the source."""

from __future__ import annotations

import ast
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
    assert users == ["s3/store.py"]


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

"""``python -m magnetar.spark.precompile``: the zips Spark puts on its Python processes' path get bytecode,
so those processes import without compiling (a Python process started per streaming query)."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path


def _import(archive: Path, module: str) -> subprocess.CompletedProcess[str]:
    code = f"import {module} as m; print(m.__file__); print(m.VALUE)"
    env = {"PATH": os.environ.get("PATH", ""), "PYTHONPATH": str(archive), "PYTHONDONTWRITEBYTECODE": "1"}
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)


def _sample_zip(tmp_path: Path) -> Path:
    """``$SPARK_HOME/python/lib/pkg.zip`` under ``tmp_path``: a package with a module, a module that does not
    compile (left as it is: fails at import as before) and a data file."""
    archive = tmp_path / "python" / "lib" / "pkg.zip"
    archive.parent.mkdir(parents=True)
    with zipfile.ZipFile(archive, "w") as z:
        z.writestr("pkg/__init__.py", "")
        z.writestr("pkg/mod.py", "VALUE = 6 * 7\n")
        z.writestr("pkg/broken.py", "def (:\n")
        z.writestr("pkg/data.txt", "kept")
    return archive


def test_zip_modules_are_imported_from_bytecode(tmp_path: Path) -> None:
    archive = _sample_zip(tmp_path)
    before = _import(archive, "pkg.mod")
    assert before.stdout.split() == [f"{archive}/pkg/mod.py", "42"]

    from magnetar.spark.precompile import main, spark_python_zips

    assert spark_python_zips(tmp_path) == [archive]  # what a run without arguments does, for SPARK_HOME
    main([str(archive)])

    with zipfile.ZipFile(archive) as z:
        names = set(z.namelist())
        assert z.read("pkg/data.txt") == b"kept"
    assert names == {
        "pkg/__init__.py",
        "pkg/__init__.pyc",
        "pkg/mod.py",
        "pkg/mod.pyc",
        "pkg/broken.py",
        "pkg/data.txt",
    }
    after = _import(archive, "pkg.mod")
    assert after.stdout.split() == [f"{archive}/pkg/mod.pyc", "42"], after.stderr
    assert "SyntaxError" in _import(archive, "pkg.broken").stderr
    assert list(archive.parent.iterdir()) == [archive]  # no temporary files left


def test_unpack_replaces_each_zip_by_a_compiled_directory_of_the_same_name(tmp_path: Path) -> None:
    # Spark puts `.../pyspark.zip` on the path by name: a directory of that name is imported like any other
    # (no zipimport, whose caches Spark's runner invalidates, re-reading the zip's index per package).
    archive = _sample_zip(tmp_path)

    from magnetar.spark.precompile import main

    main(["--unpack", str(archive)])
    assert archive.is_dir()
    assert (archive / "pkg" / "data.txt").read_text() == "kept"
    assert sorted(p.name for p in (archive / "pkg" / "__pycache__").iterdir()) == [
        f"__init__.{sys.implementation.cache_tag}.pyc",
        f"mod.{sys.implementation.cache_tag}.pyc",
    ]
    after = _import(archive, "pkg.mod")
    assert after.stdout.split() == [f"{archive}/pkg/mod.py", "42"], after.stderr
    assert "SyntaxError" in _import(archive, "pkg.broken").stderr
    assert list(archive.parent.iterdir()) == [archive]  # no temporary files left

    main(["--unpack", str(archive)])  # a second run (an unpacked directory) changes nothing
    assert archive.is_dir() and list(archive.parent.iterdir()) == [archive]

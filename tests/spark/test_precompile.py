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


def test_zip_modules_are_imported_from_bytecode(tmp_path: Path) -> None:
    archive = tmp_path / "python" / "lib" / "pkg.zip"
    archive.parent.mkdir(parents=True)
    with zipfile.ZipFile(archive, "w") as z:
        z.writestr("pkg/__init__.py", "")
        z.writestr("pkg/mod.py", "VALUE = 6 * 7\n")
        z.writestr("pkg/broken.py", "def (:\n")  # left as it is: fails at import as before
        z.writestr("pkg/data.txt", "kept")
    before = _import(archive, "pkg.mod")
    assert before.stdout.split() == [f"{archive}/pkg/mod.py", "42"]

    from magnetar.spark.precompile import main, spark_python_zips

    assert spark_python_zips(tmp_path) == [archive]  # what a run without arguments does, for SPARK_HOME
    main([str(archive)])

    with zipfile.ZipFile(archive) as z:
        names = set(z.namelist())
        assert z.read("pkg/data.txt") == b"kept"
    assert names == {
        "pkg/__init__.py", "pkg/__init__.pyc", "pkg/mod.py", "pkg/mod.pyc", "pkg/broken.py", "pkg/data.txt"
    }
    after = _import(archive, "pkg.mod")
    assert after.stdout.split() == [f"{archive}/pkg/mod.pyc", "42"], after.stderr
    assert "SyntaxError" in _import(archive, "pkg.broken").stderr
    assert list(archive.parent.iterdir()) == [archive]  # no temporary files left

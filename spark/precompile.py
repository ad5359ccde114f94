"""Byte-compile the Python sources Spark puts on its Python processes' path (``python -m magnetar.spark.precompile``).

Spark starts its Python processes with ``$SPARK_HOME/python/lib/pyspark.zip`` and py4j's zip first on
``sys.path``. pip's pyspark ships those zips with sources only, and Python never writes bytecode caches into
a zip, so every such process compiles what it imports again: ~0.5 CPU-s for each streaming query on a
Python source (Spark starts a new planner process per query) and for each Python worker started. This adds
``.pyc`` files beside the sources in each zip (unchecked-hash pycs: zipimport uses them without comparing
times; a different Python version ignores them by their magic number and compiles the source as before).
Run once where Spark is installed (the Spark image does it at build time).
"""

from __future__ import annotations

import argparse
import os
import py_compile
import tempfile
import warnings
import zipfile
from pathlib import Path


def precompile_zip(archive: Path) -> int:
    """Rewrite ``archive`` with a ``.pyc`` beside each ``.py`` (replaced atomically); returns how many."""
    compiled = 0
    with tempfile.TemporaryDirectory(dir=archive.parent) as tmp:
        root = Path(tmp, "src")
        with zipfile.ZipFile(archive) as z:
            z.extractall(root)
        for src in sorted(root.rglob("*.py")):
            name = src.relative_to(root).as_posix()
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")  # e.g. SyntaxWarning in pyspark's own tests
                    py_compile.compile(
                        str(src),
                        cfile=f"{src}c",
                        dfile=f"{archive}/{name}",  # the path zipimport would give the source (tracebacks)
                        doraise=True,
                        invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH,
                    )
            except py_compile.PyCompileError:
                continue  # left as source: compiled (and failing) at import as before
            compiled += 1
        out = Path(tmp, archive.name)
        with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as z:
            for path in sorted(p for p in root.rglob("*") if p.is_file()):
                z.write(path, path.relative_to(root).as_posix())
        os.replace(out, archive)
    return compiled


def spark_python_zips(spark_home: Path) -> list[Path]:
    """The zips Spark puts on its Python processes' path: ``$SPARK_HOME/python/lib/*.zip``."""
    return sorted(Path(spark_home, "python", "lib").glob("*.zip"))


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("zips", nargs="*", type=Path, help="default: $SPARK_HOME/python/lib/*.zip")
    args = p.parse_args(argv)
    zips = args.zips
    if not zips:
        import pyspark

        zips = spark_python_zips(Path(os.environ.get("SPARK_HOME") or os.path.dirname(pyspark.__file__)))
    for archive in zips:
        print(f"{archive}: {precompile_zip(archive)} modules compiled")


if __name__ == "__main__":
    main()

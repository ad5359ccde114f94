"""Byte-compile the Python sources Spark puts on its Python processes' path (``python -m magnetar.spark.precompile``).

Spark starts its Python processes with ``$SPARK_HOME/python/lib/pyspark.zip`` and py4j's zip first on
``sys.path``. pip's pyspark ships those zips with sources only, and Python never writes bytecode caches into
a zip, so every such process compiles what it imports again: ~0.5 CPU-s for each streaming query on a
Python source (Spark starts a new planner process per query) and for each Python worker started. This adds
``.pyc`` files beside the sources in each zip (unchecked-hash pycs: zipimport uses them without comparing
times; a different Python version ignores them by their magic number and compiles the source as before).
Run once where Spark is installed (the Spark image does it at build time).

``--unpack`` goes further: each zip is replaced by a *directory of the same name* holding its files and their
``__pycache__``. Spark puts ``.../pyspark.zip`` on the path by name, and Python imports from a directory
whatever it is called. That saves what bytecode in a zip cannot: Spark's Python processes call
``importlib.invalidate_caches()`` after adding Spark's file directory to ``sys.path``, which makes every
zipimporter (one per package imported from the zip, ~17 by then) re-read the zip's whole index: ~0.24 CPU-s
per planner process with bytecode in the zip (~0.14 without), nothing for a directory; imports from a
directory are a little cheaper too. Only where the zips are used from ``SPARK_HOME`` in place (local runs,
standalone clusters, Kubernetes images); YARN uploads ``pyspark.zip`` as a file, so not there.
"""

from __future__ import annotations

import argparse
import compileall
import os
import py_compile
import shutil
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


def unpack_zip(archive: Path) -> int:
    """Replace ``archive`` by a directory of the same name with its files and their compiled ``__pycache__``;
    returns how many modules were compiled (0 when ``archive`` already is such a directory)."""
    if archive.is_dir():
        return 0
    staging = archive.with_name(archive.name + ".unpacking")
    shutil.rmtree(staging, ignore_errors=True)
    with zipfile.ZipFile(archive) as z:
        z.extractall(staging)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # e.g. SyntaxWarning in pyspark's own tests
        compileall.compile_dir(
            staging,
            quiet=2,
            ddir=str(archive),  # the paths the modules will have (tracebacks)
            invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH,
        )
    compiled = sum(1 for _ in staging.rglob("__pycache__/*.pyc"))
    archive.unlink()
    staging.rename(archive)
    return compiled


def spark_python_zips(spark_home: Path) -> list[Path]:
    """The zips Spark puts on its Python processes' path: ``$SPARK_HOME/python/lib/*.zip``."""
    return sorted(Path(spark_home, "python", "lib").glob("*.zip"))


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("zips", nargs="*", type=Path, help="default: $SPARK_HOME/python/lib/*.zip")
    p.add_argument("--unpack", action="store_true", help="replace each zip by a compiled directory of the same name")
    args = p.parse_args(argv)
    zips = args.zips
    if not zips:
        import pyspark

        zips = spark_python_zips(Path(os.environ.get("SPARK_HOME") or os.path.dirname(pyspark.__file__)))
    for archive in zips:
        if args.unpack:
            print(f"{archive}: unpacked, {unpack_zip(archive)} modules compiled")
        elif archive.is_dir():
            print(f"{archive}: already unpacked")
        else:
            print(f"{archive}: {precompile_zip(archive)} modules compiled")


if __name__ == "__main__":
    main()

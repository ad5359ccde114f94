"""The Dockerfile and .dockerignore, checked statically (no Docker engine runs here).

Beyond parsing, two steps of the image are exercised for real: the wheel is built from exactly
the files .dockerignore lets into the build context, and the image's default command plus its
HEALTHCHECK command are run against a local `magnetar standalone`.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
import tomllib
import urllib.parse
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.deploy import tools
from tests.ports import free_port

DOCKERFILE = tools.ROOT / "Dockerfile"
DOCKERIGNORE = tools.ROOT / ".dockerignore"


@dataclass
class Instruction:
    keyword: str
    args: str
    stage: int

    def exec_form(self) -> list[str]:
        value = json.loads(self.args)
        assert isinstance(value, list) and all(isinstance(v, str) for v in value), self
        return value


def parse_dockerfile(text: str) -> tuple[list[str], list[Instruction]]:
    """Parser directives and instructions (continuations joined, comment lines dropped)."""
    lines = text.splitlines()
    directives = []
    for line in lines:
        match = re.match(r"#\s*(\w+)\s*=\s*(.+)", line)
        if not match:
            break
        directives.append(f"{match.group(1).lower()}={match.group(2).strip()}")
    instructions: list[Instruction] = []
    stage = -1
    buffer = ""
    for line in lines:
        stripped = line.strip()
        if not buffer and (not stripped or stripped.startswith("#")):
            continue
        if buffer and stripped.startswith("#"):
            continue  # comment lines inside a continuation are ignored by Docker
        if stripped.endswith("\\"):
            buffer += stripped[:-1] + " "
            continue
        buffer += stripped
        keyword, _, args = buffer.partition(" ")
        keyword = keyword.upper()
        if keyword == "FROM":
            stage += 1
        instructions.append(Instruction(keyword, args.strip(), stage))
        buffer = ""
    assert not buffer, "dangling line continuation at the end of the Dockerfile"
    return directives, instructions


DIRECTIVES, INSTRUCTIONS = parse_dockerfile(DOCKERFILE.read_text())
FINAL_STAGE = max(i.stage for i in INSTRUCTIONS)


def final(keyword: str) -> list[Instruction]:
    return [i for i in INSTRUCTIONS if i.keyword == keyword and i.stage == FINAL_STAGE]


def build_args() -> dict[str, str]:
    found = {}
    for instr in INSTRUCTIONS:
        if instr.keyword == "ARG" and "=" in instr.args:
            name, _, value = instr.args.partition("=")
            found[name] = value
    return found


def env_defaults() -> dict[str, str]:
    found = {}
    for instr in final("ENV"):
        for token in shlex.split(instr.args):
            name, _, value = token.partition("=")
            found[name] = value
    return found


def test_multi_stage_python_311_slim() -> None:
    assert "syntax=docker/dockerfile:1" in DIRECTIVES  # RUN --mount needs the BuildKit frontend
    froms = [i.args for i in INSTRUCTIONS if i.keyword == "FROM"]
    assert len(froms) >= 2, "build and runtime stages"
    assert froms[0].endswith(" AS build")
    base = build_args()["PYTHON_IMAGE"]
    assert re.fullmatch(r"python:3\.11-slim(-\w+)?", base), base
    assert all(f.split()[0] == "${PYTHON_IMAGE}" for f in froms)
    # The runtime stage installs from the build stage's wheels, not from the source tree.
    assert not [i for i in final("COPY") + final("ADD") if not i.args.startswith("--from=")]
    (copy,) = final("COPY")
    assert copy.args.startswith("--from=build /wheels ")
    (install,) = [i for i in final("RUN") if "pip install" in i.args]
    assert "--no-index" in install.args and "rm -rf /tmp/wheels" in install.args
    assert not [i for i in INSTRUCTIONS if i.keyword == "ADD"], "ADD fetches URLs/unpacks: use COPY"


def test_runs_as_non_root() -> None:
    (user,) = final("USER")
    uid, _, gid = user.args.partition(":")
    # Numeric, so that Kubernetes' runAsNonRoot can verify it without a passwd lookup.
    assert uid.isdigit() and int(uid) != 0 and (not gid or int(gid) != 0)
    values = (tools.CHART / "values.yaml").read_text()
    assert f"runAsUser: {uid}" in values, "chart podSecurityContext should match the image's user"


def test_entrypoint_cmd_ports_volume() -> None:
    (entrypoint,) = final("ENTRYPOINT")
    assert entrypoint.exec_form() == ["magnetar"]
    pyproject = tomllib.loads((tools.ROOT / "pyproject.toml").read_text())
    assert "magnetar" in pyproject["project"]["scripts"]
    (cmd,) = final("CMD")
    assert cmd.exec_form()[0] == "standalone"
    exposed = {port for instr in final("EXPOSE") for port in instr.args.split()}
    assert {"6650", "8080"} <= exposed
    volumes = [v for instr in final("VOLUME") for v in instr.exec_form()]
    assert "/data" in volumes
    assert "--data-dir=/data" in cmd.exec_form()


def test_healthcheck_is_exec_form_with_timeouts() -> None:
    (healthcheck,) = final("HEALTHCHECK")
    options, _, command = healthcheck.args.partition("CMD ")
    for option in ("--interval=", "--timeout=", "--start-period=", "--retries="):
        assert option in options
    argv = json.loads(command)
    assert argv[:2] == ["python", "-c"]
    assert "HEALTHCHECK_URL" in argv[2]
    assert env_defaults()["HEALTHCHECK_URL"].startswith("http://127.0.0.1:8080/")


# ------------------------------------------------------------------------------ .dockerignore
def _pattern_regex(pattern: str) -> re.Pattern[str]:
    """A .dockerignore pattern (Go filepath.Match plus `**`) as a regex over slash paths."""
    pattern = pattern.strip("/")
    out = ""
    i = 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out += "(?:.*/)?"
            i += 3
        elif pattern.startswith("**", i):
            out += ".*"
            i += 2
        elif pattern[i] == "*":
            out += "[^/]*"
            i += 1
        elif pattern[i] == "?":
            out += "[^/]"
            i += 1
        else:
            out += re.escape(pattern[i])
            i += 1
    return re.compile(out + r"\Z")


def dockerignore_rules() -> list[tuple[bool, re.Pattern[str]]]:
    rules = []
    for line in DOCKERIGNORE.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        negate = line.startswith("!")
        rules.append((negate, _pattern_regex(line[1:] if negate else line)))
    return rules


def in_context(rel: str, rules: list[tuple[bool, re.Pattern[str]]]) -> bool:
    """Docker's rule: the last pattern matching the path or one of its parents decides."""
    parts = rel.split("/")
    prefixes = ["/".join(parts[: n + 1]) for n in range(len(parts))]
    included = True
    for negate, regex in rules:
        if any(regex.match(p) for p in prefixes):
            included = negate
    return included


def build_context_files() -> list[str]:
    rules = dockerignore_rules()
    files = []
    for path in tools.ROOT.rglob("*"):
        if path.is_file() and ".git" not in path.relative_to(tools.ROOT).parts[:1]:
            rel = path.relative_to(tools.ROOT).as_posix()
            if in_context(rel, rules):
                files.append(rel)
    return sorted(files)


def package_dirs() -> dict[str, str]:
    pyproject = tomllib.loads((tools.ROOT / "pyproject.toml").read_text())
    return pyproject["tool"]["setuptools"]["package-dir"]


def test_dockerignore_semantics() -> None:
    rules = [(False, _pattern_regex("*")), (True, _pattern_regex("cli/")), (False, _pattern_regex("**/*.pyc"))]
    assert in_context("cli/main.py", rules)
    assert not in_context("cli/__pycache__/main.cpython-311.pyc", rules)
    assert not in_context("tests/conftest.py", rules)
    assert not in_context("Dockerfile", rules)


def test_build_context_has_every_package_and_nothing_else() -> None:
    files = build_context_files()
    top = {f.split("/")[0] for f in files}
    for package, directory in package_dirs().items():
        top_dir = directory.split("/")[0]
        assert top_dir in top, f"{package} ({directory}/) is excluded by .dockerignore"
    assert "pyproject.toml" in files and "README.md" in files  # README: the project's readme
    for unwanted in ("tests", "docs", "charts", "manifests", "benchmarks", ".ci", "data", "crds"):
        assert unwanted not in top, f"{unwanted}/ should stay out of the build context"
    assert not [f for f in files if "__pycache__" in f or f.endswith(".pyc") or ".egg-info" in f]


def test_every_subpackage_is_listed_in_pyproject() -> None:
    """setuptools' explicit package list must name every sub-package, or wheels (and the image) lack it
    while editable installs still work (magnetar.broker.policies was missing once)."""
    setup = tomllib.loads((tools.ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(setup["packages"])
    missing = []
    for package, directory in setup["package-dir"].items():
        for init in (tools.ROOT / directory).rglob("__init__.py"):
            rel = init.parent.relative_to(tools.ROOT / directory)
            name = ".".join([package, *rel.parts])
            if name not in listed and "__pycache__" not in rel.parts:
                missing.append(name)
    assert not missing, f"add to [tool.setuptools] packages and package-dir: {sorted(set(missing))}"


def test_wheel_builds_from_the_build_context(tmp_path: Path) -> None:
    """What the build stage's `pip wheel` sees: only the context files. Build the project's own
    wheel from them (dependencies are not downloaded here) and check every package is inside."""
    context = tmp_path / "context"
    for rel in build_context_files():
        target = context / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(tools.ROOT / rel, target)
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path / "w"),
            ".",
        ],
        cwd=context,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    (wheel,) = (tmp_path / "w").glob("magnetar-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    for package in package_dirs():
        # Every package ships its modules (magnetar.operator has no __init__.py on purpose: a top-level
        # operator/ package would shadow the standard library's operator module).
        prefix = package.replace(".", "/") + "/"
        assert any(n.startswith(prefix) and n.endswith(".py") for n in names), f"{prefix} missing from the wheel"
    assert any(n.startswith("magnetar/broker/protocol/") and n.endswith(".proto") for n in names)

    # The image must be able to run every role, the operator included: the distributions its
    # code imports must be requirements of what the Dockerfile installs (base or its extras).
    (metadata,) = [n for n in names if n.endswith(".dist-info/METADATA")]
    requires = [
        line.split(":", 1)[1].strip()
        for line in zipfile.ZipFile(wheel).read(metadata).decode().splitlines()
        if line.startswith("Requires-Dist:")
    ]
    installed_extras = set(image_extras())
    provided: set[str] = set()
    extras: set[str] = set()
    for requirement in requires:
        name = re.match(r"[A-Za-z0-9_.-]+", requirement).group(0).lower()
        marker = re.search(r"extra\s*==\s*['\"]([^'\"]+)['\"]", requirement)
        if marker:
            extras.add(marker.group(1))
        if not marker or marker.group(1) in installed_extras:
            provided.add(name)
    assert installed_extras <= extras, f"the Dockerfile installs unknown extras {installed_extras - extras}"
    assert "kopf" in provided, "`magnetar operator` needs kopf, which the image would not install"


def image_extras() -> list[str]:
    """The extras of the runtime stage's `pip install "magnetar[a,b]"` (empty for plain "magnetar")."""
    (install,) = [i for i in final("RUN") if "pip install" in i.args]
    match = re.search(r"magnetar\[([^\]]*)\]", install.args)
    return [e.strip() for e in match.group(1).split(",")] if match else []


# ------------------------------------------------------------------------------ default command + HEALTHCHECK
def run_healthcheck(url: str) -> int:
    (healthcheck,) = final("HEALTHCHECK")
    argv = json.loads(healthcheck.args.partition("CMD ")[2])
    env = dict(os.environ, HEALTHCHECK_URL=url)
    return subprocess.run([sys.executable, *argv[1:]], env=env, capture_output=True, timeout=30).returncode


def test_default_command_passes_its_healthcheck(tmp_path: Path) -> None:
    """`docker run IMAGE` = ENTRYPOINT + CMD with /data as the volume; its HEALTHCHECK must pass
    once it is up, and fail when it is down. Ports move to free ones through MAGNETAR_* settings
    (the CMD does not set ports), and the health URL keeps the Dockerfile's path."""
    (cmd,) = final("CMD")
    argv = [a.replace("/data", str(tmp_path / "data")) for a in cmd.exec_form()]
    http_port = free_port()
    env = dict(
        os.environ,
        MAGNETAR_brokerServicePort=str(free_port()),
        MAGNETAR_webServicePort=str(http_port),
        MAGNETAR_bindAddress="127.0.0.1",
    )
    default_url = urllib.parse.urlsplit(env_defaults()["HEALTHCHECK_URL"])
    url = default_url._replace(netloc=f"127.0.0.1:{http_port}").geturl()
    log = tmp_path / "standalone.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "magnetar.cli.main", *argv], stdout=out, stderr=subprocess.STDOUT, env=env
        )
    try:
        deadline = time.monotonic() + 30
        while run_healthcheck(url) != 0:
            assert proc.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, "HEALTHCHECK never passed:\n" + log.read_text()[-3000:]
            time.sleep(0.2)
        assert (tmp_path / "data").is_dir(), "the CMD's --data-dir (the volume) is where data goes"
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
    assert run_healthcheck(url) != 0


@pytest.mark.parametrize("status", [200, 500])
def test_healthcheck_exit_status_follows_http_status(tmp_path: Path, status: int) -> None:
    # A tiny server answering `status` to everything: the operator's kopf liveness endpoint and
    # any other URL set through HEALTHCHECK_URL are judged the same way.
    port = free_port()
    script = (
        "import http.server\n"
        "class H(http.server.BaseHTTPRequestHandler):\n"
        f"    def do_GET(self): self.send_response({status}); self.end_headers()\n"
        "    def log_message(self, *a): pass\n"
        f"http.server.HTTPServer(('127.0.0.1', {port}), H).serve_forever()\n"
    )
    server = subprocess.Popen([sys.executable, "-c", script])
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < deadline
                time.sleep(0.05)
        code = run_healthcheck(f"http://127.0.0.1:{port}/healthz")
    finally:
        server.terminate()
        server.wait(10)
    assert (code == 0) == (status == 200)

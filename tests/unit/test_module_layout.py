"""The shape of the package: no import circle, a short top level, small modules, one place
that tells the two products apart, and no runtime module importing the dev/ folder."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import retrylib

PACKAGE = Path(retrylib.__file__).parent
MODULES = sorted(PACKAGE.rglob("*.py"))


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


NAMES = {module_name(path): path for path in MODULES}


def imported_modules(path: Path) -> set[str]:
    """The retrylib modules `path` imports anywhere in it (at the top, in a function, or
    for type checking only): `from a.b import c` counts as a.b.c when c is a module."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                submodule = f"{node.module}.{alias.name}"
                found.add(submodule if submodule in NAMES else node.module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return {name for name in found if name in NAMES}


def test_no_module_imports_itself_through_others():
    graph = {name: imported_modules(path) - {name} for name, path in NAMES.items()}
    circles = []
    for start in graph:
        # Every module `start` reaches; a circle is `start` reaching itself.
        seen, frontier = set(), list(graph[start])
        while frontier:
            name = frontier.pop()
            if name not in seen:
                seen.add(name)
                frontier.extend(graph[name])
        if start in seen:
            circles.append(start)
    assert circles == []


def test_the_top_level_holds_at_most_six_modules_beside_its_packages():
    top = sorted(path.name for path in PACKAGE.glob("*.py"))
    assert len(top) <= 6, top


def test_no_module_is_over_500_lines():
    long = {
        module_name(path): lines
        for path in MODULES
        if (lines := len(path.read_text(encoding="utf-8").splitlines())) > 500
    }
    assert long == {}


def test_only_the_job_kind_builder_tells_a_router_config_from_a_handler_job():
    asking = [
        f"{module_name(path)}:{number}"
        for path in MODULES
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if re.search(r"isinstance\(.*Router\w*Config", line)
    ]
    assert len({place.split(":")[0] for place in asking}) <= 1, asking


def test_only_the_demo_and_a_laptop_session_reach_into_the_dev_folder():
    """spark-submit.sh leaves retrylib/dev/ out of what it ships: the CLI's `demo` and a
    session on a Spark installed from PyPI (which needs the jar resolver) reach into it, and
    neither runs on a cluster."""
    importing = sorted(
        name
        for name, path in NAMES.items()
        if not name.startswith("retrylib.dev")
        and any(imported.startswith("retrylib.dev") for imported in imported_modules(path))
    )
    assert importing == ["retrylib.ops.cli", "retrylib.spark.session"]

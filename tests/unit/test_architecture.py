"""Which way the imports run: the controller stands on its own (it imports neither the emulation nor the simulator),
its core does not depend on the worker's package, the simulator imports neither the scripts nor the evidence, and no
project module imports itself back through others (no cycle), counting imports inside functions and type-only ones
too; and no module of the simulator names a file under results/ (the records are the evidence's: evidence/)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("controller", "emulation", "simulator", "containers", "profiles", "scripts", "evidence")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {
    _module_name(p): p for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py")) if "__pycache__" not in p.parts
}


def _resolve(name: str) -> str | None:
    """The project module `name` refers to (a module, or the package holding a name imported from it)."""
    while name:
        if name in MODULES:
            return name
        name = name.rpartition(".")[0]
    return None


def imports_of(module: str) -> set[str]:
    """Project modules `module` imports, anywhere in it (TYPE_CHECKING blocks too: a type-only import is a dependency
    a reader follows, and a loop through one is a loop)."""
    tree = ast.parse(MODULES[module].read_text())
    package = module if MODULES[module].name == "__init__.py" else module.rpartition(".")[0]
    out: set[str] = set()

    def visit(node):
        if isinstance(node, ast.Import):
            out.update(filter(None, (_resolve(a.name) for a in node.names)))
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
            for a in node.names:
                target = _resolve(f"{base}.{a.name}") if f"{base}.{a.name}" in MODULES else _resolve(base)
                if target:
                    out.add(target)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    out.discard(module)
    return out


def packages_of(module: str) -> set[str]:
    """The packages whose __init__ runs when `module` is imported (controller.drivers for controller.drivers.x)."""
    parts = module.split(".")
    return {p for p in (".".join(parts[:i]) for i in range(1, len(parts))) if p in MODULES}


# What importing each module runs of the project: what it imports, and the __init__ of every package above each.
GRAPH = {m: (ts := imports_of(m)) | set().union(*(packages_of(t) for t in ts | {m})) - {m} for m in MODULES}


def _under(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


@pytest.mark.parametrize(
    ("importer", "imported"),
    [
        ("controller", "emulation"),
        ("controller", "simulator"),
        ("controller", "scripts"),
        ("controller.core", "containers"),
        ("controller.core", "controller.apps"),
        ("controller.core", "controller.drivers"),
        ("controller.core", "controller.jobs"),
        ("controller.jobs", "controller.apps"),
        ("controller.jobs", "controller.devices"),
        ("controller.jobs", "controller.drivers"),  # the drivers implement the job service's ports, not the reverse
        ("controller.devices", "controller.apps"),
        ("controller.devices", "controller.jobs"),
        ("controller.state", "controller.apps"),
        ("controller.metrics", "controller.apps"),
        ("simulator", "scripts"),
        ("simulator", "evidence"),
        ("controller", "evidence"),
        ("profiles", "controller"),
        ("profiles", "containers"),
    ],
)
def test_no_import_runs_the_wrong_way(importer, imported):
    wrong = sorted(
        f"{m} -> {t}" for m, ts in GRAPH.items() if _under(m, importer) for t in ts if _under(t, imported)
        if (m, t) not in ALLOWED
    )
    assert not wrong, "\n".join(wrong)


# The rack file's schema asks the OCS drivers' registry which drivers there are and how each checks its entry: the
# registry is a leaf (it imports nothing of the project; it finds a driver's module by name when asked).
ALLOWED = {("controller.core.rackspec", "controller.drivers.registry"),
           ("controller.core.rackspec", "controller.drivers")}


def test_the_drivers_registry_imports_nothing_of_the_project():
    assert GRAPH["controller.drivers.registry"] <= {"controller", "controller.drivers"}


def test_no_import_cycle():
    """Tarjan's strongly connected components over the project's modules: every one of size 1."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    cycles: list[list[str]] = []
    counter = [0]

    def strong(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in GRAPH[v]:
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.append(sorted(comp))

    for v in sorted(GRAPH):
        if v not in index:
            strong(v)
    assert not cycles, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in cycles)


def test_the_graph_sees_imports_inside_functions_and_from_packages():
    """The checks above can fail: the collector finds what they look for."""
    assert "controller.core.rack" in GRAPH["controller.core.circuits"]
    assert "controller.apps.jobs_api" in GRAPH["controller.apps.rest"]
    assert "profiles" in GRAPH["containers.worker"]
    assert "simulator.inputs.cases" in GRAPH["evidence.demo.experiment"]


def test_the_job_service_imports_neither_ryu_nor_eventlet():
    """controller/jobs and what it imports of the project: no Ryu, no eventlet, however deep."""
    seen, todo, outside = set(), [m for m in MODULES if _under(m, "controller.jobs")], []
    assert todo
    while todo:
        m = todo.pop()
        if m in seen:
            continue
        seen.add(m)
        tree = ast.parse(MODULES[m].read_text())
        names = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
        names += [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and not n.level]
        outside += [f"{m} imports {x}" for x in names if x.split(".")[0] in ("ryu", "eventlet")]
        todo += GRAPH[m]
    assert not outside, "\n".join(outside)


def test_the_graph_follows_package_inits():
    """Importing controller.drivers.containers runs controller/drivers/__init__.py: the graph has that edge."""
    assert packages_of("controller.drivers.containers") == {"controller", "controller.drivers"}
    assert "controller.drivers" in GRAPH["controller.apps.context"]


def test_importing_the_job_service_loads_neither_ryu_nor_eventlet():
    """In a fresh interpreter, whatever the package __init__ files and third-party modules import."""
    code = (
        "import controller.jobs, controller.jobs.service, sys; "
        "print(sorted({'ryu', 'eventlet'} & set(m.split('.')[0] for m in sys.modules)))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


def test_the_job_service_finds_nothing_through_a_context():
    """Its collaborators come in its constructors: no `ctx.` in controller/jobs."""
    uses = {
        m: lines
        for m, p in MODULES.items()
        if _under(m, "controller.jobs") and (lines := _attribute_uses(ast.parse(p.read_text()), "ctx"))
    }
    uses.update({m: "self.ctx" for m, p in MODULES.items() if _under(m, "controller.jobs") and "ctx" in p.read_text()})
    assert not uses, uses


def test_modules_stay_readable():
    """No module of the controller over 400 lines; the placement app is wiring (at most 120)."""
    lines = {m: len(p.read_text().splitlines()) for m, p in MODULES.items() if _under(m, "controller")}
    long = {m: n for m, n in lines.items() if n > 400}
    assert not long, long
    assert len(MODULES["controller.apps.placement"].read_text().splitlines()) <= 120


def _attribute_uses(tree: ast.AST, base: str) -> list[int]:
    return [
        n.lineno
        for n in ast.walk(tree)
        if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == base
    ]


def test_only_the_runtime_module_calls_the_hub():
    """Every thread, sleep, lock and event of the controller comes from its runtime (`ctx.rt`): `hub.` is written in
    controller/apps/runtime.py alone, so a test can hand in a runtime whose clock it drives."""
    uses = {
        m: lines
        for m, p in MODULES.items()
        if _under(m, "controller") and (lines := _attribute_uses(ast.parse(p.read_text()), "hub"))
    }
    assert set(uses) == {"controller.apps.runtime"}, uses


def test_job_states_change_only_through_the_table():
    """No `<job>.state = ...` outside the state table's `transition` (controller/core/jobs.py). A part's constructor
    keeping the rack state it was handed (`self.state = state` in an `__init__`) is not a job's state."""
    found = []
    for m, p in MODULES.items():
        if not _under(m, "controller"):
            continue
        tree = ast.parse(p.read_text())
        kept = {
            id(x)
            for f in ast.walk(tree)
            if isinstance(f, ast.FunctionDef) and f.name == "__init__" and m != "controller.core.jobs"
            for x in ast.walk(f)
            if isinstance(x, ast.Attribute) and isinstance(x.value, ast.Name) and x.value.id == "self"
        }
        for n in ast.walk(tree):
            targets = n.targets if isinstance(n, ast.Assign) else [n.target] if isinstance(n, ast.AugAssign) else []
            for t in targets:
                for x in ast.walk(t):
                    if (
                        isinstance(x, ast.Attribute)
                        and x.attr == "state"
                        and isinstance(x.ctx, ast.Store)
                        and id(x) not in kept
                    ):
                        found.append(f"{m}:{n.lineno}")
    assert found == [f"controller.core.jobs:{_line_of('controller.core.jobs', 'job.state = to')}"], found


def _line_of(module: str, text: str) -> int:
    return next(i for i, line in enumerate(MODULES[module].read_text().splitlines(), 1) if line.strip() == text)


def test_the_simulator_names_no_file_under_results():
    """The model, its inputs and studies and its CLI name no record: which records check it, and where they are, is
    the evidence package's (evidence/records.py); a constant's provenance is told there."""
    named = [f"{p.relative_to(ROOT)}:{i}" for p in sorted((ROOT / "simulator").rglob("*.py"))
             for i, line in enumerate(p.read_text().splitlines(), 1) if "results/" in line]
    assert not named, named


def _errors_reexported(module: str) -> list[str]:
    """Exception names `module` imports only to hand on (an import marked unused: `# noqa: F401`)."""
    path = MODULES[module]
    lines = path.read_text().splitlines()
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and "noqa: F401" in lines[node.end_lineno - 1]:
            out += [f"{module}: {a.name}" for a in node.names
                    if a.name.endswith(("Error", "Failed", "Conflict", "Unavailable")) or a.name == "Busy"]
    return out


def test_each_error_has_one_home():
    """An exception class is defined once and imported from where it is defined, not handed on by another module
    (controller/drivers keeps its own for now: the southbound work homes them)."""
    defined: dict[str, list[str]] = {}
    for m, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and any(
                    ast.unparse(b).endswith(("Error", "Exception", "Conflict")) for b in node.bases):
                defined.setdefault(node.name, []).append(m)
    twice = {name: where for name, where in defined.items() if len(where) > 1}
    assert not twice, twice
    handed_on = [r for m in MODULES if not _under(m, "controller.drivers") for r in _errors_reexported(m)]
    assert not handed_on, handed_on


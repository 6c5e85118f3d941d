"""The tune_as package has no import cycles, and each module imports on its own in a fresh interpreter.

The walk is static (ast) and counts every `import` statement of a module, wherever it is: one inside a
function or under `if TYPE_CHECKING:` hides a cycle from the interpreter at import time, but the two
modules still cannot be understood, tested or split apart one without the other.
"""

from __future__ import annotations

import ast
import pkgutil
import re
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "tune_as"


def module_name(path: Path, root: Path = PACKAGE) -> str:
    parts = path.relative_to(root.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules(root: Path = PACKAGE) -> dict[str, Path]:
    return {module_name(p, root): p for p in sorted(root.rglob("*.py"))}


def _statements(path: Path, name: str) -> list[tuple[str, list[str]]]:
    """(absolute module, names imported from it) for every import statement of a file, wherever it stands
    (relative imports resolved against the file's package); `import a.b` gives ("a.b", [])."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: list[tuple[str, list[str]]] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(alias.name, []) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            out.append((base, [alias.name for alias in node.names]))
    return out


def imported(name: str, path: Path, known: set[str]) -> set[str]:
    """The modules of `known` that `name` (at `path`) imports. `from pkg import sub` imports the submodule
    `pkg.sub` when it exists, else only `pkg` (the name is an attribute of its __init__)."""
    out: set[str] = set()
    for base, names in _statements(path, name):
        out.update({f"{base}.{n}" if f"{base}.{n}" in known else base for n in names} if names else {base})
    return {m for m in out if m in known and m != name}


def import_graph(root: Path = PACKAGE) -> dict[str, set[str]]:
    found = modules(root)
    return {name: imported(name, path, set(found)) for name, path in found.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle as [a, b, ..., a], or None (depth-first search with an explicit path)."""
    done: set[str] = set()

    def visit(node: str, path: list[str]) -> list[str] | None:
        if node in path:
            return path[path.index(node):] + [node]
        if node in done:
            return None
        for nxt in sorted(graph[node]):
            cycle = visit(nxt, [*path, node])
            if cycle:
                return cycle
        done.add(node)
        return None

    return next((c for c in (visit(n, []) for n in sorted(graph)) if c), None)


def test_the_walk_sees_relative_function_level_and_type_checking_imports(tmp_path: Path) -> None:
    """The checker itself: a cycle through each kind of import statement is found, a DAG passes."""
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("from .a import f\n")
    (pkg / "a.py").write_text("from . import b\n\ndef f():\n    return b\n")
    (pkg / "b.py").write_text("def g():\n    from .sub import c\n")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "c.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                      "    from ..a import f\n")
    graph = import_graph(pkg)
    assert graph == {"pkg": {"pkg.a"}, "pkg.a": {"pkg.b"}, "pkg.b": {"pkg.sub.c"}, "pkg.sub": set(),
                     "pkg.sub.c": {"pkg.a"}}
    assert find_cycle(graph) == ["pkg.a", "pkg.b", "pkg.sub.c", "pkg.a"]
    (pkg / "sub" / "c.py").write_text("import pkg.sub\n")
    assert find_cycle(import_graph(pkg)) is None


def test_tune_as_has_no_import_cycle() -> None:
    graph = import_graph()
    assert "tune_as.tasks.base" in graph and "tune_as.tasks.metrics" in graph["tune_as.tasks.base"]
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def external_imports(path: Path, name: str) -> set[str]:
    """Every absolute module a file imports, third-party too (and `base.name` for each `from base import
    name`)."""
    return {m for base, names in _statements(path, name) for m in (base, *(f"{base}.{n}" for n in names))}


def _under(module: str, *roots: str) -> bool:
    return any(module == r or module.startswith(r + ".") for r in roots)


# (importer, what it must not import, why): docs/architecture.md's layering, checked on every import
# statement.
LAYERS = [
    ("tune_as.losses", ("ray", "mlflow", "optuna", "tune_as.engine", "tune_as.tasks", "tune_as.training",
                        "tune_as.tracking", "tune_as.results", "tune_as.report", "tune_as.space"),
     "losses are pure torch"),
    ("tune_as.results", ("ray", "mlflow", "torch", "tune_as.engine", "tune_as.tracking", "tune_as.report",
                         "tune_as.training"), "results are pure: runs in, answer out"),
    ("tune_as.engine", ("tune_as.report", "mlflow"),
     "the engine never reaches into the report (MLflow: through tracking)"),
    ("tune_as.training", ("ray", "mlflow", "tune_as.engine", "tune_as.report"),
     "the loop knows no Ray nor MLflow"),
    ("tune_as.tasks", ("ray", "mlflow", "tune_as.engine", "tune_as.report", "tune_as.training"),
     "tasks are data"),
    ("tune_as.space", ("ray", "mlflow", "tune_as.engine", "tune_as.report"), "spaces are data"),
    # settings -> losses is the one edge up: a loss's registry types the parameters MLflow logged
    # (from_params)
    ("tune_as.settings", ("ray", "mlflow", "optuna", "tune_as.engine", "tune_as.report", "tune_as.space",
                          "tune_as.tasks", "tune_as.training", "tune_as.tracking", "tune_as.results"),
     "settings are the bottom layer (but for the loss registry)"),
    ("tune_as.tracking", ("ray", "torch", "optuna", "tune_as.engine", "tune_as.report", "tune_as.training",
                          "tune_as.tasks", "tune_as.losses", "tune_as.results", "tune_as.space"),
     "tracking is MLflow and the run schema only"),
    ("tune_as.report", ("ray", "tune_as.training", "tune_as.tasks"),
     "the report reads MLflow and draws; it starts Ray only through the engine's confirm_settings"),
    ("tune_as.errors", ("tune_as", "ray", "mlflow", "torch", "optuna"), "errors import nothing of ours"),
    ("tune_as.paths", ("tune_as.engine", "tune_as.report", "tune_as.training", "ray", "mlflow", "torch"),
     "paths check places, before anything heavy is imported"),
]
# Third-party modules a loss may import: torch, and the entmax package (torch too) for sparsemax and entmax15.
LOSS_LIBRARIES = ("torch", "entmax")
# The report reaches the engine only through these public modules (the request it fills, confirm_settings, and
# cluster.loopback_ray, called before Ray is imported).
REPORT_MAY_USE = {"tune_as.engine.request", "tune_as.engine.confirm", "tune_as.engine.cluster"}


@pytest.mark.parametrize(("layer", "forbidden", "why"), LAYERS, ids=[x[0] for x in LAYERS])
def test_layering(layer: str, forbidden: tuple[str, ...], why: str) -> None:
    bad = {f"{name} imports {imp}" for name, path in modules().items() if _under(name, layer)
           for imp in external_imports(path, name) if _under(imp, *forbidden)}
    assert not bad, f"{why}: {sorted(bad)}"


def test_losses_import_torch_and_entmax_only() -> None:
    third_party = {imp.split(".")[0] for name, path in modules().items() if _under(name, "tune_as.losses")
                   for imp in external_imports(path, name) if not _under(imp, "tune_as", "__future__")}
    stdlib = set(sys.stdlib_module_names)
    assert third_party - stdlib <= set(LOSS_LIBRARIES), sorted(third_party - stdlib)
    assert "torch" in third_party


def test_the_report_reaches_the_engine_only_through_its_public_modules() -> None:
    used = {imp for name, path in modules().items() if _under(name, "tune_as.report")
            for imp in external_imports(path, name) if _under(imp, "tune_as.engine")}
    assert used and {u.rsplit(".", 1)[0] if u not in modules() else u for u in used} <= REPORT_MAY_USE, used


def test_the_top_level_is_two_clis_and_few_modules() -> None:
    top = sorted(p.stem for p in PACKAGE.glob("*.py") if p.stem not in ("__init__", "__main__"))
    assert "search" in top and (PACKAGE / "report" / "cli.py").is_file()
    assert len(top) - 1 <= 6, top
    too_long = {str(p.relative_to(PACKAGE)): n for p in PACKAGE.rglob("*.py")
                if (n := len(p.read_text().splitlines())) > 400}
    assert not too_long, too_long


FRESH_IMPORTS = """
import importlib, sys, traceback
failures = []
for name in sys.argv[1:]:
    for loaded in [m for m in sys.modules if m == "tune_as" or m.startswith("tune_as.")]:
        del sys.modules[loaded]  # third-party modules stay loaded: only tune_as's own import order is tested
    try:
        importlib.import_module(name)
    except Exception:
        failures.append(name + ": " + traceback.format_exc(limit=-3))
print("\\n".join(failures))
sys.exit(1 if failures else 0)
"""


@pytest.mark.slow
def test_each_module_imports_first_in_a_fresh_tune_as() -> None:
    """Import order inside one test process hides a module that only works after another was imported.
    `__main__` is left out: importing it runs the CLI, by design."""
    names = sorted(n for n in modules() if not n.endswith("__main__"))
    proc = subprocess.run([sys.executable, "-c", FRESH_IMPORTS, *names], capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]


def fresh_python(code: str) -> str:
    """What `code` prints in a fresh interpreter (what a new Ray worker or CLI process imports); it must
    succeed."""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout


# What a Ray worker must not import: it pays each import at the start of every Tuner's first trial (MLflow and
# the driver's plan were ~2 s of it on a 2-core machine). The driver's side of a trial is engine.callbacks.
NOT_IN_A_WORKER = ("mlflow", "optuna", "transformers", "tune_as.engine.plan", "tune_as.engine.run",
                   "tune_as.engine.session", "tune_as.engine.confirm",
                   "tune_as.engine.callbacks", "tune_as.tracking.tracker", "tune_as.report")


def test_a_worker_imports_what_training_needs_and_no_driver_library() -> None:
    from tune_as.engine import session, worker

    assert session.trainable_for.__module__ == "tune_as.engine.session"
    assert worker.trainable.__module__ == worker.__name__
    code = ("import sys, tune_as.engine.worker; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] "
            f"in {{'mlflow', 'optuna', 'transformers'}} or m in {NOT_IN_A_WORKER!r}))")
    out = fresh_python(code)
    assert out.strip() == "[]", f"a worker imports driver-side modules: {out.strip()}"
    assert "torch" in sys.modules  # this process imported it through worker: the check above is not vacuous


def test_a_driver_imports_scipy_stats_only_when_the_race_looks() -> None:
    """scipy.stats costs ~1.4 CPU s to import, which a search's driver spent before its first trial (beside
    the local Ray head's start, on the same cores); only the race's looks and the verdicts use it."""
    code = ("import sys, tune_as.search, tune_as.engine.run\n"
            "before = 'scipy.stats' in sys.modules\n"
            "from tune_as.results import racing\n"
            "plan = racing.Plan(('softmax', 'am_softmax'), 'softmax', tuple(range(100, 110)))\n"
            "seeds = racing.seeds_to_decide(plan, 2.0, 1.0)\n"
            "print(before, 'scipy.stats' in sys.modules, seeds)")
    out = fresh_python(code)
    before, after, seeds = out.split()
    assert before == "False", "importing the search's driver imports scipy.stats"
    assert after == "True" and seeds.isdigit(), out  # the race still finds it: the check is not vacuous


def test_a_trial_trains_without_importing_torch_dynamo() -> None:
    """Every torch.optim optimizer imports torch._dynamo (1.5-1.7 CPU s) when built and at its first step; a
    fresh Ray worker pays it for nothing unless the trial's optimizer avoids torch.optim
    (training/tools.FusedAdamW)."""
    code = ("import sys, torch, tune_as.engine.worker\n"
            "from tune_as.training.trial import run_trial\n"
            "from tune_as.tasks import DataSettings, build_task, prepare\n"
            "import tempfile\n"
            "task = build_task('digits')\n"
            "data = prepare(task, DataSettings(task='digits', backbone='cnn', "
            "cache_dir=tempfile.mkdtemp()))\n"
            "class Keep:\n"
            "    reports = []\n"
            "    def wants_checkpoint(self, final): return False\n"
            "    def report(self, metrics, folder): self.reports.append(metrics)\n"
            "keep = Keep()\n"
            "run_trial({'loss': 'softmax', 'epochs': 1.0, 'batch_size': 64, 'lr': 3e-3}, data, task, keep)\n"
            "assert keep.reports[-1]['optimizer_steps'] > 0, keep.reports\n"
            "print('torch._dynamo' in sys.modules)")
    out = fresh_python(code)
    assert out.strip() == "False", "a trial's worker imports torch._dynamo"


def test_no_private_module_of_a_library_is_imported() -> None:
    """Issue 30 §3: public APIs only. A module of a library whose dotted name has a private part
    (`ray._private`, `ray._raylet`, `optuna._imports`) may change in any minor release; none is imported, nor
    named anywhere in the package's text (the issue's own check: `grep -rn _private tune_as` is empty)."""
    bad = {f"{name} imports {imp}" for name, path in modules().items()
           for imp in external_imports(path, name) if not _under(imp, "tune_as", "__future__")
           and any(part.startswith("_") for part in imp.split("."))}
    named = [str(path) for path in modules().values() if "_private" in path.read_text()]
    assert not bad and not named, (sorted(bad), named)


def test_the_engine_package_lists_every_module_it_has() -> None:
    """engine/__init__.py's map names each module once, and no module that is gone."""
    import tune_as.engine as engine

    listed = re.findall(r"^- (\w+):", engine.__doc__ or "", flags=re.MULTILINE)
    present = sorted(m.name for m in pkgutil.iter_modules(engine.__path__))
    assert len(listed) == len(set(listed)) and sorted(listed) == present, (listed, present)

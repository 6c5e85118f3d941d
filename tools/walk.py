"""The file-by-file walk a reader takes through a function: how often it returns to a file already left.

    python tools/walk.py tune_as.engine.run:run_search [--depth N] [--show]

Depth first from the function, in the order its calls appear, each tune_as function read once: a call is
followed when it names a tune_as function (imported by name, through an imported tune_as module, or in the
same module). Methods on objects are not followed (a static walk cannot know the type). A "stop" is a
function read; a "return" is a stop in a file the walk had entered before and then left.
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
from pathlib import Path


def _source(module: str) -> Path | None:
    spec = importlib.util.find_spec(module)
    return Path(spec.origin) if spec and spec.origin and spec.origin.endswith(".py") else None


class Module:
    def __init__(self, name: str) -> None:
        self.name, self.path = name, _source(name)
        tree = ast.parse(self.path.read_text()) if self.path else ast.Module(body=[], type_ignores=[])
        self.functions = {n.name: n for n in tree.body
                          if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
        self.names: dict[str, tuple[str, str | None]] = {}  # local name -> (module, function or None)
        for node in tree.body:
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("tune_as"):
                for alias in node.names:
                    sub = f"{node.module}.{alias.name}"
                    is_module = importlib.util.find_spec(sub) is not None if _package(node.module) else False
                    self.names[alias.asname or alias.name] = ((sub, None) if is_module
                                                              else (node.module, alias.name))
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.startswith("tune_as"):
                        self.names[alias.asname or alias.name] = (alias.name, None)


def _package(module: str) -> bool:
    spec = importlib.util.find_spec(module)
    return bool(spec and spec.submodule_search_locations)


def walk(start: str, depth: int) -> list[tuple[str, str]]:
    modules: dict[str, Module] = {}
    seen: set[tuple[str, str]] = set()
    stops: list[tuple[str, str]] = []

    def module(name: str) -> Module:
        return modules.setdefault(name, Module(name))

    def visit(mod: str, fn: str, level: int) -> None:
        m = module(mod)
        if (mod, fn) in seen or fn not in m.functions or level > depth:
            return
        seen.add((mod, fn))
        stops.append((mod, fn))
        calls = [n for n in ast.walk(m.functions[fn]) if isinstance(n, ast.Call)]
        for call in sorted(calls, key=lambda c: (c.lineno, c.col_offset)):
            target = call.func
            if isinstance(target, ast.Name):
                if target.id in m.functions:
                    visit(mod, target.id, level + 1)
                elif target.id in m.names and m.names[target.id][1]:
                    visit(m.names[target.id][0], str(m.names[target.id][1]), level + 1)
            elif isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name):
                imported = m.names.get(target.value.id)
                if imported and imported[1] is None:
                    visit(imported[0], target.attr, level + 1)

    mod, fn = start.split(":")
    visit(mod, fn, 0)
    return stops


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("start", help="module:function, e.g. tune_as.engine.run:run_search")
    p.add_argument("--depth", type=int, default=99)
    p.add_argument("--show", action="store_true", help="print every stop")
    a = p.parse_args()
    stops = walk(a.start, a.depth)
    files, left, returns, current = set(), set(), 0, None
    for mod, fn in stops:
        if mod != current:
            if mod in left:
                returns += 1
            if current is not None:
                left.add(current)
            files.add(mod)
            current = mod
        if a.show:
            print(f"{'↩ ' if mod in left else '  '}{mod}:{fn}")
    print(f"{a.start}: {len(stops)} stops in {len(files)} files, {returns} returns to a file already left")


if __name__ == "__main__":
    main()

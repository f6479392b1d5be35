"""The package's layers, read from its modules' own imports with ast (docs/design.md draws them).

Each module imports only its own layer and those below it; no import circle; imports of the package at module
level only (the CLI aside); no private name of another module; no function over 80 lines outside the generated-
math builders and the renderer. Each rule fails on a violation added to any module (the last test builds some)."""
import ast
import pathlib

import pytest

import autogen

# lowest first; a module not listed fails test_every_module_has_a_layer
LAYERS = {
    "core": ["templates", "errors", "version", "isa", "policies", "config", "ir", "primitives", "grad", "graphs",
             "decompositions"],
    "backend": ["mathlib", "specfun", "schedule", "codegen", "compiler"],
    "runtime": ["pool", "launch", "plans", "executor", "opcall", "dispatch", "kernels", "kernels.elementwise", "kernels.losses", "kernels.nonlinear",
                "kernels.linear", "kernels.scans"],
    "front": ["checks", "inline", "activations", "functional", "linear_loss", "nn"],
    "tracing": ["tracing", "chunked", "partition"],
    "integration": ["ops", "inductor_pass", "explain"],
    "face": ["__init__"],
    "tools": ["__main__", "cli", "runner", "timing", "bench", "report", "corpus", "corpus_shapes", "train_bench", "_fit_specfun"],
}
LAYER_OF = {m: i for i, (_, mods) in enumerate(LAYERS.items()) for m in mods}
FUNCTION_LEVEL_OK = {"cli", "__main__"}  # the CLI imports each command's modules when that command runs
LONG_OK = {("mathlib", "_build"), ("specfun", "_build64"), ("codegen", "render"), ("codegen", "_render_pass")}
MAX_LINES = 80


def _sources():
    """{module name relative to the package: path} for the installed package (kernels is autogen.kernels)."""
    root = pathlib.Path(autogen.__file__).parent
    out = {}
    for path in root.rglob("*.py"):
        rel = path.relative_to(root).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__" and len(parts) > 1:
            parts.pop()
        out[".".join(parts)] = path
    return out


def _target(module, node, modules):
    """The package modules an ImportFrom/Import names (relative to the package), or []."""
    if isinstance(node, ast.Import):
        return [a.name[len("autogen."):] if a.name != "autogen" else "__init__"
                for a in node.names if a.name == "autogen" or a.name.startswith("autogen.")]
    if node.level:
        package = module.split(".")[:-1] if not _is_package(module, modules) else module.split(".")
        if module == "__init__":
            package = []
        base = package[:len(package) - (node.level - 1)]
        base = ".".join(base + ([node.module] if node.module else []))
    elif node.module and (node.module == "autogen" or node.module.startswith("autogen.")):
        base = node.module[len("autogen."):] if node.module != "autogen" else ""
    else:
        return []
    out = []
    for alias in node.names:
        sub = f"{base}.{alias.name}" if base else alias.name
        out.append(sub if sub in modules else (base or "__init__"))
    return out


def _is_package(module, modules):
    return module in modules and modules[module].name == "__init__.py"


def _imports(modules):
    """[(importer, imported, node, at module level)] over the package."""
    out = []
    for name, path in modules.items():
        tree = ast.parse(path.read_text())
        top = {id(n) for n in tree.body}
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                for target in _target(name, node, modules):
                    if target != name:
                        out.append((name, target, node, id(node) in top))
    return out


def upward(modules):
    return [f"{a} ({_layer(a)}) imports {b} ({_layer(b)})" for a, b, _, _ in _imports(modules)
            if LAYER_OF[b] > LAYER_OF[a]]


def _layer(module):
    return list(LAYERS)[LAYER_OF[module]]


def _cycles(edges):
    """The strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            part = []
            while True:
                w = stack.pop()
                on.discard(w)
                part.append(w)
                if w == v:
                    break
            if len(part) > 1:
                found.append(sorted(part))
    for v in list(edges):
        if v not in index:
            visit(v)
    return found


def circles(modules):
    edges = {}
    for a, b, _, _ in _imports(modules):
        edges.setdefault(a, set()).add(b)
    return _cycles(edges)


def inner_imports(modules):
    return sorted({f"{a}:{node.lineno} imports {b}" for a, b, node, top in _imports(modules)
                   if not top and a not in FUNCTION_LEVEL_OK})


def _private_uses(name, path, modules):
    """`from .x import _y` and `x._y` for another package module x, in one module."""
    tree = ast.parse(path.read_text())
    bound = {}  # local name -> package module it stands for
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            for alias, target in zip(node.names, _target(name, node, modules)):
                if target == name:
                    continue
                if (target == alias.name or target.endswith("." + alias.name)) and target in modules:
                    bound[alias.asname or alias.name] = target
                elif alias.name.startswith("_") and not alias.name.startswith("__"):
                    found.append(f"{name}:{node.lineno} from {target} import {alias.name}")
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname and alias.name.startswith("autogen."):
                    bound[alias.asname] = alias.name[len("autogen."):]
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in bound \
                and node.attr.startswith("_") and not node.attr.startswith("__"):
            found.append(f"{name}:{node.lineno} {bound[node.value.id]}.{node.attr}")
    return found


def private_uses(modules):
    return [use for name, path in modules.items() for use in _private_uses(name, path, modules)]


def long_functions(modules):
    long = []
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and (name, node.name) not in LONG_OK:
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_LINES:
                    long.append(f"{name}.{node.name}: {lines} lines")
    return long


RULES = [upward, circles, inner_imports, private_uses, long_functions]


@pytest.fixture(scope="module")
def modules():
    return _sources()


def test_every_module_has_a_layer(modules):
    assert sorted(set(modules) - set(LAYER_OF)) == []


@pytest.mark.parametrize("rule", RULES, ids=[r.__name__ for r in RULES])
def test_rule_holds(modules, rule):
    assert rule(modules) == []


def test_the_rules_fail(tmp_path):
    """Each rule finds a violation written into stand-ins for three modules."""
    low = tmp_path / "ir.py"
    low.write_text("from . import functional\nfrom .functional import _x\n\n\ndef f():\n    from . import tracing\n"
                   + "    x = 1\n" * MAX_LINES)
    high = tmp_path / "functional.py"
    high.write_text("from . import ir\n")
    top = tmp_path / "tracing.py"
    top.write_text("")
    fake = {"ir": low, "functional": high, "tracing": top}
    assert "ir (core) imports functional (front)" in upward(fake)
    assert circles(fake) == [["functional", "ir"]]
    assert inner_imports(fake) == ["ir:6 imports tracing"]
    assert private_uses(fake) == ["ir:2 from functional import _x"]
    assert long_functions(fake) == [f"ir.f: {MAX_LINES + 2} lines"]

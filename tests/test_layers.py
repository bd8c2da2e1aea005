"""The layer table of docs/architecture.md, enforced on the code: no library module imports a
module of a higher layer or a package face, and the imports have no cycle.

Every import counts, also one inside a function (a lazy import is still a dependency)."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "inshrink"

# (layer, module prefixes), bottom up; modules of one layer may import each other (no cycles),
# a layer's separate groups (a tuple of tuples) may not import each other
LAYERS = [
    ("base", (("inshrink.errors", "inshrink.dtypes", "inshrink.strict_json", "inshrink.zstd_frame",
               "inshrink.progress", "inshrink._lazy", "inshrink._moved"),)),
    ("files", (("inshrink.atomic", "inshrink.digest"),)),
    ("kernels", (("inshrink.kernels",),)),
    ("records and stages", (("inshrink.container",), ("inshrink.codecs",))),
    ("encoder choices", (("inshrink.encode",),)),
    ("files of tensors", (("inshrink.io",),)),
    ("search", (("inshrink.search",),)),
    ("series", (("inshrink.series",),)),
    ("faces over arrays", (("inshrink.api", "inshrink.safetensors", "inshrink.numcodecs",
                            "inshrink.zarr"),)),
    ("torch", (("inshrink.torch",),)),
    ("dcp", (("inshrink.dcp",),)),
    ("training integrations", (("inshrink.checkpointing",), ("inshrink.transformers",),
                               ("inshrink.lightning",))),
    ("cli", (("inshrink.cli",),)),
]

# old module paths kept for users (CHANGELOG.md); nothing of the library imports them
SHIMS = {"inshrink.tensorfile", "inshrink.rebase", "inshrink.policy", "inshrink.roles",
         "inshrink.encoder", "inshrink.convert", "inshrink.dcp_series", "inshrink.report",
         "inshrink.torch_files", "inshrink.codecs.quantize", "inshrink.codecs.array",
         "inshrink.torch.sharded", "inshrink.torch.checkpointer", "inshrink.torch.budget"}


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


ALL = modules()
FACES = {name for name, path in ALL.items() if path.name == "__init__.py"}


def imports(name: str) -> set[str]:
    """The inshrink modules ``name`` imports (``from pkg import module`` names the module)."""
    path = ALL[name]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[:len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                found.add(sub if sub in ALL else target)
    return {m for m in found if m in ALL and m != name}


def place(name: str) -> tuple[int, int]:
    """(layer, group) of a module; the longest prefix wins."""
    best = None
    for layer, (_, groups) in enumerate(LAYERS):
        for group, prefixes in enumerate(groups):
            for prefix in prefixes:
                if name == prefix or name.startswith(prefix + "."):
                    if best is None or len(prefix) > best[0]:
                        best = (len(prefix), layer, group)
    assert best is not None, f"{name} is in no layer of the table"
    return best[1], best[2]


LIBRARY = sorted(set(ALL) - FACES - SHIMS - {"inshrink.__main__"})


def test_every_module_has_a_layer():
    for name in LIBRARY:
        place(name)


@pytest.mark.parametrize("name", LIBRARY)
def test_no_module_imports_upwards_a_face_or_a_shim(name):
    layer, group = place(name)
    for target in sorted(imports(name)):
        assert target not in SHIMS, f"{name} imports the deprecated shim {target}"
        assert target not in FACES or target == "inshrink", (
            f"{name} imports the package face {target}: import the module that defines the name")
        if target == "inshrink":
            continue
        t_layer, t_group = place(target)
        assert t_layer <= layer, (f"{name} ({LAYERS[layer][0]}) imports {target}, "
                                  f"a higher layer ({LAYERS[t_layer][0]})")
        if t_layer == layer:
            assert t_group == group, f"{name} imports {target}, a separate group of its layer"


def test_shims_are_short():
    for name in SHIMS:
        assert len(ALL[name].read_text().splitlines()) <= 8, name


def test_no_import_cycles():
    graph = {name: imports(name) - FACES - SHIMS for name in LIBRARY}
    seen, stack, cycles = set(), [], []

    def visit(node: str) -> None:
        if node in stack:
            cycles.append(stack[stack.index(node):] + [node])
            return
        if node in seen:
            return
        seen.add(node)
        stack.append(node)
        for target in sorted(graph.get(node, ())):
            visit(target)
        stack.pop()

    for name in LIBRARY:
        visit(name)
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(c) for c in cycles)

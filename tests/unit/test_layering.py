"""The shape of the house: layers only point down (blitz < deployments < loadtest <
tests), no import cycle and no Ray in ``blitz/``. Inside ``blitz/`` the packages are floors
(``FLOORS``) that also only point down; a package's subpackages live on its floor, so a
package grows by concept (a subpackage named for a concept that has several modules), not
by cutting a class in halves. No module holds an object of a module that imports it (the
cycle an import graph cannot see: ``HELD_BY_AN_IMPORT``).

Size is a review prompt, not a reason to cut: a module past ``REVIEW_LINES`` lines or a
folder past ``REVIEW_MODULES`` modules is listed by ``test_size_review_prompts`` (shown with
``pytest tests/unit/test_layering.py -rP``): ask whether it holds one concept. Only the far
ceilings ``MAX_LINES`` and ``MAX_MODULES`` fail (STYLE.md 16: a god file of 2,000 lines is
the anti-pattern; Starlette's largest module is under 900 lines). Warnings are errors in
this suite, so the prompt is printed, not warned.

Every import counts: module level, inside functions, under ``TYPE_CHECKING``. Importing
``blitz.a.b`` imports the package ``blitz.a`` first, so it counts as an import of both.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "blitz"
REVIEW_LINES = 400  # past this a module is listed for review: one concept?
REVIEW_MODULES = 12  # in one folder, its __init__ not counted: past this, listed for review
MAX_LINES = 1000  # the hard ceilings
MAX_MODULES = 20


def _name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def imported(path: Path) -> set[str]:
    """Every module name the file at ``path`` imports, wherever the import statement is."""
    return imports_in(path.read_text(encoding="utf-8"), _name(path), path.name == "__init__.py")


def imports_in(text: str, name: str, is_package: bool) -> set[str]:
    """Every module name the source ``text`` of module ``name`` imports."""
    package = name if is_package else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: from . import x, from ..a import b
                parts = package.split(".")
                anchor = parts[: len(parts) - node.level + 1]
                base = ".".join([*anchor, *([node.module] if node.module else [])])
            else:
                base = node.module or ""
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)  # maybe submodules
    return found


def blitz_graph() -> dict[str, set[str]]:
    """module -> the blitz modules it imports (with their parent packages)."""
    graph: dict[str, set[str]] = {}
    for name, path in MODULES.items():
        targets = set()
        for module in imported(path):
            parts = module.split(".")
            targets.update(".".join(parts[:i]) for i in range(1, len(parts) + 1))
        graph[name] = {t for t in targets if t in MODULES and t != name}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as a path that ends where it starts, or None."""
    done: set[str] = set()
    path: list[str] = []
    on_path: set[str] = set()

    def visit(node: str) -> list[str] | None:
        if node in on_path:
            return [*path[path.index(node):], node]
        if node in done:
            return None
        path.append(node)
        on_path.add(node)
        for target in sorted(graph.get(node, ())):
            cycle = visit(target)
            if cycle:
                return cycle
        path.pop()
        on_path.discard(node)
        done.add(node)
        return None

    for start in sorted(graph):
        cycle = visit(start)
        if cycle:
            return cycle
    return None


def test_the_cycle_finder_reports_the_path():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set()}
    assert find_cycle(graph) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None


def test_imports_inside_functions_and_type_checking_count():
    text = ("from typing import TYPE_CHECKING\n"
            "if TYPE_CHECKING:\n    from blitz import errors\n"
            "def f():\n    from ..encoders.base import Encoder\n    import ray.serve\n")
    found = imports_in(text, "blitz.loading.load", is_package=False)
    assert {"blitz.errors", "blitz.encoders.base", "ray.serve"} <= found


def test_no_import_cycle_among_blitz_modules():
    cycle = find_cycle(blitz_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


LAYERS = {  # package -> the repository packages it may not import (layers point down)
    "blitz": ("deployments", "loadtest", "tests"),
    "deployments": ("loadtest", "tests"),
    "loadtest": ("tests",),
}


@pytest.mark.parametrize("package", sorted(LAYERS))
def test_layers_only_point_down(package):
    """blitz (the library) < deployments (the Ray glue, the CLI that needs Ray) <
    loadtest (measuring them); tests sit on top. No module imports a layer above it."""
    banned = LAYERS[package]
    offenders = {}
    for path in sorted((REPO / package).rglob("*.py")):
        found = sorted(m for m in imported(path) if m.split(".")[0] in banned)
        if found:
            offenders[str(path.relative_to(REPO))] = found
    assert offenders == {}


def test_deployments_modules_do_not_call_up_to_the_cli():
    """deployments/cli.py is the command line's top; the glue it drives never imports it."""
    for path in sorted((REPO / "deployments").glob("*.py")):
        if path.name != "cli.py":
            assert "deployments.cli" not in imported(path), path.name


def test_blitz_never_imports_ray():
    offenders = {name: sorted(m for m in imported(path) if m == "ray" or m.startswith("ray."))
                 for name, path in MODULES.items()}
    assert {name: found for name, found in offenders.items() if found} == {}


@pytest.mark.parametrize("name", sorted(MODULES))
def test_no_module_is_a_god_file(name):
    lines = len(MODULES[name].read_text(encoding="utf-8").splitlines())
    assert lines <= MAX_LINES, f"{name} has {lines} lines (at most {MAX_LINES}): split it " \
        "by concept, a subpackage named for what it holds"


def _folders() -> dict[str, list[str]]:
    """Each package of ``blitz`` -> its modules (its ``__init__`` and subpackages not counted)."""
    return {_name(path.parent): sorted(p.name for p in path.parent.glob("*.py")
                                       if p.name != "__init__.py")
            for path in sorted(PACKAGE.rglob("__init__.py"))}


def size_review_prompts() -> list[str]:
    """The modules and folders past the review sizes, each with the question to ask."""
    prompts = [f"{name}: {lines} lines; one concept? (if not, a subpackage named for each)"
               for name, path in MODULES.items()
               if (lines := len(path.read_text(encoding="utf-8").splitlines())) > REVIEW_LINES]
    prompts += [f"{package}/: {len(modules)} modules; one concept? (if not, a subpackage "
                "named for each)" for package, modules in _folders().items()
                if len(modules) > REVIEW_MODULES]
    return prompts


def test_size_review_prompts():
    """Passes whatever it finds: the list is for a reviewer (``-rP`` shows it)."""
    for prompt in size_review_prompts():
        print("review:", prompt)


# --- floors inside blitz/ ---------------------------------------------------------------

LEAVES = ("blitz.errors", "blitz.timing", "blitz.body_scan", "blitz.codecs")
"""The top-level leaf modules: every module may import them; they import only each other."""

FLOORS = (  # lowest first: a module imports its own package, lower floors and LEAVES
    ("blitz.runtime",),  # the process a model runs in: threads, children, CPU, GPU memory
    ("blitz.sources",),  # the model cache, object-storage sources
    ("blitz.settings",),  # typed settings, the model registry, sizes
    ("blitz.multivector",),  # many vectors per text made one: MUVERA, MaxSim (numpy)
    ("blitz.encoders",),  # the encoder contract, one backend per module, output options
    ("blitz.images",),  # images from strangers' bytes, within limits; the dual encoder
    ("blitz.vision_language",),  # a decoder reading texts and images: embedder, reranker
    ("blitz.loading", "blitz.hop_messages"),  # a ModelSpec to an Encoder; the jobs and results of the hops
    ("blitz.admin",),  # the model table the admin API changes and replicas follow
    ("blitz.pool", "blitz.bulk", "blitz.batches"),  # a pool replica's Ray-free half; the bulk
    # job's; the batch API's store and runner
    ("blitz.ingress",),  # request logic: limits, routing, output options
    ("blitz.http", "blitz.grpc_api"),  # the HTTP API; the gRPC API (TEI's tei.v1)
    ("blitz.cli", "blitz.client", "blitz.map"),  # the command line; the Python client; the map
)
FLOOR = {unit: floor for floor, units in enumerate(FLOORS) for unit in units}


def unit_of(module: str) -> str | None:
    """The package or top-level module of ``blitz`` that ``module`` lives in (None for the
    ``blitz`` package itself and for anything outside it)."""
    parts = module.split(".")
    return ".".join(parts[:2]) if parts[0] == "blitz" and len(parts) > 1 else None


def upward_imports(name: str, imports: set[str]) -> list[str]:
    """The imports of module ``name`` that its floor does not allow: a higher floor, another
    package on its own floor, or a unit the table does not know."""
    own = unit_of(name)
    floor = -1 if own in LEAVES else FLOOR.get(own or "")
    bad = []
    for module in sorted(imports):
        unit = unit_of(module)
        if unit is None or unit == own or unit in LEAVES:
            continue
        if floor is None or unit not in FLOOR or FLOOR[unit] >= floor:
            bad.append(module)
    return bad


def test_an_upward_import_is_named():
    text = ("from typing import TYPE_CHECKING\n"
            "from blitz import errors\nfrom blitz.runtime import model_threads\n"
            "if TYPE_CHECKING:\n    from blitz.ingress.service import RequestRecord\n"
            "def f():\n    from ..http import api\n")
    found = imports_in(text, "blitz.pool.mixed_batch", is_package=False)
    assert upward_imports("blitz.pool.mixed_batch", found) == [
        "blitz.http", "blitz.http.api", "blitz.ingress.service",
        "blitz.ingress.service.RequestRecord"]


def test_a_floor_may_not_import_its_neighbour_or_an_unknown_unit():
    assert upward_imports("blitz.pool.mixed_batch", {"blitz.bulk.job"}) == ["blitz.bulk.job"]
    assert upward_imports("blitz.pool.mixed_batch", {"blitz.attic.x"}) == ["blitz.attic.x"]
    assert upward_imports("blitz.errors", {"blitz.runtime.model_threads"}) == [
        "blitz.runtime.model_threads"]
    assert upward_imports("blitz.codecs", {"blitz", "blitz.errors", "numpy"}) == []
    assert upward_imports("blitz.http.api", {"blitz.hop_messages", "blitz.http.responses",
                                             "blitz.pool.batching", "blitz.timing"}) == []


def test_every_top_level_unit_has_a_floor():
    units = {unit_of(name) for name in MODULES} - {None}
    assert sorted(units - set(FLOOR) - set(LEAVES)) == []
    assert sorted((set(FLOOR) | set(LEAVES)) - units) == []


def test_packages_only_import_down():
    offenders = {name: found for name, path in MODULES.items()
                 if (found := upward_imports(name, imported(path)))}
    assert offenders == {}, "imports that point up a floor (FLOORS): " + "; ".join(
        f"{name} imports {', '.join(found)}" for name, found in offenders.items())


@pytest.mark.parametrize("package", sorted(_folders()))
def test_no_package_is_a_heap(package):
    modules = _folders()[package]
    assert len(modules) <= MAX_MODULES, f"{package} holds {len(modules)} modules " \
        f"(at most {MAX_MODULES}): group them by concept in subpackages: {modules}"


def test_package_inits_say_what_they_own_and_import_nothing():
    """An ``__init__`` is read by every import of its package: a docstring, no imports."""
    for path in sorted(PACKAGE.rglob("__init__.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        assert ast.get_docstring(tree), path.relative_to(REPO)
        assert imported(path) <= {"__future__", "__future__.annotations"}, \
            path.relative_to(REPO)


# --- no module holds the object that imports it -------------------------------------------

HELD_BY_AN_IMPORT: set[tuple[str, str]] = set()  # known: (module, the module it hands
# ``self`` to); the HTTP API's halves became route functions over a request kit


def self_handed_down(text: str, name: str, is_package: bool) -> set[tuple[str, str]]:
    """``(name, target)`` for each blitz module ``target`` that the source ``text`` of module
    ``name`` imports and whose function or class it calls with ``self`` as an argument: the
    callee then holds an object of a module that imports it, a cycle the import graph cannot
    see (the callee types it ``Any`` and reaches back into it)."""
    package = name if is_package else name.rpartition(".")[0]
    tree = ast.parse(text)
    origin: dict[str, str] = {}  # a local name -> the module it names or comes from
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                anchor = parts[: len(parts) - node.level + 1]
                base = ".".join([*anchor, *([node.module] if node.module else [])])
            else:
                base = node.module or ""
            for alias in node.names:
                module = f"{base}.{alias.name}"
                origin[alias.asname or alias.name] = module if module in MODULES else base
        elif isinstance(node, ast.Import):
            for alias in node.names:
                origin[alias.asname or alias.name.split(".")[0]] = alias.name
    found = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        arguments = [*node.args, *(keyword.value for keyword in node.keywords)]
        if not any(isinstance(a, ast.Name) and a.id == "self" for a in arguments):
            continue
        root = node.func
        while isinstance(root, ast.Attribute):
            root = root.value
        if isinstance(root, ast.Name) and root.id in origin:
            target = origin[root.id]
            if unit_of(target) is not None and target != name:
                found.add((name, target))
    return found


def test_a_module_handing_itself_to_what_it_imports_is_named():
    text = ("from dataclasses import asdict\nfrom blitz.http import openapi\n"
            "from .middleware import RequestMiddleware\nfrom blitz.pool import batching\n"
            "class HttpApi:\n    def __init__(self):\n"
            "        self.app = RequestMiddleware(self)\n"
            "        self.doc = openapi.document(api=self)\n"
            "        self.batcher = batching.Batcher(self.run)\n"
            "        self.row = asdict(self)\n")
    assert self_handed_down(text, "blitz.http.api", is_package=False) == {
        ("blitz.http.api", "blitz.http.openapi"), ("blitz.http.api", "blitz.http.middleware")}


def test_no_module_holds_an_object_of_a_module_that_imports_it():
    found = set()
    for name, path in MODULES.items():
        found |= self_handed_down(path.read_text(encoding="utf-8"), name,
                                  path.name == "__init__.py")
    assert found - HELD_BY_AN_IMPORT == set(), "modules handed the object of a module that " \
        "imports them (make them functions over a small helper module both import)"
    assert HELD_BY_AN_IMPORT - found == set(), "gone: take them off HELD_BY_AN_IMPORT"

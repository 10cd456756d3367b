"""The shape of the source: stages that don't loop back, files and functions (Python and C++) of a
readable size.

The package is built in stages, each importing only its own and earlier ones, so a format, a
kernel or a check has one home and nothing climbs back from a later stage into an earlier one.
A child module (run in its own process by name) counts as the stage it lives in.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "installer" / "ktforge"

# Earliest first. "ktforge" itself (the package's lazy ``ktforge.MoE``) and "_native" (the
# extension, beneath every stage that computes) are not stages.
STAGES: tuple[frozenset[str], ...] = (
    frozenset({"files", "process", "resources", "remedies", "formats"}),
    frozenset({"detect"}),
    frozenset({"builder"}),
    frozenset({"checkpoints"}),
    frozenset({"kernels"}),
    frozenset({"transformers", "engines", "bench", "doctor"}),
    frozenset({"cli", "__main__"}),
)
NOT_STAGES = frozenset({"__init__", "_native", ""})
MAX_FILE_LINES = 600
MAX_FUNCTION_LINES = 80


def _stage(part: str) -> int:
    for index, names in enumerate(STAGES):
        if part in names:
            return index
    raise AssertionError(f"ktforge.{part} is in no stage: add it to tests/test_structure.py's STAGES")


def _top(module: str) -> str:
    """ktforge.x.y -> x; anything else -> ''."""
    parts = module.split(".")
    return parts[1] if parts[0] == "ktforge" and len(parts) > 1 else ""


def _imports(tree: ast.AST) -> list[tuple[int, str]]:
    """Every ktforge module imported anywhere in the file (functions included), with its line."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "ktforge":  # modules by name; other names (__version__) are the package's
                found += [(node.lineno, f"ktforge.{a.name}") for a in node.names if _is_module(a.name)]
            else:
                found.append((node.lineno, node.module))
    return found


def _is_module(name: str) -> bool:
    return (PACKAGE / name).is_dir() or (PACKAGE / f"{name}.py").is_file() or name == "_native"


def _sources() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts)


def test_every_module_has_a_stage() -> None:
    for path in _sources():
        part = path.relative_to(PACKAGE).parts[0].removesuffix(".py")
        if part not in NOT_STAGES:
            _stage(part)


def test_no_stage_imports_a_later_stage() -> None:
    backwards = []
    for path in _sources():
        part = path.relative_to(PACKAGE).parts[0].removesuffix(".py")
        if part in NOT_STAGES:
            continue
        for line, module in _imports(ast.parse(path.read_text())):
            target = _top(module)
            if target in NOT_STAGES or target == part:
                continue
            if _stage(target) > _stage(part):
                backwards.append(f"{path.relative_to(ROOT)}:{line} imports {module}")
    assert not backwards, "\n".join(backwards)


def test_the_stage_check_sees_a_backward_import(tmp_path: Path) -> None:
    tree = ast.parse("def f():\n    from ktforge.kernels import moe\n")
    [(line, module)] = _imports(tree)
    assert (line, _top(module)) == (2, "kernels") and _stage("kernels") > _stage("checkpoints")


ENGINES = PACKAGE / "engines"
ENGINE_ALIASES = {"ktforge.transformers": "transformers"}  # the name users import, the engine's module


def _engine_of(module: str) -> str | None:
    """The engine a ktforge module belongs to (ktforge.engines.vllm.method -> vllm), else None."""
    if module in ENGINE_ALIASES:
        return ENGINE_ALIASES[module]
    parts = module.split(".")
    return parts[2] if parts[:2] == ["ktforge", "engines"] and len(parts) > 2 else None


def test_no_engine_imports_another() -> None:
    engines = sorted(p.name for p in ENGINES.iterdir() if (p / "__init__.py").is_file())
    assert {"transformers", "vllm"} <= set(engines)
    crossing = []
    for engine in engines:
        for path in sorted((ENGINES / engine).rglob("*.py")):
            for line, module in _imports(ast.parse(path.read_text())):
                other = _engine_of(module)
                if other is not None and other != engine:
                    crossing.append(f"{path.relative_to(ROOT)}:{line} imports {module}")
    assert not crossing, "\n".join(crossing)


def test_the_engine_check_sees_a_crossing() -> None:
    [(_, module)] = _imports(ast.parse("from ktforge.engines.transformers import why_unsupported\n"))
    assert _engine_of(module) == "transformers" and _engine_of("ktforge.transformers") == "transformers"
    assert _engine_of("ktforge.kernels.torch_op") is None


@pytest.mark.parametrize(
    "folder, suffixes",
    [(PACKAGE, {".py"}), (ROOT / "native", {".cpp", ".hpp", ".h", ".txt"}), (ROOT / "probes", {".c", ".h"})],
)
def test_no_source_file_is_over_600_lines(folder: Path, suffixes: set[str]) -> None:
    files = [p for p in folder.rglob("*") if p.suffix in suffixes and p.is_file()]
    assert files
    long = [f"{p.relative_to(ROOT)}: {n}" for p in files if (n := len(p.read_text().splitlines())) > MAX_FILE_LINES]
    assert not long, "\n".join(long)


def test_no_python_function_is_over_80_lines() -> None:
    long = []
    for path in _sources():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name}: {length} lines")
    assert not long, "\n".join(long)


def _cpp_functions(text: str) -> list[tuple[int, int, str]]:
    """(first line, length, signature) of each function body in C++ source, by brace depth: a
    line that opens a brace after a parameter list, outside namespace/class/control blocks."""
    found, depth, start = [], 0, None
    opener = re.compile(r"^\s*[\w:<>,*&~ ]+\(.*")
    block = re.compile(r"^\s*(namespace|struct|class|enum|if|for|while|switch|else|do)\b")
    for number, line in enumerate(text.splitlines(), 1):
        code = re.sub(r'"(?:[^"\\]|\\.)*"', '""', re.sub(r"//.*", "", line))
        opens, closes = code.count("{"), code.count("}")
        if start is None and opens > closes and opener.match(line) and not block.match(line):
            start = (number, depth, line.strip())
        depth += opens - closes
        if start is not None and depth <= start[1]:
            found.append((start[0], number - start[0] + 1, start[2]))
            start = None
    return found


def test_the_cpp_scan_sees_a_function() -> None:
    text = "namespace kt {\nint f(int a) {\n  if (a) {\n    return 1;\n  }\n  return 0;\n}\n}  // namespace kt\n"
    assert _cpp_functions(text) == [(2, 6, "int f(int a) {")]


def test_no_cpp_function_is_over_80_lines() -> None:
    long = []
    for path in sorted((ROOT / "native" / "src").rglob("*.[ch]pp")):
        for line, length, signature in _cpp_functions(path.read_text()):
            if length > MAX_FUNCTION_LINES:
                long.append(f"{path.relative_to(ROOT)}:{line} {signature[:60]}: {length} lines")
    assert not long, "\n".join(long)

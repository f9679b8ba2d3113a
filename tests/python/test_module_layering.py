"""The module table of docs/architecture.md is the layering rule: each module's sources include,
and its CMake libraries link, only the modules its "may use" cell names (and itself). An edge
outside the table fails here, naming the file and the line."""
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
INCLUDE = re.compile(r'^[ \t]*#[ \t]*include[ \t]+"([^"]+)"', re.MULTILINE)
LINK = re.compile(r"target_link_libraries\s*\(([^)]*)\)", re.DOTALL)
SOURCE_SUFFIXES = {".h", ".cc", ".cu", ".cuh"}


def read_table(architecture_md):
    """{folder: {"libraries": set, "may_use": set}} from the table whose header has 'may use'."""
    modules, in_table = {}, False
    for line in architecture_md.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("|") and "may use" in cells:
            header, in_table = cells, True
            continue
        if not in_table:
            continue
        if not line.startswith("|"):
            break
        if set(line) <= set("|-: "):
            continue
        row = dict(zip(header, cells))
        folder = row["folder"].strip("`").rstrip("/")
        libraries = set(re.findall(r"`(moeserve_\w+)`", row.get("library", "")))
        may_use = set(re.findall(r"`([a-z_/]+?)/?`", row["may use"]))
        if "every module" in row["may use"]:
            may_use = {"*"}
        modules[folder] = {"libraries": libraries, "may_use": may_use}
    return modules


def module_of_include(path, folders):
    """The module an include path belongs to (longest folder prefix), or None (system header)."""
    best = None
    for folder in folders:
        if path.startswith(folder + "/") and (best is None or len(folder) > len(best)):
            best = folder
    return best


def unlisted_module(path, root, folders):
    """A top-level folder of the repo with its own CMakeLists.txt that the table does not list."""
    top = path.split("/")[0]
    return top not in folders and (root / top / "CMakeLists.txt").is_file() and not any(
        f.startswith(top + "/") for f in folders)


def violations(root, modules):
    folders = set(modules)
    library_folder = {lib: f for f, m in modules.items() for lib in m["libraries"]}
    found = []
    for folder, rule in modules.items():
        allowed = folders if rule["may_use"] == {"*"} else rule["may_use"] | {folder}
        base = root / folder
        if not base.is_dir():
            found.append(f"{folder}: listed in the module table but missing")
            continue
        for path in sorted(base.rglob("*")):
            # backend/cuda is its own module inside backend/: skip a nested module's files.
            owner = module_of_include(str(path.relative_to(root)), folders)
            if owner != folder:
                continue
            text = path.read_text(errors="replace") if path.is_file() else ""
            if path.suffix in SOURCE_SUFFIXES:
                for match in INCLUDE.finditer(text):
                    used = module_of_include(match.group(1), folders)
                    if used is None and unlisted_module(match.group(1), root, folders):
                        used = match.group(1).split("/")[0] + " (not in the module table)"
                    if used is not None and used not in allowed:
                        line = text.count("\n", 0, match.start()) + 1
                        found.append(f"{path.relative_to(root)}:{line}: {folder} includes {match.group(1)} "
                                     f"({used} is not in its 'may use': {sorted(rule['may_use'])})")
            elif path.name == "CMakeLists.txt":
                for match in LINK.finditer(text):
                    for lib in re.findall(r"\bmoeserve_\w+", match.group(1)):
                        used = library_folder.get(lib)
                        if used is not None and used not in allowed:
                            line = text.count("\n", 0, match.start()) + 1
                            found.append(f"{path.relative_to(root)}:{line}: {folder} links {lib} "
                                         f"({used} is not in its 'may use': {sorted(rule['may_use'])})")
    return found


def test_every_module_keeps_to_the_table():
    modules = read_table((ROOT / "docs" / "architecture.md").read_text())
    for required in ("core", "sched", "runtime", "model", "comm", "serve"):
        assert required in modules, f"docs/architecture.md's module table has no row for {required}/"
    assert "runtime" not in modules["sched"]["may_use"] and "model" not in modules["sched"]["may_use"]
    assert violations(ROOT, modules) == []


def test_a_forbidden_edge_is_reported(tmp_path):
    table = ("| folder | library | may use | what |\n|---|---|---|---|\n"
             "| `core/` | `moeserve_core` | — | x |\n"
             "| `kv/` | `moeserve_kv` | `core` | x |\n"
             "| `sched/` | `moeserve_sched` | `core`, `kv` | x |\n"
             "| `runtime/` | `moeserve_runtime` | `core`, `kv`, `sched` | x |\n")
    modules = read_table(table)
    assert modules["sched"]["may_use"] == {"core", "kv"}
    for folder in modules:
        (tmp_path / folder).mkdir()
    (tmp_path / "sched" / "scheduler.cc").write_text('#include "kv/kv_cache.h"\n#include <vector>\n')
    (tmp_path / "sched" / "CMakeLists.txt").write_text("target_link_libraries(moeserve_sched PUBLIC moeserve_kv)\n")
    assert violations(tmp_path, modules) == []
    (tmp_path / "sched" / "scheduler.h").write_text('#pragma once\n\n#include "runtime/engine.h"\n')
    (tmp_path / "sched" / "CMakeLists.txt").write_text(
        "target_link_libraries(moeserve_sched\n  PUBLIC moeserve_kv moeserve_runtime)\n")
    found = violations(tmp_path, modules)
    assert len(found) == 2, found
    assert found[0].startswith("sched/CMakeLists.txt:1: sched links moeserve_runtime")
    assert found[1].startswith("sched/scheduler.h:3: sched includes runtime/engine.h")


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q"]))

#!/usr/bin/env python3
"""Checks that every include and every link follows chorus's layers (docs/ARCHITECTURE.md, "Layers").

A folder is a layer and a CMake target. A file may include headers of its own
layer and of the layers below it, never of a layer above it or beside it,
whether it names them "io/store/wal.hpp" or <io/store/wal.hpp>; the public
headers (<chorus/...>) are below everything. Some system headers belong to
one layer only: CAF to actors/, libcurl to io/upload/, CUDA's to the one file
that checks chorus's own declarations of them. The same holds for the CMake
link graph: a target defined in a layer's CMakeLists.txt may link the targets
of its own layer and of the layers below it (targets outside the layers, the
libraries that bring them together, are not judged).

    check_layers.py [ROOT]       exit 1 and one line per include against the layers
    check_layers.py --self-test  shows that a wrong include is caught
"""
import os
import re
import sys
import tempfile

# (folder, rank): a file may include from a folder of lower rank, or its own.
# Folders of equal rank are peers and may not include each other.
LAYERS = [
    ("runtime/include", 0),
    ("runtime/core", 1),
    ("io/platform", 2),
    ("io/store", 3),
    ("io/sampling", 3),
    ("io/upload", 4),
    ("runtime/client", 5),
    ("actors", 6),
    ("cli", 7),
    ("python", 8),
]

# System headers a layer owns: (include prefix, folders allowed to include it).
OWNED = [
    ("caf/", ("actors", "runtime/include/chorus/caf.hpp")),
    ("curl/", ("io/upload",)),
    ("cuda", ("runtime/client/cuda_api.cpp",)),
    ("nccl", ("runtime/client/cuda_api.cpp",)),
    ("asio", ("runtime/include/chorus/asio.hpp",)),
]

INCLUDE = re.compile(r'^\s*#\s*include\s*([<"])([^>"]+)[>"]')
# CMake: the targets a file defines, and what each links.
CMAKE_DEFINE = re.compile(r'\b(?:chorus_layer|add_library|add_executable|pybind11_add_module|[Pp]ython3?_add_library)\s*\(\s*([A-Za-z0-9_.+-]+)')
CMAKE_LINK = re.compile(r'\btarget_link_libraries\s*\(\s*([A-Za-z0-9_.+-]+)([^)]*)\)', re.S)
CMAKE_KEYWORDS = {"PUBLIC", "PRIVATE", "INTERFACE", "LINK_PUBLIC", "LINK_PRIVATE", "LINK_INTERFACE_LIBRARIES"}


def layer_of(path):
    """The layer folder that holds `path` (relative to the root), or None."""
    best = None
    for folder, rank in LAYERS:
        if path == folder or path.startswith(folder + "/"):
            if best is None or len(folder) > len(best[0]):
                best = (folder, rank)
    return best


def allowed(path, owners):
    return any(path == o or path.startswith(o + "/") for o in owners)


def check(root):
    problems = []
    for folder, _ in LAYERS:
        top = os.path.join(root, folder)
        for dirpath, _, names in os.walk(top):
            for name in sorted(names):
                if not name.endswith((".cpp", ".hpp", ".h")):
                    continue
                full = os.path.join(dirpath, name)
                rel = os.path.relpath(full, root)
                here = layer_of(rel)
                with open(full, encoding="utf-8", errors="replace") as f:
                    for number, line in enumerate(f, 1):
                        m = INCLUDE.match(line)
                        if not m:
                            continue
                        kind, target = m.groups()
                        if kind == "<" and layer_of(target) is None:
                            if target.startswith("chorus/"):
                                continue
                            for prefix, owners in OWNED:
                                if target.startswith(prefix) and not allowed(rel, owners):
                                    problems.append(f"{rel}:{number}: includes <{target}>, which only "
                                                    f"{', '.join(owners)} may include")
                            continue
                        there = layer_of(target)
                        if there is None:
                            problems.append(f"{rel}:{number}: includes \"{target}\", which is in no layer "
                                            f"(internal includes name a path from the repository root)")
                        elif there[0] != here[0] and there[1] >= here[1]:
                            way = "beside" if there[1] == here[1] else "above"
                            problems.append(f"{rel}:{number}: {here[0]} includes \"{target}\" of {there[0]}, "
                                            f"a layer {way} it: move the code it needs down, or turn the "
                                            f"dependency around (an interface below, implemented above)")
    return problems + check_links(root)


def cmake_files(root):
    """The CMakeLists.txt of the layers' folders (and of the folders above them), as (relative dir, text)."""
    tops = sorted({folder.split("/")[0] for folder, _ in LAYERS})
    for top in tops:
        for dirpath, _, names in os.walk(os.path.join(root, top)):
            if "CMakeLists.txt" in names:
                rel = os.path.relpath(dirpath, root)
                with open(os.path.join(dirpath, "CMakeLists.txt"), encoding="utf-8", errors="replace") as f:
                    # Comments out, lines kept: a match's line number is its place in the file.
                    yield rel, re.sub(r"#[^\n]*", "", f.read())


def check_links(root):
    """Every link of a target defined in a layer to a target of a layer above it or beside it."""
    defined, links = {}, []
    for rel, text in cmake_files(root):
        for m in CMAKE_DEFINE.finditer(text):
            defined[m.group(1)] = layer_of(rel)
        for m in CMAKE_LINK.finditer(text):
            line = text.count("\n", 0, m.start()) + 1
            for dep in m.group(2).split():
                if dep not in CMAKE_KEYWORDS:
                    links.append((f"{rel}/CMakeLists.txt:{line}", m.group(1), dep))
    problems = []
    for where, target, dep in links:
        here, there = defined.get(target), defined.get(dep)
        if here is None or there is None or there[0] == here[0] or there[1] < here[1]:
            continue
        way = "beside" if there[1] == here[1] else "above"
        problems.append(f"{where}: {target} of {here[0]} links {dep} of {there[0]}, a layer {way} it: "
                        f"move the code it needs down, or have the library that brings the layers "
                        f"together link both")
    return problems


def self_test():
    with tempfile.TemporaryDirectory() as root:
        def write(rel, text):
            os.makedirs(os.path.dirname(os.path.join(root, rel)), exist_ok=True)
            with open(os.path.join(root, rel), "w") as f:
                f.write(text)
        write("runtime/core/a.hpp", '#include "io/store/wal.hpp"\n')      # up: caught
        write("io/store/wal.hpp", '#include "runtime/core/a.hpp"\n')      # down: fine
        write("io/sampling/s.cpp", '#include "io/store/wal.hpp"\n')       # beside: caught
        write("io/upload/u.cpp", '#include <curl/curl.h>\n')              # owned: fine
        write("io/store/c.cpp", '#include <caf/all.hpp>\n')               # owned elsewhere: caught
        write("cli/x.cpp", '#include "actors/run.hpp"\n#include "nowhere/x.hpp"\n')  # fine; no layer: caught
        write("io/platform/p.cpp", '#include <runtime/core/a.hpp>\n#include <io/store/wal.hpp>\n')  # <> down fine, up caught
        # Links: down fine, up caught (multi-line, keywords, comments), beside caught, outside the layers not judged.
        write("runtime/core/CMakeLists.txt", 'chorus_layer(chorus_core STATIC a.cpp)\n'
              'target_link_libraries(chorus_core PUBLIC simdjson # a comment: chorus_store\n'
              '                      PRIVATE chorus_store)\n')
        write("io/store/CMakeLists.txt", 'add_library(chorus_store STATIC wal.cpp)\n'
              'target_link_libraries(chorus_store PUBLIC chorus_core)\n')
        write("io/sampling/CMakeLists.txt", 'add_library(chorus_sampling s.cpp)\n'
              'target_link_libraries(chorus_sampling PRIVATE chorus_store)\n')
        write("io/CMakeLists.txt", 'add_library(chorus_io INTERFACE)\n'
              'target_link_libraries(chorus_io INTERFACE chorus_sampling chorus_store chorus_core)\n')
        got = check(root)
        expected = ["runtime/core/a.hpp:1", "io/sampling/s.cpp:1", "io/store/c.cpp:1", "cli/x.cpp:2",
                    "io/platform/p.cpp:2", "runtime/core/CMakeLists.txt:2", "io/sampling/CMakeLists.txt:2"]
        found = [p.split(": ")[0] for p in got]
        if sorted(found) != sorted(expected):
            print("self-test: expected problems at", sorted(expected), "got:", *got, sep="\n  ")
            return 1
    print("self-test: every wrong include and link caught, every right one passed")
    return 0


def main(argv):
    if len(argv) > 1 and argv[1] == "--self-test":
        return self_test()
    root = argv[1] if len(argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    problems = check(root)
    for p in problems:
        print(p)
    if problems:
        print(f"{len(problems)} include(s) or link(s) against the layers (docs/ARCHITECTURE.md, \"Layers\")")
        return 1
    print("every include and every link follows the layers")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

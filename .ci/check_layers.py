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

A layer is also one namespace: its code lives in chorus::NAME (NAME the
layer's target without its "chorus_" prefix, and the folder's own name), or
in namespaces nested in it. A file may reopen the namespace of a layer below
it (to forward-declare what that layer owns, or to define what it declares
for a layer above to provide), and a source file may reopen the public
namespaces (chorus, chorus::detail) to define what the public headers
declare; no file opens the namespace of a layer above it or beside it, and
no header opens the bare chorus namespace (runtime/core/result.hpp, the one
error shape beside the public Error, aside).

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

# A layer's namespace and its CMake target (runtime/include is the public
# namespace, chorus, and not judged).
NAMESPACES = {
    "runtime/core": ("chorus::core", "chorus_core"),
    "io/platform": ("chorus::platform", "chorus_platform"),
    "io/store": ("chorus::store", "chorus_store"),
    "io/sampling": ("chorus::sampling", "chorus_sampling"),
    "io/upload": ("chorus::upload", "chorus_upload"),
    "runtime/client": ("chorus::client", "chorus_client"),
    "actors": ("chorus::actors", "chorus_actors"),
    "cli": ("chorus::cli", "chorus_cli_commands"),
    "python": ("chorus::python", "chorus_python"),
}
PUBLIC_NAMESPACES = ("chorus", "chorus::detail")
# Headers that may open the bare chorus namespace: the error shape every layer speaks.
BARE_CHORUS_HEADERS = ("runtime/core/result.hpp",)

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
    return problems + check_links(root) + check_namespaces(root)


def code_of(text):
    """`text` with comments, string and character literals blanked: the same length, newlines kept."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c == 'R' and text.startswith('R"', i) and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
            m = re.match(r'R"([^(\s]*)\(', text[i:])
            end = text.find(")" + (m.group(1) if m else "") + '"', i)
            j = n if end < 0 else end + len(m.group(1) if m else "") + 2
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c in "\"'":
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            out.append(" " * (min(j + 1, n) - i))
            i = j + 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


NAMESPACE_OPEN = re.compile(r"\b(?:inline\s+)?namespace\s+([A-Za-z_][A-Za-z0-9_:]*)?\s*\{")


def opened_namespaces(text):
    """(line, full name) of every named namespace `text` opens, nested ones by their full name."""
    code = code_of(text)
    stack, depth, found = [], 0, []   # stack: (full name, depth at which it closes)
    i = 0
    opens = {m.end() - 1: m for m in NAMESPACE_OPEN.finditer(code)}
    for i, c in enumerate(code):
        if c == "{":
            m = opens.get(i)
            depth += 1
            if m is not None:
                name = m.group(1) or ""          # anonymous: the enclosing name
                outer = stack[-1][0] if stack else ""
                full = "::".join(x for x in (outer, name) if x)
                if name:
                    found.append((code.count("\n", 0, m.start()) + 1, full))
                stack.append((full, depth))
        elif c == "}":
            if stack and stack[-1][1] == depth:
                stack.pop()
            depth -= 1
    return found


def within(name, ns):
    return name == ns or name.startswith(ns + "::")


def check_namespaces(root):
    """Every namespace a layer's file opens that is not its own, nor one it may reopen."""
    problems = []
    ranks = dict(LAYERS)
    for folder, (own, _) in NAMESPACES.items():
        top = os.path.join(root, folder)
        below = [ns for f, (ns, _) in NAMESPACES.items() if ranks[f] < ranks[folder]]
        for dirpath, _, names in os.walk(top):
            for name in sorted(names):
                if not name.endswith((".cpp", ".hpp", ".h")):
                    continue
                rel = os.path.relpath(os.path.join(dirpath, name), root)
                if layer_of(rel)[0] != folder:
                    continue
                with open(os.path.join(dirpath, name), encoding="utf-8", errors="replace") as f:
                    text = f.read()
                source = name.endswith(".cpp")
                for line, ns in opened_namespaces(text):
                    if not within(ns, "chorus") or within(ns, own) or any(within(ns, b) for b in below):
                        continue
                    if ns in PUBLIC_NAMESPACES and (source or (ns == "chorus" and rel in BARE_CHORUS_HEADERS)):
                        continue
                    if ns in PUBLIC_NAMESPACES:
                        why = "a header of a layer declares in its own namespace"
                    else:
                        owner = next((f for f, (n, _) in NAMESPACES.items() if within(ns, n)), None)
                        why = (f"that is the namespace of {owner}, a layer above or beside it" if owner
                               else "which is the public headers' own" if within(ns, "chorus::detail")
                               else "which belongs to no layer")
                    problems.append(f"{rel}:{line}: {folder} opens namespace {ns}, {why}: "
                                    f"declare it in {own}")
    # Each layer's folder defines its target.
    defined = {}
    for rel, text in cmake_files(root):
        for m in CMAKE_DEFINE.finditer(text):
            defined[m.group(1)] = rel
    for folder, (_, target) in NAMESPACES.items():
        if os.path.isdir(os.path.join(root, folder)) and defined.get(target) != folder and os.path.exists(
                os.path.join(root, folder, "CMakeLists.txt")):
            problems.append(f"{folder}/CMakeLists.txt: does not define {target}, the layer's target")
    return problems


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
        # Namespaces: own and below fine, above caught, a header's bare chorus caught, a source's fine.
        write("io/store/n.hpp", 'namespace chorus::store {\nnamespace chorus_not {}\n}\n'
              'namespace chorus::platform { class AppendFile; }\n'
              'namespace chorus::upload { class Uploader; }\n'          # above: caught
              '// namespace chorus::client { is a comment }\n'
              'namespace chorus { int x; }\n')                          # bare chorus in a header: caught
        write("io/store/n.cpp", 'namespace chorus {\nnamespace store { int y; }\nint f() { return 0; }\n}\n'
              'const char* s = "namespace chorus::cli {";\n')
        write("runtime/core/k.cpp", 'namespace chorus {\nnamespace detail::histogram { int z; }\n}\n'
              'namespace chorus::core::wire { int w; }\n')
        got = check(root)
        expected = ["runtime/core/a.hpp:1", "io/sampling/s.cpp:1", "io/store/c.cpp:1", "cli/x.cpp:2",
                    "io/platform/p.cpp:2", "runtime/core/CMakeLists.txt:2", "io/sampling/CMakeLists.txt:2",
                    "io/store/n.hpp:5", "io/store/n.hpp:7", "runtime/core/k.cpp:2"]
        found = [p.split(": ")[0] for p in got]
        if sorted(found) != sorted(expected):
            print("self-test: expected problems at", sorted(expected), "got:", *got, sep="\n  ")
            return 1
    print("self-test: every wrong include, link and namespace caught, every right one passed")
    return 0


def main(argv):
    if len(argv) > 1 and argv[1] == "--self-test":
        return self_test()
    root = argv[1] if len(argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    problems = check(root)
    for p in problems:
        print(p)
    if problems:
        print(f"{len(problems)} include(s), link(s) or namespace(s) against the layers (docs/ARCHITECTURE.md, \"Layers\")")
        return 1
    print("every include, link and namespace follows the layers")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

#!/usr/bin/env python3
"""What libchorus exports: the public API (<chorus/*.hpp>, CHORUS_API) and
nothing of its internals. Usage: exports.py LIBCHORUS INCLUDE_DIR

Every defined dynamic symbol (nm -D) is demangled and judged:
  - a name of namespace chorus must be declared in a public header: the
    first name after chorus:: (and after detail:: or actors::) appears there
    as a class, struct, function or alias; a layer's namespace (core,
    platform, store, sampling, upload, client: docs/ARCHITECTURE.md,
    "Layers"), and detail but for the few names the headers give it, fails;
  - std:: template code instantiated for public types (and the RTTI of
    std's polymorphic templates, whatever their arguments), the linker's own
    symbols and the four SSL_ calls libchorus interposes are allowed;
  - anything else (CAF, simdjson, libcurl's wrappers, an internal class
    outside any namespace) fails.
Exit 0 and a summary, or 1 and the offending symbols.
"""
import re
import subprocess
import sys
from pathlib import Path

lib, include = sys.argv[1], Path(sys.argv[2])
headers = "\n".join(p.read_text() for p in sorted(include.glob("*.hpp")))
# Names the public headers declare: types, functions, aliases.
declared = set(re.findall(r"\b(?:class|struct|enum class|using)\s+(?:CHORUS_API\s+|\[\[nodiscard\]\]\s+)*([A-Za-z_]\w*)", headers))
declared |= set(re.findall(r"\b([A-Za-z_]\w*)\s*\(", headers))

mangled = [l.split()[-1] for l in subprocess.run(["nm", "-D", "--defined-only", lib], capture_output=True, text=True,
                                                 check=True).stdout.splitlines() if len(l.split()) >= 3]
demangled = subprocess.run(["c++filt"], input="\n".join(mangled), capture_output=True, text=True,
                           check=True).stdout.splitlines()
linker = {"_init", "_fini", "__bss_start", "_edata", "_end"}
prefixes = ("typeinfo for ", "typeinfo name for ", "vtable for ", "VTT for ", "guard variable for ",
            "non-virtual thunk to ", "virtual thunk to ", "construction vtable for ")
# In the mangling, namespace std is "St" where a name begins (and __gnu_cxx
# is spelled out): template code the library instantiated for its own use.
std_code = re.compile(r"_Z(?:T[ISV]|GV|Z)*N?K?(?:St|9__gnu_cxx)")
internal = re.compile(r"chorus::(?:core|platform|store|sampling|upload|client|python|cli)::|caf::|simdjson::")
bad, ok = [], 0
for raw, name in zip(mangled, demangled):
    if name in linker:
        ok += 1
        continue
    if std_code.match(raw):
        # Code for public types only (a std::vector<chorus::Field>...), never
        # for an internal one. The RTTI of std's polymorphic templates (a
        # std::thread's state, a std::future's result) GCC exports whatever
        # their arguments' visibility, unless each is marked by hand: data
        # that no program can call, allowed.
        rtti = raw.startswith(("_ZTI", "_ZTS", "_ZTV"))
        if not rtti and (internal.search(name) or "chorus::detail::" in name):
            bad.append(name)
        else:
            ok += 1
        continue
    core = name
    for p in prefixes:
        if core.startswith(p):
            core = core[len(p):]
            break
    m = re.match(r"chorus::(?:(detail|actors)::)?([A-Za-z_]\w*)", core)
    if not m or internal.match(core) or m.group(2) not in declared:
        bad.append(name)
        continue
    ok += 1

if bad:
    print(f"libchorus exports {len(bad)} symbols outside its public API ({lib}):")
    for b in bad[:60]:
        print("  " + b[:300])
    if len(bad) > 60:
        print(f"  ... and {len(bad) - 60} more")
    print("Build the layers with hidden visibility (chorus_layer in CMakeLists.txt) and mark the public API "
          "CHORUS_API (<chorus/export.hpp>); what a tool needs below the API comes from chorus_internal.")
    sys.exit(1)
print(f"libchorus exports {ok} symbols, each of the public API ({lib})")

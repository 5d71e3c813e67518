#!/usr/bin/env python3
"""libchorus (and the Python module, which holds the same layers) registers
no static destructor but the iostreams' own.
Usage: exit_safe.py LIBRARY...

exit() runs the static destructors while a run's threads go on (a run still
held at the exit: CAF's multiplexer closing links, a drain, a handshake):
what they reach must never be destroyed (runtime/core/immortal.hpp). Every
call to __cxa_atexit in the library's code (objdump -d) is judged by the
destructor it registers, named in the instructions just before it: only
std::ios_base::Init::~Init (each translation unit that includes <iostream>)
passes. Exit 0 and a summary, or 1 and the offenders.
"""
import re
import subprocess
import sys

function = re.compile(r"^[0-9a-f]+ <(.*)>:$")
named = re.compile(r"# [0-9a-f]+ <([^>]*~[^>]*)>")
bad, ok = [], 0
for lib in sys.argv[1:]:
    text = subprocess.run(["objdump", "-d", "-C", "--no-show-raw-insn", lib], capture_output=True, text=True,
                          check=True).stdout
    current, recent = "?", []
    for line in text.splitlines():
        m = function.match(line)
        if m:
            current, recent = m.group(1), []
            continue
        if "call" in line and "<__cxa_atexit@plt>" in line:
            dtor = next((n.group(1) for l in reversed(recent) if (n := named.search(l))), None)
            if dtor is not None and dtor.startswith("std::ios_base::Init::~Init"):
                ok += 1
            else:
                bad.append(f"{lib}: {current}: registers {dtor or 'a destructor it does not name'}")
        recent = (recent + [line])[-8:]
if bad:
    print("static destructors that a run's threads could outlive (make them core::Immortal):")
    print("\n".join("  " + b for b in bad))
    sys.exit(1)
print(f"no static destructor but the iostreams' ({ok} registrations in {len(sys.argv) - 1} files)")

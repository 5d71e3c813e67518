// CHORUS_API marks what libchorus exports: the public API declared in these
// headers. The library is built with hidden visibility (docs/ARCHITECTURE.md,
// "Layers"), so its internals are neither reachable nor in the way of a
// consumer's own symbols; the abi_exports test checks the list.
#pragma once

#define CHORUS_API __attribute__((visibility("default")))

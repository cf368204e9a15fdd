#!/usr/bin/env python3
"""check_deps.py: the compiler and the runtime have no dependency cycles (issue 21).

Two graphs per library, both required to be acyclic:
  - the include graph: a source or header depends on every project header it includes
    (#include "..." resolved as the C preprocessor does: the including file's folder, then the
    library's include directories);
  - the call graph: a .c file depends on the file that defines each external symbol its object
    file uses (nm on the objects CMake built), so a circle of calls between files (A calls B,
    B calls A back through a global accessor) fails here even when the headers are acyclic.
Each is checked file by file and folder by folder (the folder graph is what compiler/README.md
and runtime/README.md lay out). A cycle is printed as the files around it.

usage: check_deps.py ROOT BUILD_DIR
"""
import os
import re
import subprocess
import sys

INCLUDE_RE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)

LIBS = {
    # name: (source folder, include dirs relative to ROOT, object dirs relative to BUILD_DIR)
    'compiler': ('compiler', ['compiler'], ['CMakeFiles/planc_core.dir/compiler']),
    'runtime': ('runtime', ['runtime/include'], ['runtime/CMakeFiles/planrt.dir', 'runtime/CMakeFiles/planrt_cuda.dir']),
}


def sources(root, folder):
    out = []
    for d, _, files in os.walk(os.path.join(root, folder)):
        for f in files:
            if f.endswith(('.c', '.h', '.cu')):
                out.append(os.path.relpath(os.path.join(d, f), root))
    return sorted(out)


def include_graph(root, folder, incdirs):
    files = set(sources(root, folder))
    graph = {f: set() for f in files}
    for f in files:
        text = open(os.path.join(root, f), encoding='utf-8', errors='replace').read()
        for name in INCLUDE_RE.findall(text):
            for base in [os.path.dirname(f)] + incdirs:
                cand = os.path.normpath(os.path.join(base, name))
                if cand in files:
                    graph[f].add(cand)
                    break
    return graph


def nm_symbols(paths):
    """{object: [(type, symbol)]} from one nm run over every object (-A names each line's object;
    one process instead of two per object: most of this test's time was starting nm)"""
    out = subprocess.run(['nm', '-A'] + paths, capture_output=True, text=True, check=True).stdout
    symbols = {p: [] for p in paths}
    for line in out.splitlines():
        path, _, rest = line.partition(':')
        parts = rest.split()
        if path in symbols and len(parts) >= 2:
            symbols[path].append((parts[-2], parts[-1]))
    return symbols


def call_graph(root, build, folder, objdirs):
    objs = []
    for od in objdirs:
        d = os.path.join(build, od)
        for dd, _, files in os.walk(d):
            objs += [os.path.join(dd, f) for f in files if f.endswith('.o')]
    if not objs:
        return None
    sources_of = {}
    for o in objs:
        rel = os.path.relpath(o, build)
        # CMake names objects after the source: .../compiler/graph/graph.c.o, .../planrt.dir/core/log.c.o
        src = None
        m = re.search(r'\.dir/(.*)\.o$', rel)
        if m:
            tail = m.group(1)
            src = tail if tail.startswith(folder + '/') else os.path.join(folder, tail)
        if src and os.path.exists(os.path.join(root, src)):
            sources_of[o] = src
    defined, used = {}, {}
    for o, syms in nm_symbols(sorted(sources_of)).items():
        src = sources_of[o]
        for kind, name in syms:
            if kind in 'TDRBVW' and kind.isupper():
                defined[name] = src
        used[src] = [name for kind, name in syms if kind == 'U']
    graph = {f: set() for f in used}
    for f, syms in used.items():
        for s in syms:
            d = defined.get(s)
            if d and d != f:
                graph[f].add(d)
    return graph


def folder_of(f):
    return os.path.dirname(f)


def folder_graph(graph):
    fg = {}
    for f, deps in graph.items():
        a = folder_of(f)
        fg.setdefault(a, set())
        for d in deps:
            b = folder_of(d)
            if b != a:
                fg[a].add(b)
    return fg


def cycles(graph):
    """Tarjan's strongly connected components of more than one node (or a self loop)."""
    index, low, on, stack, out = {}, {}, set(), [], []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def main():
    root, build = sys.argv[1], sys.argv[2]
    failed = passed = 0
    for lib, (folder, incdirs, objdirs) in LIBS.items():
        checks = [('include graph', include_graph(root, folder, incdirs))]
        cg = call_graph(root, build, folder, objdirs)
        if cg is None:
            print('FAIL %s: no object files under %s (build first)' % (lib, build))
            failed += 1
        else:
            checks.append(('call graph', cg))
        for what, g in checks:
            for level, gg in (('files', g), ('folders', folder_graph(g))):
                cyc = cycles(gg)
                if cyc:
                    failed += 1
                    for c in cyc:
                        print('FAIL %s %s, %s: a cycle through %s' % (lib, what, level, ' <-> '.join(c)))
                        for v in c:
                            print('    %s -> %s' % (v, ', '.join(sorted(set(gg[v]) & set(c)))))
                else:
                    passed += 1
                    print('PASS %s %s, %s (%d nodes)' % (lib, what, level, len(gg)))
    print('arch: %d passed, %d failed' % (passed, failed))
    return 1 if failed else 0


if __name__ == '__main__':
    sys.exit(main())

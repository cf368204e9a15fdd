#!/usr/bin/env python3
# Usage: emit every examples/ plan (emit c, llvm, cuda) with the old and the new planc into BEFORE and
# AFTER (one folder FILE.PLAN.TARGET per emit), then: python3 scripts/check_loop_param_names.py BEFORE AFTER
"""check_names.py BEFORE AFTER: every emitted file is byte-identical but the multi-stage prog.c,
whose shared layers_loopN functions may differ only in their parameters' names: each function's
new names are mapped back to the old (positional) ones by place in the signature, inside that
function only, and then the file must be identical. Also: no new name is an identifier that the
old file uses anywhere (so no parameter shadows a file-level name)."""
import os, re, sys, filecmp
before, after = sys.argv[1:3]
sig = re.compile(r'^static void (layers_loop\d+)\(planrt_ctx_t \*ctx, int nlayers(.*)\)$', re.M)
def params(s):
    return [re.search(r'(\w+)$', p.strip()).group(1) for p in s.split(',') if p.strip()]
same = differ = renamed = 0
bad = []
for root, _, files in os.walk(before):
    for f in files:
        if f.endswith('.err'): continue
        b = os.path.join(root, f); a = b.replace(before, after, 1)
        if filecmp.cmp(b, a, shallow=False):
            same += 1; continue
        differ += 1
        if not a.endswith('/prog.c') or '.c/' not in a:
            bad.append(a + ': differs and is not a C-target prog.c'); continue
        old, new = open(b).read(), open(a).read()
        old_ids = set(re.findall(r'\b[A-Za-z_]\w*\b', re.sub(r'"(\\.|[^"\\])*"|/\*.*?\*/', ' ', old, flags=re.S)))
        out, pos = [], 0
        for m in sig.finditer(new):
            mo = re.search(r'^static void %s\(planrt_ctx_t \*ctx, int nlayers(.*)\)$' % m.group(1), old, re.M)
            pn, po = params(m.group(2)), params(mo.group(1))
            end = new.index('\n}\n', m.start()) + 3
            block = new[m.start():end]
            for n, o in zip(pn, po):
                if n != o:
                    renamed += 1
                    if n in old_ids: bad.append('%s: %s: new name %s is a name the old file uses' % (a, m.group(1), n))
                    block = re.sub(r'\b%s\b' % re.escape(n), o, block)
            out.append(new[pos:m.start()]); out.append(block); pos = end
        out.append(new[pos:])
        if ''.join(out) != old:
            bad.append(a + ': differs in more than parameter names')
print('identical files: %d, differing: %d (parameters renamed: %d)' % (same, differ, renamed))
print('\n'.join(bad) if bad else 'OK: every difference is a shared loop parameter name')
sys.exit(1 if bad else 0)

#!/usr/bin/env python3
"""plans_pass.py: run_build.sh's per-plan bookkeeping, done in one process for all plans.

run_build.sh builds every plan into its own directory ($tmp/pN, with plan, secs, prog.o, link,
kernels.hash). Doing the bookkeeping of each with nm, awk, sha256sum, cat and grep cost about 25
process starts a plan; here it is one nm over all objects and Python for the rest. The checks and
the FAIL lines are run_build.sh's (see its header); each mode writes what the next step reads:
  index TMP    after the builds: each plan's undefined symbols, its normalised link command
               (link.norm), its kind (link command, host state tables, global definitions) and
               linkline; per link command, union_LINE/plans and union_LINE/needs (the symbols the
               plans' objects need, but the launchers kernels.cu defines)
  own TMP      after the nvcc run: what each plan's own files show (PLAN/own: why not), and
               TMP/plans ("kind kernels-hash dir" of each plan that passed them)
  verdict TMP  at the end: one PASS or FAIL line a plan, from the files of the steps before
"""
import hashlib
import os
import re
import subprocess
import sys

LAUNCHER = re.compile(r'^loop[0-9]*_launch$')
HOST_STATE = re.compile(r' [rRdD] [A-Za-z0-9_]*host_state$')


def read(path, default=None):
    try:
        with open(path) as f:
            return f.read()
    except FileNotFoundError:
        return default


def write(path, text):
    with open(path, 'w') as f:
        f.write(text)


def lines_file(path, items):
    write(path, ''.join(i + '\n' for i in items))


def built_plans(tmp):
    """The directories of the plans that built (they have a plan file), in run_build.sh's order."""
    dirs = [os.path.join(tmp, d) for d in os.listdir(tmp) if re.fullmatch(r'p[0-9]+', d)]
    dirs = [d for d in dirs if os.path.isfile(os.path.join(d, 'plan'))]
    return sorted(dirs, key=lambda d: d.encode())


def nm_all(dirs):
    """nm's lines of each plan's prog.o, from one nm run over all of them."""
    objs = [os.path.join(d, 'prog.o') for d in dirs]
    out = subprocess.run(['nm'] + objs, check=True, capture_output=True, text=True).stdout
    by_obj = {o: [] for o in objs}
    current = objs[0] if len(objs) == 1 else None
    for line in out.split('\n'):
        if line.endswith(':') and line[:-1] in by_obj:
            current = line[:-1]
        elif line and current is not None:
            by_obj[current].append(line)
    return [by_obj[o] for o in objs]


def normalise_link(link_text):
    """The link command with its object and output paths made names (PROG_O, KERNELS_O, OUT)."""
    out, prev = [], ''
    for arg in link_text.split('\n')[:-1] if link_text.endswith('\n') else link_text.split('\n'):
        if prev == '-o':
            out.append('OUT'); prev = ''
        elif arg.endswith('/prog.o'):
            out.append('PROG_O'); prev = arg
        elif arg.endswith('/kernels.o'):
            out.append('KERNELS_O'); prev = arg
        else:
            out.append(arg); prev = arg
    return ''.join(a + '\n' for a in out)


def short_hash(text):
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def index(tmp):
    dirs = built_plans(tmp)
    unions = {}
    for d, nm in zip(dirs, nm_all(dirs) if dirs else []):
        fields = [l.split() for l in nm]
        undefined = sorted(f[1] for f in fields if len(f) == 2 and f[0] == 'U')
        lines_file(os.path.join(d, 'undefined'), undefined)
        norm = normalise_link(read(os.path.join(d, 'link')))
        write(os.path.join(d, 'link.norm'), norm)
        host_states = sum(1 for l in nm if HOST_STATE.search(l))
        defined = sorted(f[2] for f in fields if len(f) == 3 and re.fullmatch('[A-Z]', f[1]) and f[1] != 'U')
        write(os.path.join(d, 'kind'), short_hash(norm + '%d\n' % host_states + ''.join(s + '\n' for s in defined)) + '\n')
        line = short_hash(norm)
        write(os.path.join(d, 'linkline'), line + '\n')
        plans, needs = unions.setdefault(line, ([], set()))
        plans.append(d)
        needs.update(s for s in undefined if not LAUNCHER.match(s))
    for line, (plans, needs) in unions.items():
        u = os.path.join(tmp, 'union_' + line)
        os.makedirs(u, exist_ok=True)
        lines_file(os.path.join(u, 'plans'), plans)
        lines_file(os.path.join(u, 'needs'), sorted(needs))


def own(tmp):
    rows = []
    for d in built_plans(tmp):
        s = os.path.join(tmp, 'store', read(os.path.join(d, 'kernels.hash')).strip())
        undefined = read(os.path.join(d, 'undefined')).split()
        why = ''
        if os.path.isfile(os.path.join(s, 'failed')):
            errors = [l for l in read(os.path.join(s, 'nvcc.err'), '').split('\n') if re.search('error|Error', l)]
            why = 'nvcc: ' + ''.join(l + ' ' for l in errors[:3])
        elif not os.path.isfile(os.path.join(s, 'launchers')):
            why = 'no list of the launchers its kernels.cu defines (tests/cuda/kernels_batch.sh)'
        else:
            defined = set(read(os.path.join(s, 'launchers')).split())
            missing = [u for u in undefined if LAUNCHER.match(u) and u not in defined]
            if missing:
                why = 'prog.o calls launchers its kernels.cu does not define: ' + ''.join(m + ' ' for m in missing)
        if 'planrt_cuda_main' not in undefined:
            why += ('; ' if why else '') + 'prog.o does not call planrt_cuda_main'
        if why:
            write(os.path.join(d, 'own'), why + '\n')
        else:
            rows.append('%s %s %s\n' % (read(os.path.join(d, 'kind')).strip(), os.path.basename(s), d))
    write(os.path.join(tmp, 'plans'), ''.join(rows))


def joined(why, more):
    return why + ('; ' if why else '') + more


def verdict(tmp):
    for d in built_plans(tmp):
        f, p = read(os.path.join(d, 'plan')).split()[:2]
        hash_ = read(os.path.join(d, 'kernels.hash')).strip()
        k = os.path.join(tmp, 'kinds', read(os.path.join(d, 'kind')).strip())
        u = os.path.join(tmp, 'union_' + read(os.path.join(d, 'linkline')).strip())
        why = (read(os.path.join(d, 'own'), '')).rstrip('\n')
        if os.path.isfile(os.path.join(u, 'failed')):
            err = read(os.path.join(u, 'err'), '')
            undefined = set(read(os.path.join(d, 'undefined')).split())
            unres = sorted({m for m in re.findall(r"undefined reference to `([^']*)'", err)} & undefined)
            if unres:
                why = joined(why, 'the libraries do not define ' + ''.join(s + ' ' for s in unres))
            elif 'undefined reference' not in err:
                why = joined(why, "the link of every plan's symbols failed: " + ''.join(l + ' ' for l in err.rstrip("\n").split("\n")[-3:]))
        if os.path.isfile(os.path.join(u, 'why')):
            why = joined(why, 'the program of all symbols ' + read(os.path.join(u, 'why')).rstrip('\n'))
        rep = (read(os.path.join(k, 'rep'), '')).rstrip('\n')
        if os.path.isfile(os.path.join(k, 'why')):
            kwhy = read(os.path.join(k, 'why')).rstrip('\n')
            if rep == d:
                why = joined(why, kwhy)
            else:
                why = joined(why, "its kind's program (%s) failed: %s" % (read(os.path.join(rep, 'plan')).rstrip('\n'), kwhy))
        if not rep:
            how = ''
        elif rep == d:
            how = 'linked and started: refuses'
        else:
            how = 'its start and link are the ones of ' + read(os.path.join(rep, 'plan')).rstrip('\n')
        if why:
            print('FAIL: %s %s: %s' % (f, p, why))
        else:
            print('PASS: %s %s (%s s; kernels %s; %s)' % (f, p, read(os.path.join(d, 'secs')).strip(), hash_[:8], how))


if __name__ == '__main__':
    {'index': index, 'own': own, 'verdict': verdict}[sys.argv[1]](sys.argv[2])

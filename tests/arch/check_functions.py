#!/usr/bin/env python3
"""check_functions.py: no function in compiler/, runtime/ or grammar/ is over 150 lines (issue 21).

A function's length is counted from the first line of its declaration (the return type, where it
starts a line of its own) to the line of its closing brace, both included. The scan reads C as a
compiler would rather than by layout, so every style of this codebase counts the same:
  - comments, string and character literals and preprocessor directives (macros with braces,
    `#if` around a signature) are blanked before braces are matched;
  - the opening brace may end the signature's line or stand at column 0 on its own, the closing
    one may share its line with code, a whole function may sit on one line;
  - a `{` at file level opens a function when the declaration before it ends with its parameter
    list (`)`, then attributes or K&R parameter declarations); initialisers (`= {`), struct,
    union and enum bodies are not functions, and `extern "C" {` and `namespace x {` blocks are
    looked into;
  - in grammar/*.y and *.l only the C code is read: `%{ ... %}`, `%top{ }`, `%code ... { }` and
    the code after the second `%%` (bison and flex actions are not functions).

ALLOWED lists the functions still over the limit, each with why; the test fails for any other
function over the limit, and for an allowed one that no longer is (so the list only shrinks).

usage: check_functions.py ROOT [LIMIT]        (LIMIT defaults to 150)
       check_functions.py --list ROOT [MIN]   (every function of MIN lines or more, longest first)
"""
import os
import re
import sys
import tempfile

FOLDERS = ['compiler', 'runtime', 'grammar']
EXTENSIONS = ('.c', '.h', '.cu', '.y', '.l')
LIMIT = 150

# (path, function): why it is still over the limit. Remove an entry when its function is split.
ALLOWED = {
    # empty: every function is within the limit (lower.c's lower_op and lower_shape_op were the
    # last two, split into per-op-kind lowerings). A function that must exceed it goes here with why.
}

IDENT_BEFORE_PAREN = re.compile(r'([A-Za-z_][A-Za-z_0-9]*)\s*$')
# after the parameter list: attributes (GCC) or K&R parameter declarations (`int a; char *b;`)
DECLARATOR_TAIL = re.compile(r'\)\s*((__attribute__\s*\(\(.*?\)\)\s*)|([A-Za-z_][^;(){}=]*;\s*))*$', re.S)
# an unfinished K&R parameter declaration list: a `;` there does not end the declaration
KR_DECLS = re.compile(r'\)\s*([A-Za-z_][^;(){}=]*;\s*)*[A-Za-z_][^;(){}=]*$', re.S)
LOOK_INSIDE = re.compile(r'(\bextern\s*"\s*"|\bnamespace(\s+[A-Za-z_][A-Za-z_0-9:]*)?)\s*$')


def blank_comment(text, out, i):
    """Blanks the /* comment */ starting at text[i] in out (its newlines kept); returns its end."""
    j = text.find('*/', i + 2)
    j = len(text) if j < 0 else j + 2
    for k in range(i, j):
        if text[k] != '\n':
            out[k] = ' '
    return j


def blank(text):
    """text with comments, literals and preprocessor directives replaced by spaces (newlines and
    the quotes of literals kept), so that every brace left is C's."""
    out = list(text)
    i, n = 0, len(text)
    line_start = True
    while i < n:
        c = text[i]
        if c == '\n':
            line_start = True
            i += 1
            continue
        if line_start and c in ' \t':
            i += 1
            continue
        if line_start and c == '#':  # a directive, with its continuation lines
            while i < n and text[i] != '\n':
                if text[i] == '\\' and i + 1 < n and text[i + 1] == '\n':
                    out[i] = ' '
                    i += 2
                    continue
                if text.startswith('/*', i):  # a comment inside a directive may span lines
                    i = blank_comment(text, out, i)
                    continue
                out[i] = ' '
                i += 1
            continue
        line_start = False
        if text.startswith('//', i):
            while i < n and text[i] != '\n':
                out[i] = ' '
                i += 1
        elif text.startswith('/*', i):
            i = blank_comment(text, out, i)
        elif c in '"\'':
            j = i + 1
            while j < n and text[j] != c and text[j] != '\n':
                j += 2 if text[j] == '\\' else 1
            for k in range(i + 1, min(j, n)):
                out[k] = ' '
            i = j + 1
        else:
            i += 1
    return ''.join(out)


def matching_brace(code, at):
    """The index of the '}' closing the '{' at code[at] (code already blanked), or len(code)."""
    depth = 0
    for i in range(at, len(code)):
        if code[i] == '{':
            depth += 1
        elif code[i] == '}':
            depth -= 1
            if depth == 0:
                return i
    return len(code)


def grammar_c_code(text):
    """The C code of a bison or flex file, everything else blanked (line numbers kept)."""
    code = blank(text)
    keep = [False] * len(text)
    lines = text.split('\n')
    starts = [0]
    for line in lines:
        starts.append(starts[-1] + len(line) + 1)
    percents = 0
    in_block = False
    for ln, line in enumerate(lines):
        s = starts[ln]
        if in_block:
            if line.startswith('%}'):
                in_block = False
            else:
                keep[s:s + len(line)] = [True] * len(line)
            continue
        if line.startswith('%{'):
            in_block = True
        elif line.startswith('%%'):
            percents += 1
        elif percents >= 2:
            keep[s:s + len(line)] = [True] * len(line)
        elif percents == 0 and (line.startswith('%code') or line.startswith('%top')):
            open_at = code.find('{', s, starts[ln + 1])
            if open_at >= 0:
                close_at = matching_brace(code, open_at)
                keep[open_at + 1:close_at] = [True] * (close_at - open_at - 1)
    return ''.join(ch if keep[i] or ch == '\n' else ' ' for i, ch in enumerate(text))


def function_name(header):
    """The name declared by a function header (its text before the body's '{')."""
    m = KR_DECLS.search(header) or DECLARATOR_TAIL.search(header)
    return declared_name(header, m.start() if m else header.rfind(')'))


def declared_name(text, close):
    """The name whose parameter list ends at text[close]; in `void (*f(int k))(void)` the name of
    the parenthesised declarator before the list (a function returning a function pointer)."""
    depth = 0
    for i in range(close, -1, -1):
        if text[i] == ')':
            depth += 1
        elif text[i] == '(':
            depth -= 1
            if depth == 0:
                before = text[:i].rstrip()
                if before.endswith(')'):  # (*name(params)): the name's own list is the last inside
                    return declared_name(before[:-1], before[:-1].rfind(')'))
                name = IDENT_BEFORE_PAREN.search(before)
                return name.group(1) if name else '?'
    return '?'


def functions(path):
    """(name, first line, length in lines) of every function defined in path."""
    text = open(path, encoding='utf-8', errors='replace').read()
    if path.endswith(('.y', '.l')):
        text = grammar_c_code(text)
    code = blank(text)
    line_of = []
    ln = 1
    for ch in code:
        line_of.append(ln)
        if ch == '\n':
            ln += 1
    out = []
    header_start = 0  # where the text before the next file-level '{' starts
    i, n = 0, len(code)
    while i < n:
        c = code[i]
        if c == ';' and not KR_DECLS.search(code[header_start:i]):
            header_start = i + 1
        elif c == '}':  # the end of an extern "C" or namespace block looked into
            header_start = i + 1
        elif c == '{':
            header = code[header_start:i]
            stripped = header.strip()
            if LOOK_INSIDE.search(header):
                header_start = i + 1
            elif DECLARATOR_TAIL.search(stripped) and '=' not in re.sub(r'\(.*\)', '', stripped, flags=re.S):
                close = matching_brace(code, i)
                first = header_start + len(header) - len(header.lstrip())
                out.append((function_name(stripped), line_of[first], line_of[min(close, n - 1)] - line_of[first] + 1))
                i = close
                header_start = close + 1
            else:  # an initialiser, a struct, union or enum body
                i = matching_brace(code, i)
                header_start = i + 1
        i += 1
    return out


# The scanner's own cases: (file name, text, the functions it defines as (name, first line, length)).
SELF_TEST = [
    ('styles.c', """/* a comment with { braces } and a signature: int f(void) { */
static int column0(int a)
{
	return a; /* } */
}
static int same_line(int a) {
	const char *s = "}{";
	char c = '}';
	return a + s[0] + c;
}
static int one_line(void) { return 1; }
static PlanSpec *
return_type_above(Program *p,
		  int n)
{
#if defined(X)
	if (n) {
#else
	if (!n) {
#endif
		return 0;
	}
	return p;
} /* trailing */
""", [('column0', 2, 4), ('same_line', 6, 5), ('one_line', 11, 1), ('return_type_above', 12, 13)]),
    ('tables.h', """#define BODY(x) { return (x); }
static const int table[] =
{
	1, 2,
};
typedef struct Row {
	int (*fn)(int);
} Row;
struct Row rows[] = {{0}, {0}};
enum { A, B };
#ifdef __cplusplus
extern "C" {
#endif
static inline int inside_extern(int x)
{
	return x;
}
#ifdef __cplusplus
}
#endif
int kr_style(a, b)
int a;
char *b;
{
	return a;
}
void (*returns_fn_pointer(int k))(void)
{
	return 0;
}
int prototype(int);
int attributed(int) __attribute__((const));
""", [('inside_extern', 14, 4), ('kr_style', 21, 6), ('returns_fn_pointer', 27, 4)]),
    ('grammar.y', """%code requires {
typedef int T;
}
%code {
static int helper(void)
{
	return 0;
}
}
%%
rule
	: A { if (x) { y(); } }
	;
%%
static int epilogue(int a)
{
	return a;
}
""", [('helper', 5, 4), ('epilogue', 15, 4)]),
    ('lexer.l', """%top{
#include <stdio.h>
}
%{
static int in_definitions(void) { return 0; }
%}
%%
.	{
	return 1;
}
%%
int after(void)
{
	return 2;
}
""", [('in_definitions', 5, 1), ('after', 12, 4)]),
]


def self_test(tmp):
    failures = 0
    for name, text, want in SELF_TEST:
        path = os.path.join(tmp, name)
        with open(path, 'w') as f:
            f.write(text)
        got = functions(path)
        if got != want:
            print(f'FAIL: the scanner reads {name} as {got}, not {want}')
            failures += 1
    return failures


def scan(root):
    found = []
    for folder in FOLDERS:
        for d, _, files in os.walk(os.path.join(root, folder)):
            for f in sorted(files):
                if f.endswith(EXTENSIONS):
                    path = os.path.join(d, f)
                    rel = os.path.relpath(path, root)
                    for name, line, length in functions(path):
                        found.append((length, rel, line, name))
    return sorted(found, key=lambda x: (-x[0], x[1], x[2]))


def main(argv):
    if len(argv) >= 2 and argv[0] == '--list':
        least = int(argv[2]) if len(argv) > 2 else 100
        for length, rel, line, name in scan(argv[1]):
            if length >= least:
                print(f'{length:5d} {rel}:{line} {name}')
        return 0
    if len(argv) not in (1, 2):
        print(__doc__.strip().split('\n\n')[-1], file=sys.stderr)
        return 2
    root = argv[0]
    limit = int(argv[1]) if len(argv) == 2 else LIMIT
    with tempfile.TemporaryDirectory() as tmp:
        if self_test(tmp):
            return 1
    found = scan(root)
    if not found:
        print(f'FAIL: no functions found under {", ".join(FOLDERS)} of {root}')
        return 1
    over = {(rel, name): (length, line) for length, rel, line, name in found if length > limit}
    failures = 0
    for (rel, name), (length, line) in sorted(over.items(), key=lambda kv: -kv[1][0]):
        if (rel, name) in ALLOWED:
            print(f'allowed: {rel}:{line} {name} is {length} lines ({ALLOWED[(rel, name)]})')
        else:
            print(f'FAIL: {rel}:{line} {name} is {length} lines, over the limit of {limit}: split it by meaning '
                  f'(a function per case or rule), not into parts')
            failures += 1
    for rel, name in sorted(ALLOWED):
        if (rel, name) not in over:
            print(f'FAIL: {rel} {name} is allowed over the limit but is not (or is gone): remove it from ALLOWED '
                  f'in tests/arch/check_functions.py')
            failures += 1
    print(f'{len(found)} functions, {len(over)} over {limit} lines ({len(over) - failures} allowed), '
          f'{failures} failure{"" if failures == 1 else "s"}')
    return 1 if failures else 0


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))

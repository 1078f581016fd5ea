# Run by agent/src/resolve/python/code/real_interpreters.rs under every CPython on the
# machine: compiles and runs known code, prints one JSON line per code object (address,
# firstlineno, expected name and file name, (position, line) pairs computed by Python in the
# BPF convention, and the same lines from the C API `PyCode_Addr2Line`), then strings and
# non-strings, then `ready`, and waits for stdin to close. Written for Python 3.6 and later.
import sys, os, json, dis, types, binascii
# ASCII only: non-ASCII text is written with escapes, so that no locale can change it.
MINOR = sys.version_info[1]
try:
    import ctypes
    addr2line = ctypes.pythonapi.PyCode_Addr2Line
    addr2line.argtypes = [ctypes.py_object, ctypes.c_int]
    addr2line.restype = ctypes.c_int
except Exception:
    addr2line = None

KEEP = []

def shown(text):
    """The text as Ember reads it: a lone surrogate (valid in a str, not in UTF-8) is U+FFFD."""
    return u"".join(u"\ufffd" if u"\ud800" <= c <= u"\udfff" else c for c in text)

def emit(obj):
    sys.stdout.write(json.dumps(obj) + "\n")

SRC_MAIN = '''
def plain(a, b):
    x = a + b
    y = x * 2

    z = [i for i in range(y)]
    for i in z:
        if i % 3:
            x += i
        else:
            x -= 1
    try:
        q = x // (a - a)
    except ZeroDivisionError:
        q = -1
    finally:
        x += 1
    with open("/dev/null") as f:
        f.read()
    return (x,
            y,
            q)

class Outer:
    def method(self, n):
        total = 0
        while n > 0:
            total += n
            n -= 1
        return total

    class Inner:
        def deep(self):
            return {k: k for k in "ab"}

def outer(k):
    def inner(m):
        def innermost():
            return k + m
        return innermost
    return inner

async def coro(x):
    await x
    return 1

def gen():
    yield 1
    yield 2

lam = lambda v: (v,
                 v + 1)

def wide(v):
    return [''' + "v, " * 400 + ''']

def gap():
    a = 1
''' + "\n" * 300 + '''    b = 2
''' + "\n" * 70000 + '''    c = 3
    return (a,
            b,
            c)
'''

SRC_LATIN = u'''
def gr\u00f6\u00dfe(x):
    return x + 1

class K\u00e4se:
    def m\u00e9thode(self):
        return 2
'''

SRC_UCS2 = u'''
def \u51fd\u6570(y):
    z = y
    return z
'''

SRC_UCS4 = u'''
def \U00020000():
    return 3

def f():
    return 4
'''

SOURCES = [
    (SRC_MAIN, "/tmp/ember test/main.py"),
    (SRC_LATIN, u"/tmp/caf\u00e9/na\u00efve.py"),
    (SRC_UCS2, u"/srv/\u65e5\u672c/\u30b3\u30fc\u30c9.py"),
    (SRC_UCS4, u"/home/\U0001f40d/snake.py"),
    (SRC_UCS2, u"/odd/\udcff-surrogate.py"),
]

def expected_pairs(code):
    n = len(code.co_code)
    pairs = [[-1, code.co_firstlineno]]
    if MINOR <= 9:
        starts = list(dis.findlinestarts(code))
        for off in range(0, n, 2):
            line = None
            for s, l in starts:
                if s <= off:
                    line = l
                else:
                    break
            pairs.append([off, line])
    elif MINOR == 10:
        lines = {}
        for start, end, line in code.co_lines():
            for b in range(start, end, 2):
                lines[b // 2] = line
        for u in range(n // 2):
            pairs.append([u, lines.get(u)])
    else:
        for u, pos in enumerate(code.co_positions()):
            pairs.append([u, pos[0]])
    return pairs

def capi_lines(code, pairs):
    if addr2line is None:
        return None
    out = []
    for pos, _ in pairs:
        b = pos if MINOR <= 9 else pos * 2
        l = addr2line(code, b)
        out.append(None if l < 0 else l)
    return out

def walk(code, seen):
    if id(code) in seen:
        return
    seen.add(id(code))
    KEEP.append(code)
    name = code.co_qualname if MINOR >= 11 else code.co_name
    pairs = expected_pairs(code)
    emit({"kind": "code", "id": id(code), "firstlineno": code.co_firstlineno, "name": shown(name),
          "filename": shown(code.co_filename), "pairs": pairs, "capi": capi_lines(code, pairs)})
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            walk(c, seen)

emit({"kind": "version", "version": list(sys.version_info[:3])})
seen = set()
for src, filename in SOURCES:
    code = compile(src, filename, "exec")
    ns = {}
    exec(code, ns)
    KEEP.append(ns)
    walk(code, seen)

# A module imported from a file, in a directory with a non-ASCII name (hex of its UTF-8 path).
if len(sys.argv) > 1:
    moddir = os.fsdecode(binascii.unhexlify(sys.argv[1]))
    sys.path.insert(0, moddir)
    import pyread_test_module as m
    KEEP.append(m)
    for obj in (m.top, m.Klass.meth, m.Klass.meth2):
        walk(obj.__code__, seen)

# Strings, for read_str directly, and objects that are not strings.
STRS = ["", "a", "plain_ascii", "x" * 4096, u"caf\u00e9", u"\u00ff" * 10, u"\u65e5\u672c\u8a9e",
        u"\U0001f40d snake", u"mix \u00e9 \u0100 \U00010000", u"lone \udcff", u"\u0100" * 4096]
for s in STRS:
    KEEP.append(s)
    emit({"kind": "str", "id": id(s), "value": shown(s)})
TOO_LONG = ["y" * 4097, u"\u00e9" * 5000]
NOT_STR = [b"\x00" * 64, b"\xff" * 64, 12345678901234567890, (1, 2, 3), 1.5]
for o in TOO_LONG:
    KEEP.append(o)
    emit({"kind": "toolong", "id": id(o)})
for o in NOT_STR:
    KEEP.append(o)
    emit({"kind": "notstr", "id": id(o)})

emit({"kind": "ready"})
sys.stdout.flush()
sys.stdin.read()

"""Prints, for code objects of this interpreter, what CPython itself says about their lines, as
lines of "<version> <firstlineno> <linetable hex> <start>:<end>:<line>,..." for
tests/trace/python_lines_test.cc: co_lines() gives byte ranges and their line (None: no line)."""
import sys
import textwrap

SOURCE = textwrap.dedent('''
    def simple(a):
        b = a + 1
        return b * 2

    def jumps(x):
        for i in range(3):
            if i == x:
                break
        else:
            return -1
        return i

    def far():
        y = 1
''' + "\n" * 300 + '''
        return y

    def back(values):
        return [
            v
            for v in values
            if v
        ]
''')

namespace = {}
code = compile(SOURCE, "tables.py", "exec")
exec(code, namespace)
codes = [code] + [namespace[name].__code__ for name in ("simple", "jumps", "far", "back")]
codes += [c for c in namespace["back"].__code__.co_consts if hasattr(c, "co_lines")]
for c in codes:
    ranges = ",".join(f"{start}:{end}:{-1 if line is None else line}"
                      for start, end, line in c.co_lines())
    print(f"{sys.version_info.minor} {c.co_firstlineno} {c.co_linetable.hex()} {ranges}")

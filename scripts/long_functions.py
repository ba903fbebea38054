#!/usr/bin/env python3
"""Lists every function longer than a limit (80 lines by default) in the C++ core and the
Python package, longest first.

A function that stays long on purpose says why on the line above its definition (above its
template line or decorators): ``// long-function: <reason>`` in C++, ``# long-function: <reason>``
in Python. The list prints that reason beside it; ``--check`` exits 1 when a long function has
none, so the rule can run in CI.

C++ is read by brace matching after comments and string literals are blanked, which is enough
for this code base: a brace at namespace or class scope whose header has a parameter list opens
a function body (lambdas and local classes count toward the function around them). Python is
read with ``ast``. Usage: ``python scripts/long_functions.py [--limit N] [--check] [paths...]``
(default paths: csrc graphpipe, relative to the repository root).
"""

from __future__ import annotations

import argparse
import ast
import re
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CXX_SUFFIXES = {".cpp", ".h", ".hpp", ".cc", ".cu", ".cuh"}
REASON = re.compile(r"(?://|#)\s*long-function:\s*(.*\S)")
SCOPE_KEYWORDS = re.compile(r"\s*(?:template\s*<.*>\s*)?(namespace|class|struct|union|enum|extern)\b", re.S)


@dataclass
class LongFunction:
    path: Path
    line: int  # first line of the definition
    name: str
    lines: int
    reason: str | None


def _blank_comments_and_strings(text: str) -> str:
    """The C++ source with comments, string and character literals replaced by spaces (newlines
    kept, so offsets and line numbers stay those of the file)."""
    out = list(text)
    i, n = 0, len(text)

    def blank(a: int, b: int) -> None:
        for k in range(a, min(b, n)):
            if out[k] != "\n":
                out[k] = " "

    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            blank(i, j)
            i = j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            blank(i, j)
            i = j
        elif c == "R" and text.startswith('R"', i) and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
            m = re.match(r'R"([^(\s]*)\(', text[i:])
            if not m:
                i += 1
                continue
            end = text.find(")" + m.group(1) + '"', i)
            j = n if end < 0 else end + len(m.group(1)) + 2
            blank(i + 1, j)
            i = j
        elif c in "\"'":
            if c == "'" and i > 0 and text[i - 1].isalnum():  # digit separator: 1'000'000
                i += 1
                continue
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            blank(i + 1, j)
            i = j + 1
        else:
            i += 1
    # Preprocessor lines (with their continuations) are not part of any header.
    blanked = "".join(out).split("\n")
    continued = False
    for k, line in enumerate(blanked):
        if continued or line.lstrip().startswith("#"):
            continued = line.rstrip().endswith("\\")
            blanked[k] = " " * len(line)
    return "\n".join(blanked)


def _function_name(header: str) -> str:
    """The name in a function header: the qualified identifier before its parameter list."""
    depth = 0
    for k, c in enumerate(header):  # the first '(' outside template brackets
        if c == "<":
            depth += 1
        elif c == ">":
            depth = max(0, depth - 1)
        elif c == "(" and depth == 0:
            m = re.search(r"((?:[A-Za-z_~][\w]*\s*::\s*)*(?:operator\s*\S+?|~?[A-Za-z_]\w*))\s*$", header[:k])
            return re.sub(r"\s+", "", m.group(1)) if m else header[:k].strip().split()[-1]
    return header.strip().split("\n")[0][:40]


def _reason_above(lines: list[str], first: int) -> str | None:
    """The long-function reason in the comment lines directly above line `first` (0-based)."""
    k = first - 1
    while k >= 0 and lines[k].strip().startswith(("//", "#")):
        m = REASON.search(lines[k])
        if m:
            return m.group(1)
        k -= 1
    return None


def cxx_functions(path: Path, limit: int) -> list[LongFunction]:
    text = path.read_text(encoding="utf-8", errors="replace")
    code = _blank_comments_and_strings(text)
    lines = text.split("\n")
    found: list[LongFunction] = []
    # Stack of open braces: "scope" (namespace, class: may hold functions), "init" (a brace in
    # a constructor's member initialiser list), "body" (a function body), "inner" (any brace in
    # a body or in data).
    stack: list[str] = []
    starts: list[tuple[int, str]] = []  # for each "body": (offset of its header, name)
    header_start = 0
    for i, c in enumerate(code):
        if c in ";":
            if not stack or stack[-1] == "scope":
                header_start = i + 1
        elif c == "{":
            if stack and stack[-1] in ("body", "inner"):
                stack.append("inner")
                continue
            header = code[header_start:i]
            if re.search(r"\)[\w\s]*:\s*[^:]", header) and re.search(r"[\w>]\s*$", header):
                stack.append("init")  # the brace of tree_{tree} in ": p_(p), tree_{tree} {"
            elif SCOPE_KEYWORDS.match(header):
                stack.append("scope")
                header_start = i + 1
            elif ")" in header and "=" not in header.split("(")[0]:
                stack.append("body")
                starts.append((header_start, _function_name(header)))
            else:
                stack.append("inner")  # an initialiser, or a lambda held in a variable
        elif c == "}":
            if not stack:
                continue
            kind = stack.pop()
            if kind == "body":
                begin, name = starts.pop()
                # The definition's first line: where the header's code starts.
                while begin < i and code[begin].isspace():
                    begin += 1
                first = code.count("\n", 0, begin)
                last = code.count("\n", 0, i)
                length = last - first + 1
                if length > limit:
                    found.append(LongFunction(path, first + 1, name, length, _reason_above(lines, first)))
            if kind in ("body", "scope") and (not stack or stack[-1] == "scope"):
                header_start = i + 1
    return found


def python_functions(path: Path, limit: int) -> list[LongFunction]:
    text = path.read_text(encoding="utf-8", errors="replace")
    try:
        tree = ast.parse(text, filename=str(path))
    except SyntaxError as error:
        raise SystemExit(f"{path}: cannot parse: {error}") from error
    lines = text.split("\n")
    found: list[LongFunction] = []
    for node in ast.walk(tree):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        first = min([node.lineno] + [d.lineno for d in node.decorator_list])
        length = (node.end_lineno or node.lineno) - node.lineno + 1
        if length > limit:
            found.append(LongFunction(path, node.lineno, node.name, length, _reason_above(lines, first - 1)))
    return found


def scan(paths: list[Path], limit: int) -> list[LongFunction]:
    found: list[LongFunction] = []
    for top in paths:
        files = [top] if top.is_file() else sorted(p for p in top.rglob("*") if p.is_file())
        for f in files:
            if f.suffix in CXX_SUFFIXES:
                found += cxx_functions(f, limit)
            elif f.suffix == ".py":
                found += python_functions(f, limit)
    return sorted(found, key=lambda x: (-x.lines, str(x.path), x.line))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("paths", nargs="*", type=Path, help="files or folders (default: csrc graphpipe)")
    parser.add_argument("--limit", type=int, default=80, help="longest allowed function, in lines (default 80)")
    parser.add_argument("--check", action="store_true", help="exit 1 when a long function gives no reason")
    args = parser.parse_args(argv)
    paths = args.paths or [ROOT / "csrc", ROOT / "graphpipe"]
    found = scan(paths, args.limit)
    unexplained = 0
    for f in found:
        try:
            shown = f.path.resolve().relative_to(ROOT)
        except ValueError:
            shown = f.path
        note = f"  kept: {f.reason}" if f.reason else ""
        unexplained += f.reason is None
        print(f"{f.lines:5d}  {shown}:{f.line}  {f.name}{note}")
    print(f"{len(found)} functions over {args.limit} lines, {len(found) - unexplained} with a reason kept")
    return 1 if args.check and unexplained else 0


if __name__ == "__main__":
    sys.exit(main())

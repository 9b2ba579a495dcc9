"""Split source files into chunks worth embedding.

Code in a supported language (Python, JavaScript, TypeScript/TSX, Go, Rust,
Java) is parsed with the tree-sitter grammar from its PyPI wheel. Each function
and method becomes a chunk (with its leading comments, decorators and
docstring); each class-like type (class, interface, struct, enum, trait)
becomes a *summary* chunk: its header, docstring and the signatures of its
members, not their bodies, so it stays small while the methods get chunks of
their own. Code outside any symbol (imports, module constants, top-level
statements) is covered by line windows.

A node over ``max_tokens`` is split into line windows; every window after the
first repeats the node's signature as context. Other files, and text the
grammar cannot make sense of, fall back to windows of about 40 lines that
prefer to break at blank lines. Binary data (a NUL byte, or not UTF-8) yields
no chunks.

Token counts come from ``count_tokens``; the default is a cheap character
estimate. It is not guaranteed to agree with a real tokenizer: pass the
embedder's tokenizer when every chunk must fit (``benchmarks/chunk_fit.py``
measures how often the estimate is enough).

Thread safety: ``chunk_file`` may be called from several threads. Grammars
(``Language``) are loaded once and shared; each thread lazily creates and then
reuses one ``Parser`` per language, because a tree-sitter parser holds mutable
state and must not parse two files at once.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from embeddings.types import Chunk

TokenCounter = Callable[[str], int]

WINDOW_LINES = 40  # fallback window height
WINDOW_OVERLAP = 5  # lines repeated between consecutive fallback windows
NODE_OVERLAP = 2  # lines repeated between windows of one oversized node
MAX_HEADER_LINES = 3  # signature lines repeated above each later window
MIN_GAP_CHARS = 24  # uncovered code with fewer non-space chars gets no window

_EXTENSIONS = {
    ".py": "python", ".pyi": "python",
    ".js": "javascript", ".jsx": "javascript", ".mjs": "javascript", ".cjs": "javascript",
    ".ts": "typescript", ".mts": "typescript", ".cts": "typescript",
    ".tsx": "tsx",
    ".go": "go",
    ".rs": "rust",
    ".java": "java",
}


def language_for(path: str) -> str | None:
    """The tree-sitter language for ``path`` by extension, or None."""
    dot = path.rfind(".")
    if dot < 0 or "/" in path[dot:]:
        return None
    return _EXTENSIONS.get(path[dot:].lower())


_WORDS = re.compile(r"[A-Za-z]+")
_NUMBERS = re.compile(r"\d+")
_SYMBOLS = re.compile(r"[^\sA-Za-z\d]")


def estimate_tokens(text: str) -> int:
    """Cheap WordPiece estimate: one token per symbol character, a word per 5
    letters, a token per 2 digits, plus 10%.

    Code tokenizes denser than prose (every bracket is a token, identifiers
    split), so ``len/4`` undercounts it badly. Measured against the
    all-MiniLM-L6-v2 tokenizer on real code this errs high for most chunks but
    not all; pass the real tokenizer when every chunk must fit
    (``benchmarks/chunk_fit.py``)."""
    n = len(_SYMBOLS.findall(text))
    n += sum((len(w) + 4) // 5 for w in _WORDS.findall(text))
    n += sum((len(d) + 1) // 2 for d in _NUMBERS.findall(text))
    return (n * 11 + 9) // 10


# --- grammars -----------------------------------------------------------------

@dataclass(frozen=True)
class _Spec:
    functions: frozenset[str]  # chunked as function (or method inside a class/impl)
    classes: frozenset[str]  # chunked as a class summary; qualify members
    method_scopes: frozenset[str] = frozenset()  # qualify members as methods, no chunk (impl)
    namespaces: frozenset[str] = frozenset()  # qualify members, no chunk (mod)
    wrappers: frozenset[str] = frozenset()  # a parent whose range the symbol takes
    signatures: frozenset[str] = frozenset()  # body-less members listed in class summaries


_COMMENTS = frozenset({"comment", "line_comment", "block_comment", "attribute_item"})
_JS_FUNCTIONS = frozenset({"function_declaration", "generator_function_declaration",
                           "method_definition"})
_SPECS: dict[str, _Spec] = {
    "python": _Spec(functions=frozenset({"function_definition"}),
                    classes=frozenset({"class_definition"}),
                    wrappers=frozenset({"decorated_definition"})),
    "javascript": _Spec(functions=_JS_FUNCTIONS, classes=frozenset({"class_declaration"}),
                        wrappers=frozenset({"export_statement"})),
    "typescript": _Spec(
        functions=_JS_FUNCTIONS | {"function_signature"},
        classes=frozenset({"class_declaration", "abstract_class_declaration",
                           "interface_declaration", "enum_declaration"}),
        namespaces=frozenset({"internal_module"}),
        wrappers=frozenset({"export_statement"}),
        signatures=frozenset({"method_signature", "abstract_method_signature",
                              "property_signature"})),
    "go": _Spec(functions=frozenset({"function_declaration", "method_declaration"}),
                classes=frozenset({"type_spec"}), wrappers=frozenset({"type_declaration"})),
    "rust": _Spec(functions=frozenset({"function_item"}),
                  classes=frozenset({"struct_item", "enum_item", "trait_item", "union_item"}),
                  method_scopes=frozenset({"impl_item"}), namespaces=frozenset({"mod_item"}),
                  signatures=frozenset({"function_signature_item"})),
    "java": _Spec(functions=frozenset({"method_declaration", "constructor_declaration"}),
                  classes=frozenset({"class_declaration", "interface_declaration",
                                     "enum_declaration", "record_declaration",
                                     "annotation_type_declaration"})),
}
_SPECS["tsx"] = _SPECS["typescript"]

_languages: dict[str, Any] = {}
_languages_lock = threading.Lock()
_local = threading.local()


def _language(name: str) -> Any:
    with _languages_lock:
        if name not in _languages:
            import tree_sitter

            if name == "python":
                import tree_sitter_python as mod
                raw = mod.language()
            elif name == "javascript":
                import tree_sitter_javascript as mod
                raw = mod.language()
            elif name in ("typescript", "tsx"):
                import tree_sitter_typescript as mod
                raw = mod.language_typescript() if name == "typescript" else mod.language_tsx()
            elif name == "go":
                import tree_sitter_go as mod
                raw = mod.language()
            elif name == "rust":
                import tree_sitter_rust as mod
                raw = mod.language()
            elif name == "java":
                import tree_sitter_java as mod
                raw = mod.language()
            else:
                raise KeyError(name)
            _languages[name] = tree_sitter.Language(raw)
        return _languages[name]


def _parser(name: str) -> Any:
    """One parser per language *per thread*, created on first use and reused.

    A tree-sitter ``Parser`` holds mutable parse state and must not be used by
    two threads at once; ``Language`` objects are immutable and shared."""
    parsers = getattr(_local, "parsers", None)
    if parsers is None:
        parsers = _local.parsers = {}
    if name not in parsers:
        import tree_sitter

        parsers[name] = tree_sitter.Parser(_language(name))
    return parsers[name]


# --- public entry ---------------------------------------------------------------

def chunk_file(path: str, data: bytes, *, max_tokens: int = 256,
               count_tokens: TokenCounter | None = None) -> list[Chunk]:
    """Chunks of one file, sorted by start line (a class summary precedes its
    methods, whose line ranges fall inside the class's).

    ``path`` is workspace-relative and only used for the language and the
    chunks' ``path``. Every chunk's text is within ``max_tokens`` as measured
    by ``count_tokens`` (barring a ``max_tokens`` too small for one character
    plus the repeated signature). Returns [] for binary or non-UTF-8 data."""
    if b"\0" in data:
        return []
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return []
    count = count_tokens or estimate_tokens
    language = language_for(path)
    lines = text.split("\n")  # tree-sitter rows count "\n" only, not splitlines()' set
    if lines and lines[-1] == "":
        lines.pop()
    lines = [ln[:-1] if ln.endswith("\r") else ln for ln in lines]
    if language is None:
        return _windows(path, "text", lines, 0, len(lines), max_tokens, count)
    try:
        return _CodeChunker(path, language, data, lines, max_tokens, count).run()
    except RecursionError:  # pathologically deep nesting: windows are still useful
        return _windows(path, language, lines, 0, len(lines), max_tokens, count)


# --- code ---------------------------------------------------------------------------

class _CodeChunker:
    def __init__(self, path: str, language: str, data: bytes, lines: list[str],
                 max_tokens: int, count: TokenCounter) -> None:
        self.path, self.language, self.data, self.lines = path, language, data, lines
        self.max_tokens, self.count = max_tokens, count
        self.spec = _SPECS[language]
        self.chunks: list[Chunk] = []
        self.covered = bytearray(len(lines) + 1)  # 1 where a symbol chunk covers the row
        self.offsets = [0]  # byte offset of each row's start
        pos = data.find(b"\n")
        while pos >= 0:
            self.offsets.append(pos + 1)
            pos = data.find(b"\n", pos + 1)

    def run(self) -> list[Chunk]:
        tree = _parser(self.language).parse(self.data)
        self._visit_children(tree.root_node, [], in_class=False)
        gaps = self._gap_windows()
        return sorted(self.chunks + gaps, key=lambda c: (c.start_line, c.end_line, c.kind))

    # tree walk
    def _visit_children(self, node: Any, scope: list[str], in_class: bool) -> None:
        for child in node.named_children:
            self._visit(child, scope, in_class)

    def _visit(self, node: Any, scope: list[str], in_class: bool) -> None:
        spec, kind = self.spec, node.type
        if kind in spec.functions:
            self._function(node, scope, in_class)
        elif kind in spec.classes:
            name = self._name(node)
            self._class(node, scope, name)
            body = node.child_by_field_name("body")
            if body is not None:
                self._visit_children(body, [*scope, name], in_class=True)
        elif kind in spec.method_scopes:
            body = node.child_by_field_name("body")
            if body is not None:
                self._visit_children(body, [*scope, self._impl_name(node)], in_class=True)
        elif kind in spec.namespaces:
            body = node.child_by_field_name("body")
            if body is not None:
                self._visit_children(body, [*scope, self._name(node)], in_class=False)
        elif kind in ("lexical_declaration", "variable_declaration") and \
                self.language in ("javascript", "typescript", "tsx"):
            self._arrow(node, scope)
        elif kind in ("export_statement", "type_declaration", "decorated_definition",
                      "ERROR", "declaration_list", "class_body", "enum_body_declarations"):
            self._visit_children(node, scope, in_class)

    def _arrow(self, node: Any, scope: list[str]) -> None:
        """``const f = (...) => {...}`` / ``= function (...) {...}`` as a function."""
        declarators = [c for c in node.named_children if c.type == "variable_declarator"]
        if len(declarators) != 1:
            return
        value = declarators[0].child_by_field_name("value")
        if value is None or value.type not in ("arrow_function", "function_expression",
                                                "function"):
            return
        name = self._text(declarators[0].child_by_field_name("name")) or "<anonymous>"
        self._emit_symbol(node, value, "function", ".".join([*scope, name]))

    def _function(self, node: Any, scope: list[str], in_class: bool) -> None:
        name = self._name(node)
        kind = "method" if in_class else "function"
        if node.type == "method_declaration" and self.language == "go":
            receiver = node.child_by_field_name("receiver")
            owner = self._go_receiver(receiver) if receiver is not None else ""
            scope, kind = ([*scope, owner] if owner else scope), "method"
        self._emit_symbol(node, node, kind, ".".join([*scope, name]))

    def _class(self, node: Any, scope: list[str], name: str) -> None:
        symbol = ".".join([*scope, name])
        outer = self._outer(node)
        start = self._leading_start(outer)
        body = node.child_by_field_name("body")
        if body is None or not any(c.type in self.spec.functions or c.type in self.spec.wrappers
                                   for c in body.named_children):
            # no methods inside (a struct, an enum): the whole text is its summary
            self._emit_symbol(node, node, "class", symbol)
            return
        header = self.data[self.offsets[start]:body.start_byte].decode(errors="replace").rstrip()
        header += " {" if not header.endswith(("{", ":")) and self.language != "python" else ""
        # each summary line keeps the source row it came from, so a split summary's pieces
        # report the lines they describe rather than the whole class
        rows = [(ln, start + i) for i, ln in enumerate(header.split("\n"))]
        for i, member in enumerate(body.named_children):
            row = member.start_point.row
            rows += [(ln, row + j) for part in self._member_summary(member, first=(i == 0))
                     for j, ln in enumerate(part.split("\n"))]
        end = node.end_point.row
        if self.language != "python":
            rows.append((self._indent(node.start_point.row) + "}", end))
        text = "\n".join(ln for ln, _ in rows)
        self._mark(start, end)
        self._emit_text("class", symbol, text, start, end, self._signature(node, node),
                        rows=[r for _, r in rows])

    def _member_summary(self, member: Any, first: bool) -> list[str]:
        indent = self._indent(member.start_point.row)
        target = member
        if member.type in self.spec.wrappers:
            inner = [c for c in member.named_children
                     if c.type in self.spec.functions or c.type in self.spec.classes]
            target = inner[0] if inner else member
        if member.type in _COMMENTS:
            return []
        if self.language == "python" and first and member.type == "expression_statement" \
                and member.named_children and member.named_children[0].type == "string":
            return [indent + self._text(member)]  # the class docstring, whole
        if target.type in self.spec.functions or target.type in self.spec.classes:
            start = member.start_byte if member.type in self.spec.wrappers else target.start_byte
            body = target.child_by_field_name("body")
            end = body.start_byte if body is not None else target.end_byte
            sig = self.data[start:end].decode().rstrip()
            if self.language == "python" and sig.endswith(":"):
                sig += " ..."
            elif body is not None and self.language != "python":
                sig += " { ... }"
            return [indent + sig]
        first_line = self._text(member).split("\n", 1)[0]
        return [indent + (first_line[:160] + " ..." if len(first_line) > 160 else first_line)]

    # emitting
    def _emit_symbol(self, node: Any, decl: Any, kind: str, symbol: str) -> None:
        outer = self._outer(node)
        start = self._leading_start(outer)
        end = outer.end_point.row
        if outer.end_point.column == 0 and end > start:
            end -= 1
        self._mark(start, end)
        text = "\n".join(self.lines[start:end + 1])
        self._emit_text(kind, symbol, text, start, end, self._signature(node, decl))

    def _emit_text(self, kind: str, symbol: str, text: str, start: int, end: int,
                   signature: str, rows: list[int] | None = None) -> None:
        """One chunk for rows start..end, or windows when too big. ``rows``: the source
        row of each line of ``text`` (a class summary); default: the text is verbatim."""
        if self.count(text) <= self.max_tokens:
            self.chunks.append(Chunk(self.path, start + 1, end + 1, kind, symbol,
                                     self.language, text))
            return
        # too big: windows over its lines; the first starts with the signature anyway
        lines = text.split("\n")
        if rows is None or len(rows) != len(lines):
            rows = [start + i for i in range(len(lines))]
        header = _cap_header(signature, self.max_tokens // 4, self.count)
        for piece in _split(list(zip(lines, rows)), self.max_tokens, self.count, header, NODE_OVERLAP,
                            max_lines=None):
            self.chunks.append(Chunk(self.path, piece.start + 1, piece.end + 1, kind, symbol,
                                     self.language, piece.text))

    def _gap_windows(self) -> list[Chunk]:
        out: list[Chunk] = []
        row, n = 0, len(self.lines)
        while row < n:
            if self.covered[row]:
                row += 1
                continue
            end = row
            while end < n and not self.covered[end]:
                end += 1
            body = "".join(self.lines[row:end])
            if sum(not ch.isspace() for ch in body) >= MIN_GAP_CHARS:
                out.extend(_windows(self.path, self.language, self.lines, row, end,
                                    self.max_tokens, self.count))
            row = end
        return out

    # helpers
    def _outer(self, node: Any) -> Any:
        parent = node.parent
        while parent is not None and parent.type in self.spec.wrappers and \
                sum(1 for c in parent.named_children if c.type == node.type) == 1:
            node, parent = parent, parent.parent
        return node

    def _leading_start(self, node: Any) -> int:
        """First row of ``node`` including adjacent comments/attributes above it."""
        start = node.start_point.row
        prev = node.prev_named_sibling
        while prev is not None and prev.type in _COMMENTS and prev.end_point.row >= start - 1 \
                and not self.lines[prev.start_point.row][:prev.start_point.column].strip():
            start = prev.start_point.row
            prev = prev.prev_named_sibling
        return start

    def _signature(self, node: Any, decl: Any) -> str:
        """``node``'s text up to ``decl``'s body, at most MAX_HEADER_LINES lines."""
        body = decl.child_by_field_name("body")
        end = body.start_byte if body is not None else decl.end_byte
        sig = self.data[node.start_byte:end].decode(errors="replace").rstrip()
        return "\n".join(sig.split("\n")[:MAX_HEADER_LINES])

    def _name(self, node: Any) -> str:
        return self._text(node.child_by_field_name("name")) or "<anonymous>"

    def _impl_name(self, node: Any) -> str:
        typ = node.child_by_field_name("type")
        while typ is not None and typ.type == "generic_type":
            typ = typ.child_by_field_name("type")
        return self._text(typ) or "<impl>"

    def _go_receiver(self, receiver: Any) -> str:
        stack = [receiver]
        while stack:
            n = stack.pop(0)
            if n.type == "type_identifier":
                return self._text(n)
            stack.extend(n.named_children)
        return ""

    def _text(self, node: Any) -> str:
        if node is None:
            return ""
        return self.data[node.start_byte:node.end_byte].decode(errors="replace")

    def _indent(self, row: int) -> str:
        line = self.lines[row] if row < len(self.lines) else ""
        return line[:len(line) - len(line.lstrip())]

    def _mark(self, start: int, end: int) -> None:
        for r in range(start, min(end, len(self.lines) - 1) + 1):
            self.covered[r] = 1


# --- windows --------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class _Piece:
    start: int  # 0-based rows, inclusive
    end: int
    text: str


def _windows(path: str, language: str, lines: list[str], start: int, end: int,
             max_tokens: int, count: TokenCounter) -> list[Chunk]:
    """Fallback windows over rows [start, end) that contain anything."""
    while start < end and not lines[start].strip():
        start += 1
    while end > start and not lines[end - 1].strip():
        end -= 1
    spans = [(lines[r], r) for r in range(start, end)]
    pieces = _split(spans, max_tokens, count, "", WINDOW_OVERLAP, max_lines=WINDOW_LINES)
    return [Chunk(path, p.start + 1, p.end + 1, "window", "", language, p.text)
            for p in pieces if p.text.strip()]


def _cap_header(signature: str, budget: int, count: TokenCounter) -> str:
    header = signature
    while header and count(header) > budget:
        cut = header.rfind("\n")
        header = header[:cut] if cut > 0 else header[: max(0, len(header) * 2 // 3)]
    return header


def _split(spans: list[tuple[str, int]], max_tokens: int, count: TokenCounter, header: str,
           overlap: int, max_lines: int | None) -> Iterator[_Piece]:
    """Greedy windows of (line, row) spans, each within ``max_tokens`` with the
    header in front of every window but the first; prefers to end a window at a
    blank line in its second half."""
    base = count("")
    header_cost = (count(header + "\n") - base) if header else 0
    # long lines (minified code, data) are cut into pieces that fit alone
    items: list[tuple[str, int, int]] = []  # (text, row, cost)
    budget = max(8, max_tokens - header_cost - base)
    for text, row in spans:
        cost = count(text + "\n") - base
        if cost <= budget:
            items.append((text, row, cost))
            continue
        rest = text
        while rest:
            size = max(1, int(len(rest) * budget / max(1, count(rest) - base) * 0.9))
            part = rest[:size]
            while len(part) > 1 and count(part + "\n") - base > budget:
                part = part[: len(part) * 3 // 4]
            items.append((part, row, count(part + "\n") - base))
            rest = rest[len(part):]
    i, n, first = 0, len(items), True
    while i < n:
        room = max_tokens - base - (0 if first else header_cost)
        j, used = i, 0
        while j < n and (max_lines is None or j - i < max_lines):
            if used + items[j][2] > room and j > i:
                break
            used += items[j][2]
            j += 1
        resume = None  # where the next window starts; None: overlap
        if j < n:  # break at a blank line in the second half, when there is one
            for k in range(j, i + (j - i) // 2, -1):
                if not items[k][0].strip():
                    j, resume = k, k + 1  # a clean break: no overlap needed
                    break
        while True:
            body = "\n".join(t for t, _, _ in items[i:j])
            text = body if first or not header else header + "\n" + body
            if count(text) <= max_tokens or j - i <= 1:
                break
            j -= 1  # the per-line sum undercounted (tokenizer merges across lines)
        if resume is not None and j < (resume - 1):
            resume = None  # shrunk below the blank line: fall back to overlap
        yield _Piece(items[i][1], items[j - 1][1], text)
        first = False
        if j >= n:
            break
        i = resume if resume is not None else max(i + 1, j - min(overlap, (j - i) // 4))
        while i < n and not items[i][0].strip():
            i += 1

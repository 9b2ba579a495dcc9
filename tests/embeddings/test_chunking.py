"""Chunking: symbols per language, oversized nodes, fallback windows, binaries."""

from __future__ import annotations

import re

import textwrap

import pytest

from embeddings.chunking import chunk_file, estimate_tokens, language_for
from embeddings.types import Chunk


def _src(text: str) -> bytes:
    return textwrap.dedent(text).lstrip("\n").encode()


def _by_symbol(chunks: list[Chunk]) -> dict[str, Chunk]:
    return {c.symbol: c for c in chunks if c.symbol}


def _check(chunk: Chunk, kind: str, lines: tuple[int, int], *needles: str) -> None:
    assert chunk.kind == kind
    assert (chunk.start_line, chunk.end_line) == lines
    for needle in needles:
        assert needle in chunk.text, (needle, chunk.text)


@pytest.mark.parametrize(("path", "language"), [
    ("a/b.py", "python"), ("x.js", "javascript"), ("x.jsx", "javascript"),
    ("x.mjs", "javascript"), ("x.cjs", "javascript"), ("x.ts", "typescript"),
    ("x.tsx", "tsx"), ("x.go", "go"), ("x.rs", "rust"), ("X.java", "java"),
    ("README.md", None), ("Makefile", None), ("dir.py/file", None),
])
def test_language_for(path: str, language: str | None) -> None:
    assert language_for(path) == language


PYTHON = _src('''
    """Module doc."""
    import os
    import sys

    # Adds two numbers, used everywhere.
    @cache
    def add(a: int, b: int = 1) -> int:
        """Return a + b."""
        return a + b


    class Account(Base):
        """A bank account."""

        rate = 0.5

        def deposit(self, amount: int) -> None:
            """Put money in."""
            self.balance += amount

        @property
        def empty(self) -> bool:
            return self.balance == 0
''')


def test_python_symbols() -> None:
    chunks = chunk_file("bank.py", PYTHON)
    sym = _by_symbol(chunks)
    _check(sym["add"], "function", (5, 9), "# Adds two numbers", "@cache",
           "def add(a: int, b: int = 1) -> int:", '"""Return a + b."""')
    _check(sym["Account"], "class", (12, 23), "class Account(Base):", '"""A bank account."""',
           "rate = 0.5", "def deposit(self, amount: int) -> None:", "def empty(self) -> bool:")
    assert "self.balance += amount" not in sym["Account"].text  # signatures, not bodies
    _check(sym["Account.deposit"], "method", (17, 19), "def deposit", '"""Put money in."""')
    _check(sym["Account.empty"], "method", (21, 23), "@property", "def empty")
    windows = [c for c in chunks if c.kind == "window"]
    assert [(w.start_line, w.end_line) for w in windows] == [(1, 3)]
    assert all(c.language == "python" and c.path == "bank.py" for c in chunks)


def test_javascript_symbols() -> None:
    src = _src('''
        import { x } from "./x.js";

        /** Adds two numbers. */
        export function add(a, b) {
          return a + b;
        }

        // Doubles n.
        export const twice = (n) => n * 2;

        export class Counter extends Base {
          count = 0;
          /** Increment by `by`. */
          inc(by) {
            this.count += by;
          }
        }
    ''')
    sym = _by_symbol(chunk_file("lib/count.js", src))
    _check(sym["add"], "function", (3, 6), "/** Adds two numbers. */", "export function add(a, b)")
    _check(sym["twice"], "function", (8, 9), "// Doubles n.", "const twice = (n) =>")
    _check(sym["Counter"], "class", (11, 17), "class Counter extends Base", "inc(by)")
    assert "this.count += by" not in sym["Counter"].text
    _check(sym["Counter.inc"], "method", (13, 16), "/** Increment by `by`. */", "inc(by) {")


def test_typescript_symbols() -> None:
    src = _src('''
        /** Anything with an area. */
        export interface Shape {
          area(): number;
        }

        export class Circle implements Shape {
          constructor(private r: number) {}
          /** The area. */
          area(): number {
            return Math.PI * this.r ** 2;
          }
        }

        export function unit<T>(x: T): Circle {
          return new Circle(1);
        }
    ''')
    sym = _by_symbol(chunk_file("shape.ts", src))
    _check(sym["Shape"], "class", (1, 4), "/** Anything with an area. */", "area(): number;")
    _check(sym["Circle"], "class", (6, 12), "class Circle implements Shape", "area(): number")
    _check(sym["Circle.area"], "method", (8, 11), "/** The area. */", "area(): number {")
    _check(sym["Circle.constructor"], "method", (7, 7), "constructor(private r: number)")
    _check(sym["unit"], "function", (14, 16), "function unit<T>(x: T): Circle")
    tsx = _src('''
        // The app.
        export function App(props: Props): JSX.Element {
          return <div className="x">{props.name}</div>;
        }
    ''')
    (app,) = chunk_file("App.tsx", tsx)
    _check(app, "function", (1, 4), "// The app.", "<div className")
    assert app.symbol == "App" and app.language == "tsx"


def test_go_symbols() -> None:
    src = _src('''
        package shapes

        import "math"

        // Circle is round.
        type Circle struct {
        	R float64
        }

        // Area returns the area.
        func (c *Circle) Area() float64 {
        	return math.Pi * c.R * c.R
        }

        // New makes a circle.
        func New(r float64) *Circle {
        	return &Circle{R: r}
        }
    ''')
    sym = _by_symbol(chunk_file("shapes/circle.go", src))
    _check(sym["Circle"], "class", (5, 8), "// Circle is round.", "R float64")
    _check(sym["Circle.Area"], "method", (10, 13), "// Area returns the area.",
           "func (c *Circle) Area() float64")
    _check(sym["New"], "function", (15, 18), "// New makes a circle.", "func New(r float64)")


def test_rust_symbols() -> None:
    src = _src('''
        use std::fmt;

        /// A point on the plane.
        #[derive(Debug)]
        pub struct Point {
            x: i32,
        }

        impl<T> Point {
            /// Make one.
            pub fn new(x: i32) -> Self {
                Point { x }
            }
        }

        pub trait Shape {
            fn area(&self) -> f64;
            fn name(&self) -> String { String::from("shape") }
        }

        /// Adds one.
        fn helper(a: i32) -> i32 {
            a + 1
        }
    ''')
    sym = _by_symbol(chunk_file("src/point.rs", src))
    _check(sym["Point"], "class", (3, 7), "/// A point on the plane.", "#[derive(Debug)]", "x: i32")
    _check(sym["Point.new"], "method", (10, 13), "/// Make one.", "pub fn new(x: i32) -> Self")
    _check(sym["Shape"], "class", (16, 19), "pub trait Shape", "fn area(&self) -> f64;",
           "fn name(&self) -> String")
    _check(sym["Shape.name"], "method", (18, 18), 'String::from("shape")')
    _check(sym["helper"], "function", (21, 24), "/// Adds one.", "fn helper(a: i32) -> i32")


def test_java_symbols() -> None:
    src = _src('''
        package bank;

        import java.util.List;

        /** A bank account. */
        public class Account {
            private long balance;

            /** Opens an account. */
            public Account(long start) {
                this.balance = start;
            }

            /** Deposits money. */
            @Override
            public void deposit(long amount) {
                balance += amount;
            }
        }
    ''')
    sym = _by_symbol(chunk_file("src/bank/Account.java", src))
    _check(sym["Account"], "class", (5, 19), "/** A bank account. */", "public class Account",
           "private long balance;", "public void deposit(long amount)")
    assert "balance += amount" not in sym["Account"].text
    _check(sym["Account.Account"], "method", (9, 12), "/** Opens an account. */")
    _check(sym["Account.deposit"], "method", (14, 18), "/** Deposits money. */", "@Override",
           "public void deposit(long amount) {")


def test_oversized_function_is_windowed_with_its_signature() -> None:
    body = "".join(f"    total = total + compute_value_{i}(item, factor={i})\n"
                   for i in range(200))
    src = f"def accumulate(items, factor):\n    total = 0\n{body}    return total\n".encode()
    chunks = chunk_file("big.py", src, max_tokens=128)
    assert len(chunks) > 3
    assert all(c.symbol == "accumulate" and c.kind == "function" for c in chunks)
    assert all(estimate_tokens(c.text) <= 128 for c in chunks)
    assert all(c.text.startswith("def accumulate(items, factor):") for c in chunks)
    assert chunks[0].start_line == 1 and chunks[-1].end_line == 203
    covered = set()
    for c in chunks:
        covered.update(range(c.start_line, c.end_line + 1))
    assert covered == set(range(1, 204))


def test_custom_token_counter_is_respected() -> None:
    words = lambda s: len(s.split())  # noqa: E731 - a stand-in tokenizer
    src = ("def f(a):\n" + "".join(f"    x{i} = a + {i}\n" for i in range(100))).encode()
    chunks = chunk_file("f.py", src, max_tokens=40, count_tokens=words)
    assert len(chunks) > 5 and all(words(c.text) <= 40 for c in chunks)


def test_long_single_line_is_cut() -> None:
    src = ("var data = [" + ",".join(str(i) for i in range(5000)) + "];\n").encode()
    chunks = chunk_file("data.js", src, max_tokens=64)
    assert len(chunks) > 10
    assert all(estimate_tokens(c.text) <= 64 for c in chunks)
    assert all((c.start_line, c.end_line) == (1, 1) for c in chunks)


@pytest.mark.parametrize("name", ["notes.md", "notes.txt"])
def test_text_files_fall_back_to_windows(name: str) -> None:
    paragraphs = [f"Paragraph {p}.\n" + "".join(f"line {p}.{i} of prose\n" for i in range(7))
                  for p in range(20)]
    src = "\n".join(paragraphs).encode()
    chunks = chunk_file(name, src)
    assert len(chunks) >= 4
    assert all(c.kind == "window" and c.language == "text" and c.symbol == "" for c in chunks)
    assert all(c.end_line - c.start_line < 40 for c in chunks)
    assert chunks[0].start_line == 1 and chunks[-1].end_line == src.count(b"\n")
    lines = src.decode().split("\n")
    for a, b in zip(chunks, chunks[1:]):
        assert b.start_line > a.start_line
        skipped = lines[a.end_line:b.start_line - 1]  # rows between windows: blank only
        assert all(not line.strip() for line in skipped)
    # windows break at paragraph boundaries when they can
    assert all(lines[c.end_line].strip() == "" for c in chunks[:-1])


@pytest.mark.parametrize("data", [b"\x89PNG\r\n\x1a\n\0\0\0IHDR", b"caf\xe9 not utf-8\n",
                                  b"def f():\n    return 1\n\0"])
def test_binary_data_yields_nothing(data: bytes) -> None:
    assert chunk_file("image.py", data) == []


def test_empty_file() -> None:
    assert chunk_file("empty.py", b"") == []


@pytest.mark.parametrize(("path", "src"), [
    ("broken.py", b"def good(a):\n    return a\n\ndef bad(:\n    pass pass )))\n\n"
                  b"def also_good(b):\n    return b * 2\n"),
    ("broken.js", b"function ok() { return 1; }\nfunction (((( {\nlet = ;\n"),
    ("broken.go", b"package x\nfunc Ok() int { return 1 }\nfunc {{{ broken\n"),
])
def test_invalid_syntax_still_yields_chunks(path: str, src: bytes) -> None:
    chunks = chunk_file(path, src)
    assert chunks
    covered = {line for c in chunks for line in range(c.start_line, c.end_line + 1)}
    assert 1 in covered or 2 in covered
    text = "\n".join(c.text for c in chunks)
    assert "return 1" in text or "return a" in text


def test_crlf_line_ranges() -> None:
    src = b"import os\r\n\r\ndef f(x):\r\n    return x\r\n"
    (fn,) = [c for c in chunk_file("w.py", src) if c.symbol == "f"]
    assert (fn.start_line, fn.end_line) == (3, 4)


def test_deterministic() -> None:
    assert chunk_file("bank.py", PYTHON) == chunk_file("bank.py", PYTHON)


def test_oversized_class_summary_pieces_give_the_lines_they_list() -> None:
    methods = "".join(f"    def method_number_{i}(self, alpha, beta, gamma):\n        return {i}\n\n"
                      for i in range(60))
    src = f"class Big:\n    \"\"\"Many methods.\"\"\"\n\n{methods}".encode()
    chunks = chunk_file("big.py", src, max_tokens=128)
    summaries = [c for c in chunks if c.kind == "class"]
    assert len(summaries) > 1
    end = src.decode().rstrip("\n").count("\n") + 1
    lines = src.decode().split("\n")
    assert summaries[0].start_line == 1 and all(1 <= c.start_line <= c.end_line <= end for c in summaries)
    assert [c.start_line for c in summaries] == sorted(c.start_line for c in summaries)
    for c in summaries:  # every method listed in a piece is defined inside that piece's range
        for name in re.findall(r"def (method_number_\d+)", c.text):
            row = next(i for i, ln in enumerate(lines, 1) if f"def {name}(" in ln)
            assert c.start_line <= row <= c.end_line, (name, row, c.start_line, c.end_line)
    assert len({(c.start_line, c.end_line) for c in summaries}) == len(summaries)
    assert all(c.text.startswith("class Big:") for c in summaries)
    assert all(estimate_tokens(c.text) <= 128 for c in summaries)
    assert len([c for c in chunks if c.kind == "method"]) == 60


def test_parsers_are_safe_across_threads() -> None:
    from concurrent.futures import ThreadPoolExecutor

    expected = chunk_file("bank.py", PYTHON)
    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda _: chunk_file("bank.py", PYTHON), range(64)))
    assert all(r == expected for r in results)

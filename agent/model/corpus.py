"""The pretraining corpus: real Python code available offline, plus tool-call transcripts.

Sources:

* ``stdlib`` — every ``.py`` under ``sysconfig.get_paths()["stdlib"]`` (its
  own ``site-packages`` excluded);
* ``site-packages`` — every ``.py`` of the installed packages (``purelib`` and
  ``platlib`` of the running interpreter);
* ``transcripts`` — conversations rendered with the production template
  (``agent.prompt.render_prompt``), whose assistant turns call the real tools
  in the real wire format (``agent.parser.encode_call``) and whose tool turns
  are rendered by ``agent.calls.render_results``, with the prompt profile
  the checkpoint will be served with (``Corpus.prompt_profile``, a name in
  ``agent.prompt.PROFILES``). The tool outputs imitate the
  tools' formats (``read_file`` output is produced by the tool's own renderer);
  they are synthetic, not recorded runs: the point is that the model sees the
  format, not that the stories are true.

Order and split are deterministic and independent of the machine's file-system
order: documents are ordered by a hash of their key (``source/relative/path``),
a pseudo-random but fixed interleaving, so the size cap takes a uniform sample
of both code sources; a document is in the validation split when its key's
hash says so (``val_fraction``), so adding files never moves an existing file
between splits. Files larger than ``max_file_bytes`` (generated tables, vendored
blobs) and files that are not UTF-8 are skipped. Nothing is read until it is
iterated: memory holds one document at a time.

Not guaranteed: the same corpus on another machine — it is whatever Python and
packages are installed (``code_roots(("stdlib",))`` leaves the packages out, so only
the Python version matters); ``Corpus.fingerprint`` tells two corpora apart.
"""

from __future__ import annotations

import difflib
import hashlib
import os
import random
import re
import sysconfig
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

SOURCES = ("stdlib", "site-packages", "transcripts")
TRANSCRIPT_BYTES = 8000  # a rendered transcript's typical size (the system prompt alone is ~6 KB)
TRANSCRIPT_SHARE = 0.2  # at most this fraction of the size cap goes to transcripts


@dataclass(frozen=True, slots=True)
class Document:
    key: str  # "stdlib/json/decoder.py", "site-packages/numpy/linalg/_linalg.py", "transcripts/00042"
    size: int  # bytes on disk (an estimate for transcripts)
    path: Path | None = None  # None for transcripts


def _hash(key: str) -> int:
    return int.from_bytes(hashlib.sha1(key.encode()).digest()[:8], "big")


CODE_SOURCES = ("stdlib", "site-packages")


def code_roots(sources: Sequence[str] = CODE_SOURCES) -> list[tuple[str, Path]]:
    """The code directories of ``sources`` (a subset of :data:`CODE_SOURCES`). ``("stdlib",)`` alone
    makes the corpus a function of the Python version only: the installed packages, and so the
    corpus under ``("stdlib", "site-packages")``, change with every environment's package versions."""
    unknown = sorted(set(sources) - set(CODE_SOURCES))
    if unknown or not sources:
        raise ValueError(f"corpus sources {', '.join(unknown) or '(none)'}: choose from {', '.join(CODE_SOURCES)}")
    paths = sysconfig.get_paths()
    roots = [("stdlib", Path(paths["stdlib"]))] if "stdlib" in sources else []
    stdlib = Path(paths["stdlib"])
    for name in ("purelib", "platlib"):
        p = Path(paths[name])
        if "site-packages" in sources and p != stdlib and all(p != r for _, r in roots):
            roots.append(("site-packages", p))
    return roots


def list_code_files(roots: list[tuple[str, Path]], max_file_bytes: int) -> list[Document]:
    docs: dict[str, Document] = {}
    for source, root in roots:
        for dirpath, dirnames, filenames in os.walk(root):
            rel_dir = Path(dirpath).relative_to(root)
            # the stdlib's own site-packages is not the standard library; caches are not source
            dirnames[:] = sorted(d for d in dirnames if d != "__pycache__"
                                 and not (source == "stdlib" and rel_dir == Path(".") and d == "site-packages"))
            for name in sorted(filenames):
                if not name.endswith(".py"):
                    continue
                path = Path(dirpath) / name
                try:
                    size = path.stat().st_size
                except OSError:
                    continue
                if 0 < size <= max_file_bytes:
                    key = f"{source}/{(rel_dir / name).as_posix()}"
                    docs.setdefault(key, Document(key, size, path))
    return list(docs.values())


@dataclass
class Corpus:
    train: list[Document] = field(default_factory=list)
    val: list[Document] = field(default_factory=list)
    transcript_seed: int = 0
    prompt_profile: str = "default"  # transcripts are rendered with this profile (agent.prompt.PROFILES)

    def documents(self, split: str) -> list[Document]:
        if split not in ("train", "val"):
            raise ValueError(f"split must be 'train' or 'val', not {split!r}")
        return self.train if split == "train" else self.val

    def texts(self, split: str, *, shuffle_seed: int | None = None) -> Iterator[str]:
        """Document texts of a split, in corpus order or in a seeded permutation of it."""
        docs = list(self.documents(split))
        if shuffle_seed is not None:
            random.Random(shuffle_seed).shuffle(docs)
        for doc in docs:
            text = self.read(doc)
            if text:
                yield text

    def read(self, doc: Document) -> str | None:
        if doc.path is None:
            return transcript(int(doc.key.rsplit("/", 1)[1]), self._code_for_transcripts(), self.transcript_seed,
                              profile=self.prompt_profile)
        try:
            return doc.path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            return None

    def _code_for_transcripts(self) -> list[Document]:
        return [d for d in self.train if d.path is not None][:400]

    @property
    def fingerprint(self) -> str:
        h = hashlib.sha1()
        if any(d.path is None for d in self.train + self.val):  # transcripts depend on the profile
            h.update(f"profile:{self.prompt_profile}\n".encode())
        for d in self.train + self.val:
            h.update(f"{d.key}:{d.size}\n".encode())
        return h.hexdigest()[:16]

    def summary(self) -> dict[str, int]:
        out = {f"{split}_{what}": 0 for split in ("train", "val") for what in ("docs", "bytes")}
        for split in ("train", "val"):
            docs = self.documents(split)
            out[f"{split}_docs"], out[f"{split}_bytes"] = len(docs), sum(d.size for d in docs)
        return out


def build_corpus(*, max_bytes: int = 64 << 20, max_file_bytes: int = 256 << 10, val_fraction: float = 0.02,
                 n_transcripts: int = 300, seed: int = 0,
                 roots: list[tuple[str, Path]] | None = None, prompt_profile: str = "default") -> Corpus:
    """Select documents (in hash order, until ``max_bytes``) and split them by key hash.

    Transcripts come first but take at most ``TRANSCRIPT_SHARE`` of the cap;
    they are rendered with ``prompt_profile`` (raises ``KeyError`` if unknown)."""
    from agent.prompt import profile_named

    profile_named(prompt_profile)
    code = sorted(list_code_files(roots or code_roots(), max_file_bytes), key=lambda d: (_hash(d.key), d.key))
    n_transcripts = min(n_transcripts, int(max_bytes * TRANSCRIPT_SHARE) // TRANSCRIPT_BYTES)
    docs = [Document(f"transcripts/{i:05d}", TRANSCRIPT_BYTES) for i in range(n_transcripts)]
    budget = max_bytes - sum(d.size for d in docs)
    for d in code:
        if d.size > budget:
            continue
        docs.append(d)
        budget -= d.size
    docs.sort(key=lambda d: (_hash(d.key), d.key))
    threshold = int(val_fraction * 2**64)
    corpus = Corpus(transcript_seed=seed, prompt_profile=prompt_profile)
    for d in docs:
        (corpus.val if _hash("split:" + d.key) < threshold else corpus.train).append(d)
    return corpus


# -- synthetic tool-call transcripts ------------------------------------------------

_DEF = re.compile(r"^([ \t]*)def (\w+)\(", re.M)
_REQUESTS = {
    "explain": ["What does `{name}` in {path} do?", "Can you explain how {name} works?",
                "I don't understand `{name}` — walk me through it.", "Where is {name} defined, and what is it for?"],
    "docstring": ["Add a short docstring to `{name}` in {path}.", "{name} has no docstring; please document it.",
                  "Please document the function {name}."],
    "explore": ["Give me an overview of the files under {dir}.", "What is in {dir}? List the Python modules.",
                "Find the module that defines {name}."],
    "test": ["Run the tests for {path} and tell me if they pass.", "Check that {path} still imports cleanly."],
    "note": ["Write a NOTES.md that summarises {path}.", "Create a short summary of {path} in NOTES.md."],
}


def _functions(text: str) -> list[tuple[str, int, str]]:
    """(name, 1-based line, indentation) of each def."""
    return [(m.group(2), text.count("\n", 0, m.start()) + 1, m.group(1)) for m in _DEF.finditer(text)]


def transcript(index: int, code: list[Document], seed: int = 0, *, profile: str = "default") -> str:
    """The ``index``-th synthetic conversation, rendered with the production template
    and the prompt profile named ``profile``."""
    from agent.calls import render_results
    from agent.parser import encode_call
    from agent.prompt import CHAT_TEMPLATE, Message, profile_named, render_prompt
    from tools.base import ToolResult
    from tools.read_file import _render as render_read
    from tools.registry import default_tools

    rng = random.Random(f"{seed}:{index}")
    files = [d for d in code if d.path is not None]
    text, doc = "", None
    for _ in range(8):
        doc = rng.choice(files) if files else None
        text = (doc.path.read_text(encoding="utf-8", errors="replace") if doc and doc.path else "")
        if _functions(text):
            break
    funcs = _functions(text) or [("main", 1, "")]
    name, line, indent = rng.choice(funcs)
    path = doc.key.split("/", 1)[1] if doc else "app.py"
    directory = str(Path(path).parent) if "/" in path else "."
    lines = text.splitlines()
    end = min(len(lines), line + rng.randint(6, 30))
    kind = rng.choice(sorted(_REQUESTS))
    conv = [Message("user", rng.choice(_REQUESTS[kind]).format(name=name, path=path, dir=directory))]

    def step(calls: list[tuple[str, dict[str, str]]], results: list[ToolResult], prose: str = "") -> None:
        body = "\n".join(encode_call(tool, params) for tool, params in calls)
        conv.append(Message("assistant", (prose + "\n\n" if prose else "") + body))
        conv.append(Message("tool", render_results([(c[0], i, r) for i, (c, r) in enumerate(zip(calls, results))])))

    read = lambda a, b: render_read(path, text, a, b) if text else ToolResult(True, f"{path}: empty file (0 bytes)")  # noqa: E731
    grep_hit = ToolResult(True, f"1 matches in 1 files\n{path}:{line}: {lines[line - 1] if lines else ''}\n")
    if kind == "explain":
        step([("grep", {"pattern": f"def {name}\\("})], [grep_hit], rng.choice(["Let me find it first.", ""]))
        step([("read_file", {"path": path, "start_line": str(line), "end_line": str(end)})], [read(line, end)])
        answer = (f"`{name}` is a {'method' if indent else 'module-level function'} defined at {path}:{line}; "
                  f"the excerpt above (lines {line}-{end}) shows its body.")
    elif kind == "docstring":
        step([("read_file", {"path": path, "start_line": str(line), "end_line": str(end)})], [read(line, end)])
        head = lines[line - 1] if lines else f"def {name}():"
        body_indent = indent + "    "
        new = f'{head}\n{body_indent}"""{name.replace("_", " ").strip().capitalize()}."""'
        diff = "".join(difflib.unified_diff([head + "\n"], [new + "\n"], f"a/{path}", f"b/{path}"))
        result = ToolResult(True, diff) if rng.random() < 0.8 else ToolResult(
            False, f"search text not found in {path} (it must match the current content exactly)")
        step([("edit_file", {"path": path, "search": head, "replace": new})], [result], "I'll add the docstring.")
        answer = (f"Added a docstring to `{name}`." if result.ok else
                  "The edit did not apply: the file changed under me. Please re-run the request.")
    elif kind == "explore":
        siblings = sorted({Path(d.key.split("/", 1)[1]).name for d in files[:40]})[:8] or [Path(path).name]
        step([("list_dir", {"path": directory}), ("glob", {"pattern": "**/*.py", "path": directory})],
             [ToolResult(True, "\n".join(siblings) + "\n"),
              ToolResult(True, f"{len(siblings)} files match '**/*.py'\n" + "\n".join(siblings) + "\n")],
             "Listing the directory and its Python files in parallel.")
        answer = f"{directory} holds {len(siblings)} Python modules; `{name}` lives in {path}."
    elif kind == "test":
        module = path.removesuffix(".py").replace("/", ".")
        ok = rng.random() < 0.7
        out = "exit code 0\n(no output)" if ok else f"exit code 1\nModuleNotFoundError: No module named '{module}'"
        step([("run_command", {"command": f"python -c 'import {module}'"})], [ToolResult(ok, out)])
        answer = f"{path} imports cleanly." if ok else f"Importing {module} fails; it is not on the path."
    else:
        step([("read_file", {"path": path})], [read(1, None)])
        note = f"# Notes on {path}\n\n- defines `{name}` (line {line})\n"
        step([("write_file", {"path": "NOTES.md", "content": note})],
             [ToolResult(True, f"created NOTES.md ({len(note.encode())} bytes)\n")])
        answer = "Wrote NOTES.md with a summary."
    conv.append(Message("assistant", answer))
    specs = [t.spec for t in default_tools(commands=kind == "test" or rng.random() < 0.5)]
    rendered = render_prompt(conv, specs, profile=profile_named(profile)).text
    return rendered.removesuffix(CHAT_TEMPLATE.assistant)  # drop the generation prompt: the answer is there

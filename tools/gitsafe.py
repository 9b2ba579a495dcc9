"""Make a workspace safe for the host's git, and run the host's git safely.

A model can write anything inside its workspace, including a ``.git``
directory. When the host's git later touches a kept or exported workspace
(``git status``, ``git commit`` by a developer, an IDE's git integration), a
planted ``.git/hooks/pre-commit``, ``core.fsmonitor``, ``core.pager``,
``diff.external``, ``filter.*.process``, ``alias.x = !cmd``, ``include.path``
... would run on the host, outside every sandbox.

:func:`neutralise_git` is the one export step: for every git directory in
the tree (each ``.git`` directory, and any directory that looks like one:
``HEAD`` plus ``objects`` or ``commondir``, which covers bare repositories,
``.git/modules/*`` and ``.git/worktrees/*``) it

* moves ``hooks/`` aside to ``hooks.flywheel-disabled`` (with the executable
  bits cleared) and leaves an empty ``hooks/``, unless it holds only git's
  inert ``*.sample`` files;
* rewrites ``config`` and ``config.worktree`` keeping only an allowlist of
  keys that cannot run a program (:data:`SAFE_CONFIG_KEYS`: repository
  format, core file-handling flags, user identity, remotes' URLs and refspecs,
  branch tracking); everything else, includes included, is dropped. An
  allowlist fails closed: a key git adds tomorrow is dropped, not trusted;
* disables ``.git`` *files* and ``commondir`` files that point outside the
  tree (renamed to ``*.flywheel-disabled``), and removes ``.git`` symlinks.

:func:`host_git` runs git on the host with ``GIT_*`` variables removed (no
inherited ``GIT_DIR``), the system config off, hooks off
(``core.hooksPath=/dev/null``) and ``core.fsmonitor=false``;
:func:`tracked_paths` and :func:`archive_into` use it to read a source
repository (its tracked files; a commit's tree).

Not guaranteed: protection for a developer who copies a workspace without
this step, or who runs git with other tools that read the repository's
config themselves; ``.gitattributes`` still selects filters and diff drivers
the developer's *own* global config defines (git-lfs, say), which run as the
developer configured them; a repository whose config needed a dropped key
(``core.worktree``, ``extensions.*`` other than the object format) may need
it set again by hand.
"""

from __future__ import annotations

import os
import posixpath
import re
import secrets
import stat
import subprocess
import tempfile
from dataclasses import dataclass, field

from tools.treewalk import TreeItem, TreeLimitError, remove_tree, scan_tree

SAFE_CONFIG_KEYS = (
    r"core\.(repositoryformatversion|filemode|bare|logallrefupdates|ignorecase|precomposeunicode|symlinks"
    r"|autocrlf|eol|safecrlf|quotepath|abbrev|compression|sparsecheckout|sparsecheckoutcone)",
    r"extensions\.objectformat", r"init\.defaultbranch", r"user\.(name|email)",
    r"remote\.[^\n]+\.(url|pushurl|fetch|push|tagopt|prune|mirror)",
    r"branch\.[^\n]+\.(remote|merge|rebase|pushremote|description)",
    r"submodule\.[^\n]+\.(url|active|branch)",
)
_SAFE_RE = re.compile("|".join(f"(?:{k})" for k in SAFE_CONFIG_KEYS))
SAFE_GIT_OPTIONS = ("-c", "core.hooksPath=/dev/null", "-c", "core.fsmonitor=false")
DISABLED = ".flywheel-disabled"


@dataclass(slots=True)
class GitNeutralised:
    """What :func:`neutralise_git` changed (paths relative to the tree)."""

    git_dirs: list[str] = field(default_factory=list)
    hooks_disabled: list[str] = field(default_factory=list)
    config_keys_removed: list[str] = field(default_factory=list)
    links_disabled: list[str] = field(default_factory=list)

    @property
    def changed(self) -> bool:
        return bool(self.hooks_disabled or self.config_keys_removed or self.links_disabled)

    def summary(self) -> str:
        if not self.changed:
            return f"git: {len(self.git_dirs)} repositories checked, nothing to neutralise"
        parts = [f"{len(self.hooks_disabled)} hook(s) disabled"] if self.hooks_disabled else []
        if self.config_keys_removed:
            parts.append(f"config keys removed: {', '.join(sorted(set(self.config_keys_removed))[:20])}")
        if self.links_disabled:
            parts.append(f"git links disabled: {', '.join(self.links_disabled[:20])}")
        return "git: " + "; ".join(parts)


def host_env() -> dict[str, str]:
    """The environment for the host's git: no ``GIT_*`` variables, no system config, no prompts."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update(GIT_CONFIG_NOSYSTEM="1", GIT_TERMINAL_PROMPT="0")
    return env


def host_git(cwd: str | os.PathLike[str], *args: str, text: bool = True) -> subprocess.CompletedProcess[str]:
    """Run ``git -C cwd <safe options> args`` on the host with :func:`host_env`."""
    return subprocess.run(["git", "-C", os.fspath(cwd), *SAFE_GIT_OPTIONS, *args], capture_output=True,
                          text=text, env=host_env(), stdin=subprocess.DEVNULL)


class GitArchiveError(Exception):
    """``git archive`` or the ``tar`` reading it failed (the message is theirs)."""


def tracked_paths(src: str | os.PathLike[str]) -> set[str]:
    """Paths git tracks beneath ``src`` (relative to it); none if ``src`` is not in a work tree."""
    proc = subprocess.run(["git", "-C", os.fspath(src), *SAFE_GIT_OPTIONS, "ls-files", "-z", "--cached"],
                          capture_output=True, env=host_env(), stdin=subprocess.DEVNULL)
    if proc.returncode != 0:
        return set()
    return {os.fsdecode(p) for p in proc.stdout.split(b"\0") if p}


def archive_into(repo: str | os.PathLike[str], sha: str, dest: str | os.PathLike[str]) -> None:
    """Extract ``git archive`` of commit ``sha`` into the directory ``dest`` (raises GitArchiveError)."""
    with tempfile.TemporaryFile() as err, subprocess.Popen(
        ["git", "-C", os.fspath(repo), *SAFE_GIT_OPTIONS, "archive", "--format=tar", sha],
        stdout=subprocess.PIPE, stderr=err, env=host_env(), stdin=subprocess.DEVNULL,
    ) as archive:
        untar = subprocess.run(["tar", "-x", "-f", "-", "-C", os.fspath(dest)],
                               stdin=archive.stdout, capture_output=True)
        if archive.stdout is not None:
            archive.stdout.close()
        ok = archive.wait() == 0 and untar.returncode == 0
        err.seek(0)
        message = (err.read() or untar.stderr).decode(errors="replace").strip()
    if not ok:
        raise GitArchiveError(message)


def neutralise_git(root: str | os.PathLike[str]) -> GitNeutralised:
    """Disable everything in ``root``'s git directories that would run a program on the host."""
    root = os.path.realpath(root)
    report = GitNeutralised()
    names: dict[str, set[str]] = {}
    dirs: set[str] = set()
    gitlinks: list[str] = []

    def note(item: TreeItem) -> bool:
        parent, name = posixpath.split(item.path)
        names.setdefault(parent, set()).add(name)
        if name == ".git":
            if stat.S_ISDIR(item.st.st_mode):
                dirs.add(item.path)
            else:
                gitlinks.append(item.path)
        return not name.endswith(DISABLED)

    def skip(_item: TreeItem, _exc: TreeLimitError) -> None:
        return None

    for _ in scan_tree(root, on_limit=skip, descend=note):
        pass
    dirs |= {p for p, n in names.items() if "HEAD" in n and ("objects" in n or "commondir" in n)}
    for rel in gitlinks:
        _disable_link(root, rel, report)
    for rel in sorted(dirs):
        report.git_dirs.append(rel)
        gdir = os.path.join(root, rel)
        if "commondir" in names.get(rel, ()):
            _disable_link(root, posixpath.join(rel, "commondir"), report)
        if "hooks" in names.get(rel, ()):
            _disable_hooks(gdir, rel, report)
        for cfg in ("config", "config.worktree"):
            if cfg in names.get(rel, ()):
                report.config_keys_removed += _sanitise_config(gdir, cfg)
    return report


def _disable_link(root: str, rel: str, report: GitNeutralised) -> None:
    """A ``.git`` file (``gitdir: ...``) or ``commondir`` pointing outside ``root`` is renamed aside."""
    path = os.path.join(root, rel)
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        os.unlink(path)
        report.links_disabled.append(rel)
        return
    if not stat.S_ISREG(st.st_mode):
        return
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as f:
        text = f.read(4096).decode("utf-8", "replace").strip()
    target = text.removeprefix("gitdir:").strip() if rel.endswith(".git") else text
    resolved = os.path.realpath(os.path.join(os.path.dirname(path), target))
    if target and (resolved == root or resolved.startswith(root + os.sep)):
        return
    os.rename(path, path + DISABLED)
    report.links_disabled.append(rel)


def _disable_hooks(gdir: str, rel: str, report: GitNeutralised) -> None:
    """Move ``hooks`` aside (executable bits cleared) and leave an empty ``hooks`` directory."""
    fd = os.open(gdir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        st = os.stat("hooks", dir_fd=fd, follow_symlinks=False)
        if stat.S_ISDIR(st.st_mode):
            hfd = os.open("hooks", os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
            try:
                with os.scandir(hfd) as it:
                    entries = sorted(e.name for e in it)
                live = [n for n in entries if not (n.endswith(".sample") and stat.S_ISREG(
                    os.stat(n, dir_fd=hfd, follow_symlinks=False).st_mode))]  # git never runs *.sample
                for name in live:
                    est = os.stat(name, dir_fd=hfd, follow_symlinks=False)
                    if stat.S_ISREG(est.st_mode):
                        os.chmod(name, stat.S_IMODE(est.st_mode) & ~0o111, dir_fd=hfd)
                    report.hooks_disabled.append(posixpath.join(rel, "hooks", name))
            finally:
                os.close(hfd)
            if not live:
                return
        else:
            report.hooks_disabled.append(posixpath.join(rel, "hooks"))
        aside = "hooks" + DISABLED
        try:
            os.stat(aside, dir_fd=fd, follow_symlinks=False)
            aside += f"-{secrets.token_hex(4)}"
        except FileNotFoundError:
            pass
        os.rename("hooks", aside, src_dir_fd=fd, dst_dir_fd=fd)
        os.mkdir("hooks", 0o755, dir_fd=fd)
    finally:
        os.close(fd)


def _sanitise_config(gdir: str, name: str) -> list[str]:
    """Rewrite ``gdir/name`` keeping only :data:`SAFE_CONFIG_KEYS`; return the keys removed."""
    fd = os.open(gdir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        st = os.stat(name, dir_fd=fd, follow_symlinks=False)
        raw = b""
        if stat.S_ISREG(st.st_mode):
            cfd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=fd)
            with os.fdopen(cfd, "rb") as f:
                raw = f.read(1 << 20)
        pairs = _parse(raw) if stat.S_ISREG(st.st_mode) else None
        if pairs is None:
            kept, removed = [], [f"{name} (unreadable or not a file: replaced)"]
        else:
            kept = [(k, v) for k, v in pairs if _SAFE_RE.fullmatch(k)]
            removed = [k for k, _ in pairs if not _SAFE_RE.fullmatch(k)]
        if not removed:
            return []
        tmp = f".fw-config-{secrets.token_hex(8)}"
        out = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644, dir_fd=fd)
        with os.fdopen(out, "w", encoding="utf-8", errors="surrogateescape") as f:
            f.write(_render(kept))
        if stat.S_ISDIR(st.st_mode):
            remove_tree(fd, name)
        os.replace(tmp, name, src_dir_fd=fd, dst_dir_fd=fd)
        return removed
    finally:
        os.close(fd)


def _parse(raw: bytes) -> list[tuple[str, str]] | None:
    """``(key, value)`` pairs of a config file, read by git itself (no includes); None if git refuses it."""
    with tempfile.NamedTemporaryFile(prefix="flywheel-gitcfg-") as tmp:
        tmp.write(raw)
        tmp.flush()
        proc = subprocess.run(["git", "config", "--file", tmp.name, "--no-includes", "--null", "--list"],
                              capture_output=True, env=host_env(), cwd="/", stdin=subprocess.DEVNULL)
    if proc.returncode != 0:
        return None
    pairs = []
    for rec in proc.stdout.split(b"\0"):
        if rec:
            key, _, value = rec.partition(b"\n")
            pairs.append((key.decode("utf-8", "surrogateescape"), value.decode("utf-8", "surrogateescape")))
    return pairs


def _render(pairs: list[tuple[str, str]]) -> str:
    def quote(s: str) -> str:
        return s.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\t", "\\t")

    out: list[str] = []
    current = None
    for key, value in pairs:
        section, _, rest = key.partition(".")
        sub, _, var = rest.rpartition(".")
        head = f'[{section} "{quote(sub)}"]' if sub else f"[{section}]"
        if head != current:
            out.append(head + "\n")
            current = head
        out.append(f'\t{var} = "{quote(value)}"\n')
    return "".join(out)

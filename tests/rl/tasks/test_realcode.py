"""Real-code tasks: mutation bugs in pinned sdists, graded by the sdist's own tests in the sandbox.

Offline tests use a tiny sdist written straight into the cache (so a download would fail: the
cache is what they read). One test fetches toolz==1.0.0 from PyPI, cached across runs in
pytest's cache directory, and skips with the reason when PyPI cannot be reached."""

from __future__ import annotations

import asyncio
import io
import json
import tarfile
from pathlib import Path

import pytest

from backend.cli import main
from rl.tasks.build import plan, validate
from rl.tasks.grading import grade, grader_sandbox
from rl.tasks.realcode import REALCODE, SdistPin, draft_tasks, sdist_layout
from rl.tasks.spec import Grader, SdistSource, Task, load_tasks
from rl.tasks.workspaces import (
    TaskSourceError,
    apply_patch,
    default_sdist_cache,
    fetch_sdist,
    materialise,
    sha256_file,
)
from rl.types import Split
from tools.sandbox import Sandbox, probe_bwrap
from tools.workspace import WorkspaceStore

TOOLZ = "toolz==1.0.0@sha256:2c86e3d9a04798ac556793bced838816296a2f085017664e4995cb40a1047a02"

CORE = '''def middle(values):
    return values[len(values) // 2]


def total(values):
    out = 0
    for v in values:
        out = out + v
    return out
'''
TESTS = '''from tinymath.core import middle, total


def test_middle():
    assert middle([1, 2, 3, 4, 5]) == 3


def test_total():
    assert total([1, 2, 3]) == 6
    assert total([]) == 0
'''


def _sdist(cache: Path, name: str, version: str, files: dict[str, str]) -> str:
    """A .tar.gz sdist ``name-version/`` placed in the cache as fetch_sdist stores it; returns its sha256."""
    d = cache / f"{name}-{version}"
    d.mkdir(parents=True)
    archive = d / f"{name}-{version}.tar.gz"
    with tarfile.open(archive, "w:gz") as tf:
        for rel, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(f"{name}-{version}/{rel}")
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    return sha256_file(archive)


TINY = {"tinymath/__init__.py": "", "tinymath/core.py": CORE, "tests/test_core.py": TESTS, "setup.py": ""}


@pytest.fixture(scope="module")
def project_sandbox() -> Sandbox:
    reason = probe_bwrap()
    if reason is not None:
        pytest.skip(f"bubblewrap is not usable here: {reason}")
    return grader_sandbox(project=True)


def test_pins_parse_and_refuse_what_is_not_a_pin(tmp_path: Path) -> None:
    assert SdistPin.parse("toolz==1.0.0") == SdistPin("toolz", "1.0.0", None)
    assert SdistPin.parse(TOOLZ).sha256 == TOOLZ.rsplit(":", 1)[1]
    for bad, says in (("toolz", "expected NAME==VERSION"), ("toolz==", "expected NAME==VERSION"),
                      ("toolz==1.0@sha256:abc", "64 lowercase hex"), ("../x==1.0", "not a distribution name"),
                      ("toolz==1.0;rm", "is not a version")):
        with pytest.raises(ValueError, match=says):
            SdistPin.parse(bad)
    with pytest.raises(ValueError, match="the realcode family needs sdists"):
        plan([REALCODE], 1, 1, 0)


def test_sdist_names_never_leave_the_cache(tmp_path: Path) -> None:
    """A task file's sdist name becomes a cache directory: '../x' must not create one outside."""
    cache = tmp_path / "cache"
    cache.mkdir()
    for name, version in (("../../escaped", "1.0"), ("ok", "../../../escaped")):
        with pytest.raises(TaskSourceError, match="not a"):
            fetch_sdist(name, version, cache)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache"] and not any(cache.iterdir())


def test_a_cached_sdist_is_not_downloaded_again(tmp_path: Path) -> None:
    """The package does not exist on any index: only the cache can answer (and pins are checked)."""
    sha = _sdist(tmp_path, "flywheel-no-such-dist", "0.1", TINY)
    got = fetch_sdist("flywheel-no-such-dist", "0.1", tmp_path, sha256=sha)
    assert got.parent == tmp_path / "flywheel-no-such-dist-0.1" and sha256_file(got) == sha
    with pytest.raises(TaskSourceError, match="pip download flywheel-no-such-dist==0.1 failed"):
        fetch_sdist("flywheel-no-such-dist", "0.1", tmp_path, sha256="0" * 64, timeout_s=60)
    assert not got.exists()  # an archive that is not the pinned one is never kept


def test_layout_mutates_no_test_file_even_nested(tmp_path: Path) -> None:
    """The search benchmark mutated ``pkg/sub/tests/*.py`` (only top-level tests were excluded)."""
    root = tmp_path / "r"
    for rel in ("src/my_pkg/__init__.py", "src/my_pkg/a.py", "src/my_pkg/sub/__init__.py",
                "src/my_pkg/sub/tests/test_x.py", "src/my_pkg/tests/test_y.py", "tests/test_top.py"):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text("x = 1\n")
    lay = sdist_layout(root, "my-pkg")
    assert (lay.package_dir, lay.import_dir, lay.tests_dir) == ("src/my_pkg", "src", "tests")
    assert lay.sources == ("src/my_pkg/__init__.py", "src/my_pkg/a.py", "src/my_pkg/sub/__init__.py")
    assert lay.test_dirs == ("src/my_pkg/sub/tests", "src/my_pkg/tests", "tests")
    (root / "tests").rename(root / "elsewhere")
    for d in ("src/my_pkg/tests", "src/my_pkg/sub/tests"):
        for f in (root / d).iterdir():
            f.unlink()
        (root / d).rmdir()
    with pytest.raises(TaskSourceError, match="ships no tests directory"):
        sdist_layout(root, "my-pkg")


@pytest.mark.sandbox
@pytest.mark.timeout(120)
def test_drafts_from_a_local_sdist_are_valid_and_grade_like_any_task(tmp_path: Path,
                                                                      project_sandbox: Sandbox) -> None:
    cache = tmp_path / "cache"
    sha = _sdist(cache, "tinymath", "1.0", TINY)
    broken = {k.replace("tinymath", "brokenmath"): v.replace("tinymath", "brokenmath") for k, v in TINY.items()}
    _sdist(cache, "brokenmath", "1.0", {**broken, "tests/test_core.py": broken["tests/test_core.py"].replace("== 6",
                                                                                                       "== 7")})
    store = WorkspaceStore(tmp_path / "store")
    pins = [SdistPin("tinymath", "1.0", sha), SdistPin("brokenmath", "1.0")]
    # tinymath owes one task per split, brokenmath the second held-out one (and cannot pay it)
    drafts, unusable = asyncio.run(draft_tasks(pins, 1, 2, 3, sandbox=project_sandbox, store=store,
                                               cache_dir=cache))
    assert [p for p, _ in unusable] == ["brokenmath==1.0"] and "unmodified tests do not pass" in unusable[0][1]
    assert [t.split for t in drafts] == [Split.TRAIN, Split.HELDOUT]
    assert {t.metadata["symbol"] for t in drafts} == {"middle", "total"}  # one function per split
    task = drafts[0]
    assert isinstance(task.source, SdistSource) and task.source.sha256 == sha and task.source.patch
    assert task.grader.interpreter == "project" and task.grader.test_files == ["tests"]
    assert task.metadata["path"] == "tinymath/core.py" and "tests/test_core.py" in task.request
    assert asyncio.run(validate(task, store, project_sandbox, cache_dir=cache)) is None

    async def rollout_deletes_the_tests_and_edits_nothing_else() -> bool:
        ws = await asyncio.to_thread(materialise, task, store, cache_dir=cache)
        try:
            (Path(ws.root) / "tests" / "test_core.py").unlink()
            return (await grade(task, ws, project_sandbox)).passed
        finally:
            ws.delete()

    assert not asyncio.run(rollout_deletes_the_tests_and_edits_nothing_else())


@pytest.fixture(scope="module")
def sdist_cache(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Survives test runs (pytest's cache dir) so PyPI is asked once; a fresh dir without the cache plugin."""
    cache = getattr(request.config, "cache", None)
    return cache.mkdir("flywheel-sdists") if cache is not None else tmp_path_factory.mktemp("sdists")


@pytest.mark.sandbox
@pytest.mark.timeout(150)
def test_toolz_tasks_build_end_to_end(tmp_path: Path, sdist_cache: Path, project_sandbox: Sandbox,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    pin = SdistPin.parse(TOOLZ)
    try:
        fetch_sdist(pin.name, pin.version, sdist_cache, sha256=pin.sha256, timeout_s=90)
    except TaskSourceError as exc:
        pytest.skip(f"cannot fetch {pin.name}=={pin.version} from the package index: {exc}")
    out = tmp_path / "real.jsonl"
    rc = main(["rl", "tasks", "build", "--families", REALCODE, "--sdists", TOOLZ, "--n-train", "1",
               "--n-heldout", "1", "--seed", "0", "--cache-dir", str(sdist_cache), "--out", str(out)])
    assert rc == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["written"] == {"train": 1, "heldout": 1}, summary
    tasks = load_tasks(out)
    assert {t.split for t in tasks} == {Split.TRAIN, Split.HELDOUT}
    assert len({t.metadata["symbol"] for t in tasks}) == 2  # the splits never mutate one function
    for t in tasks:
        assert t.family == REALCODE and t.source.kind == "sdist" and t.source.sha256 == pin.sha256
        assert t.grader.test_files == ["toolz/tests"] and t.metadata["failing_test"]
    # the reference patch undoes the mutation exactly: start + reference == the pristine sdist
    store = WorkspaceStore(tmp_path / "store")
    ws = materialise(tasks[0], store, cache_dir=sdist_cache)
    try:
        apply_patch(ws.root, tasks[0].reference_patch)
        path = tasks[0].metadata["path"]
        pristine = build_pristine(sdist_cache, tmp_path / "pristine") / path
        assert (Path(ws.root) / path).read_bytes() == pristine.read_bytes()
    finally:
        ws.delete()


def build_pristine(cache: Path, dest: Path) -> Path:
    from rl.tasks.workspaces import unpack_sdist

    return unpack_sdist(next((cache / "toolz-1.0.0").glob("*.tar.gz")), dest)


def test_rollout_workers_find_the_sdist_in_the_default_cache(tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """Rollout workers call ``materialise(task, store)`` with no cache: it must read the default
    cache the build filled (it refused every sdist task before)."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    cache = default_sdist_cache()
    assert cache == tmp_path / "home" / ".cache" / "flywheel" / "sdists"
    sha = _sdist(cache, "tinymath", "1.0", TINY)
    task = Task(id="rc", family=REALCODE, split=Split.TRAIN, difficulty=1, seed=0, request="fix it",
                source=SdistSource(name="tinymath", version="1.0", sha256=sha),
                grader=Grader(command="true", test_files=["tests"]), reference_patch="x")
    ws = materialise(task, WorkspaceStore(tmp_path / "store"))
    try:
        assert (Path(ws.root) / "tinymath" / "core.py").read_text() == CORE
    finally:
        ws.delete()

"""Command-line errors are one line, never a traceback (backend/cli_checks.py and its callers)."""

from __future__ import annotations

import logging
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from backend import cli_checks
from backend.cli import main as cli_main
from backend.cli_checks import CliCheckError

REPO = Path(__file__).resolve().parents[2]


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def one_line_error(fn, *args, **kw) -> str:  # noqa: ANN001 - test helper
    with pytest.raises(CliCheckError) as info:
        fn(*args, **kw)
    message = str(info.value)
    assert message and "\n" not in message and "Traceback" not in message
    return message


@pytest.mark.parametrize("port", [-1, 65536, 10**9])
def test_ports_out_of_range(port: int) -> None:
    assert "out of range" in one_line_error(cli_checks.check_port, port)
    assert "out of range" in one_line_error(cli_checks.listen, "127.0.0.1", port)


def test_a_port_in_use_and_an_address_not_here() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert "in use" in one_line_error(cli_checks.listen, "127.0.0.1", port)
    assert "not an address of this machine" in one_line_error(cli_checks.listen, "192.0.2.1", 0)  # never sent to
    sock = cli_checks.listen("127.0.0.1", 0)
    sock.close()


def test_devices() -> None:
    assert cli_checks.check_device("cpu") == "cpu"
    assert "not a torch device" in one_line_error(cli_checks.check_device, "gpu0")
    if not torch.cuda.is_available():
        assert "CUDA is not available" in one_line_error(cli_checks.check_device, "cuda")
        assert "CUDA is not available" in one_line_error(cli_checks.check_device, "cuda:1")


@pytest.mark.parametrize(("url", "message"), [
    ("not a url", "is not a database URL"),
    ("nosuchdb://x/y", "unknown database kind"),
    (f"postgresql+psycopg://nobody@127.0.0.1:{closed_port()}/db", "cannot open the database"),
])
def test_database_urls(url: str, message: str) -> None:
    got = one_line_error(cli_checks.check_database, url)
    assert message in got and "Background on this error" not in got


def test_an_unwritable_sqlite_path(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    assert "cannot create" in one_line_error(cli_checks.check_database, f"sqlite:///{tmp_path}/file/sub/db.sqlite")
    cli_checks.check_database(f"sqlite:///{tmp_path}/ok/fw.db")  # a new file in a new directory is fine
    engine = cli_checks.open_log_engine(f"sqlite:///{tmp_path}/ok/fw.db")
    engine.dispose()


def test_server_settings_and_data_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert "--port 70000 is out of range" in one_line_error(cli_checks.server_settings, port=70000)
    monkeypatch.setenv("FLYWHEEL_PORT", "abc")
    assert "FLYWHEEL_PORT" in one_line_error(cli_checks.server_settings)
    assert cli_checks.server_settings(port=0, data_dir=tmp_path).port == 0  # the flag wins over the variable
    monkeypatch.delenv("FLYWHEEL_PORT")
    (tmp_path / "f").write_text("")
    assert "cannot create" in one_line_error(cli_checks.check_data_dir, tmp_path / "f" / "d")
    assert cli_checks.check_data_dir(tmp_path / "new").is_dir()


def test_embedding_models(tmp_path: Path) -> None:
    cli_checks.check_embedding_model("all-MiniLM-L6-v2")
    assert "unknown embedding model" in one_line_error(cli_checks.check_embedding_model, "no-such-model-xyz")
    assert "unknown embedding model" in one_line_error(cli_checks.check_embedding_model, "nobody/no-such-model")
    assert "not a sentence-transformers model" in one_line_error(cli_checks.check_embedding_model, str(tmp_path))
    (tmp_path / "modules.json").write_text("[]")
    cli_checks.check_embedding_model(str(tmp_path))


def run_train(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    assert cli_main(["embeddings", "train", *argv]) == 1
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("flywheel embeddings train: "), captured.err
    return lines[0]


def test_embeddings_train_errors_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = ["--out", str(tmp_path / "out")]
    assert "unknown embedding model" in run_train(capsys, "--synthetic", "json", "--base-model", "nope-model", *out)
    assert "--events" in run_train(capsys, "--events", str(tmp_path / "missing.jsonl"), *out)
    events = tmp_path / "e.jsonl"
    events.write_text("")
    assert "--workspace-root" in run_train(capsys, "--events", str(events), "--workspace-root",
                                           str(tmp_path / "gone"), *out)
    events.write_text("{not json\n")
    assert "no (query, chunk) pairs found" in run_train(capsys, "--events", str(events), *out)
    assert "not an installed package" in run_train(capsys, "--synthetic", "no_such_pkg_xyz", *out)
    assert "not a database URL" in run_train(capsys, "--sessions", "nonsense", *out)
    assert "cannot read sessions" in run_train(capsys, "--sessions", f"sqlite:///{tmp_path / 'empty.db'}", *out)
    assert "--batch-size" in run_train(capsys, "--synthetic", "json", "--batch-size", "1", *out)


def test_known_third_party_noise_is_dropped_and_nothing_else() -> None:
    code = ("import logging, sys\n"
            "from backend.cli_checks import quiet_third_party\n"
            "quiet_third_party(); quiet_third_party()\n"
            "import sentence_transformers, torchao\n"
            "logging.getLogger('torchao').warning('a real torchao warning')\n")
    r = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stderr.strip() == "a real torchao warning", r.stderr
    assert len(logging.getLogger("torchao").filters) <= 1

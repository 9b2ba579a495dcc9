"""What ``flywheel acp`` starts with: the session modes it offers (what it asks before
a call runs; :mod:`backend.acp.permission` applies them) and its limits. No protocol
imports here: the CLI reads these, and ``flywheel --help`` stays fast."""

from __future__ import annotations

MODES: dict[str, tuple[str, str]] = {
    "ask": ("Ask", "Asks before every file edit and every command"),
    "agent": ("Agent", "Edits files freely; asks before running a command"),
    "auto": ("Auto", "Never asks (commands still run in the sandbox)"),
}
DEFAULT_MODE = "agent"
DEFAULT_PERMISSION_TIMEOUT_S = 300.0
DEFAULT_MAX_MESSAGE_BYTES = 64 << 20

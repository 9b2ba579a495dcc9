"""Approvals for ``flywheel mcp``: the MCP client's user is asked before a call that acts.

The modes are the runtime's (:mod:`agent.approval`, the same as ``flywheel run
--approval-mode`` and a server session's ``approval_mode``; ACP's ``ask`` /
``agent`` / ``auto`` are ``ask-edits`` / ``ask-commands`` / ``auto``):

* ``ask-edits`` (the default of ``flywheel mcp``) — ask before ``edit_file``,
  ``write_file`` and ``run_command`` (a command can rewrite any file);
* ``ask-commands`` — ask before ``run_command`` only;
* ``auto`` — never ask: the client decides what it calls.

What is asked comes from the tool's :meth:`tools.base.Tool.resources`, through
:func:`agent.approval.approval_kind`, so reads and searches never ask. The
question is MCP **elicitation** (a form with ``approve``, a yes/no defaulting to
yes, and an optional ``reason`` the model reads on a refusal), in the words the
terminal uses (:func:`backend.terminal_input.question`):

* protocol revisions up to 2025-11-25 (the ``initialize`` handshake): an
  ``elicitation/create`` request sent on the call's own channel while the call
  waits (:meth:`mcp.server.session.ServerSession.elicit_form`);
* 2026-07-28 (the stateless per-request envelope, where a server cannot send a
  request of its own): the call answers ``InputRequiredResult`` carrying the
  same elicitation, and runs when the client retries it with the answer. The
  ``request_state`` that comes back is signed with a per-process key and binds
  the answer to this tool and these exact arguments, expires after the approval
  timeout, and is good for one run: a client cannot reuse a "yes" for another
  command, or for the same command twice.

Accept with ``approve`` true runs the call; accept with ``approve`` false,
decline and cancel refuse it with :func:`agent.approval.declined_result` (the
text a session's refused call gets: the tool never runs). A client that did not
declare elicitation, a connection that cannot carry the question (HTTP with
JSON responses), an unanswered question (the timeout) or a client error refuse
it too, with a result that says why and names the flag that changes it
(``--approval-mode auto``). Nothing runs unasked in an asking mode.

Not guaranteed: a call waiting for its answer does not hold its place among the
client's calls (a call sent meanwhile may run first; on 2026-07-28 the call is
not running at all between the rounds); answers are not remembered ("always
allow" is ``--approval-mode auto``); the question shows the call as the client
sent it, not as a diff against the file.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import logging
import secrets
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import anyio
import mcp_types as types
from mcp_types.version import is_version_at_least

from agent.approval import ApprovalDecision, ApprovalMode, ApprovalRequest, approval_kind, declined_result, \
    parse_approval_mode
from agent.calls import CallRejected
from tools.base import ToolResult

if TYPE_CHECKING:
    from agent.tool_runner import ToolRunner

__all__ = ["DEFAULT_APPROVAL_MODE", "DEFAULT_APPROVAL_TIMEOUT_S", "ELICIT_KEY", "REQUESTED_SCHEMA", "McpApprovals",
           "decision_of"]

log = logging.getLogger(__name__)

DEFAULT_APPROVAL_MODE: ApprovalMode = "ask-edits"
DEFAULT_APPROVAL_TIMEOUT_S = 300.0
MAX_REASON_CHARS = 2000
"""Of a refusal's reason, what the model reads (the rest is cut)."""
ELICIT_KEY = "flywheel_approval"
"""The key of the question in an ``InputRequiredResult`` (2026-07-28)."""
MODERN_FROM = "2026-07-28"
"""The first protocol revision whose calls ask through ``InputRequiredResult``."""
REQUESTED_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "approve": {"type": "boolean", "title": "Allow this call", "default": True,
                    "description": "Yes runs it once; no refuses it (the tool does not run)."},
        "reason": {"type": "string", "title": "Reason (optional)", "maxLength": MAX_REASON_CHARS,
                   "description": "Told to the agent when you refuse, e.g. 'use make test instead'."},
    },
    "required": ["approve"],
}


def decision_of(result: types.ElicitResult) -> ApprovalDecision:
    """The client's answer as a decision: only ``accept`` with ``approve`` true (or left
    out: it defaults to yes) approves; a reason is kept, cut at :data:`MAX_REASON_CHARS`."""
    content = result.content or {}
    reason = content.get("reason")
    said = reason.strip()[:MAX_REASON_CHARS] if isinstance(reason, str) else ""
    if result.action == "decline":
        return ApprovalDecision(False, said)
    if result.action == "cancel":
        return ApprovalDecision(False, said or "(the question was dismissed without an answer)")
    approve = content.get("approve", True)
    if approve is True:
        return ApprovalDecision(True, said)
    if approve is False:
        return ApprovalDecision(False, said)
    return ApprovalDecision(False, f"(an answer that is neither yes nor no: approve={approve!r})")


def _can_elicit(caps: types.ClientCapabilities | None) -> bool:
    """Whether the client takes form elicitation (``elicitation: {}`` means form, as before url mode)."""
    e = caps.elicitation if caps is not None else None
    return e is not None and (e.form is not None or e.url is None)


def _modern(protocol_version: str | None) -> bool:
    return protocol_version is not None and is_version_at_least(protocol_version, MODERN_FROM)


def _digest(request: ApprovalRequest) -> str:
    body = json.dumps([request.name, dict(request.args)], sort_keys=True, ensure_ascii=False, default=str)
    return hashlib.sha256(body.encode()).hexdigest()


@dataclass
class McpApprovals:
    """What ``flywheel mcp`` asks before a call (``mode``, :mod:`agent.approval`) and how long
    it waits for an answer. One per server process; safe for concurrent calls on one loop."""

    mode: ApprovalMode = DEFAULT_APPROVAL_MODE
    timeout_s: float = DEFAULT_APPROVAL_TIMEOUT_S
    workspace: str = ""
    """Named in the question, so the user sees which directory the call acts on."""
    _key: bytes = field(default_factory=lambda: secrets.token_bytes(32), repr=False)
    _spent: dict[str, float] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        self.mode = parse_approval_mode(self.mode)
        if not self.timeout_s > 0:
            raise ValueError(f"the approval timeout must be positive (got {self.timeout_s})")

    def request_for(self, runner: ToolRunner, name: str, arguments: Mapping[str, Any],
                    call_id: str = "mcp") -> ApprovalRequest | None:
        """The question to ask before this call, or None: the mode does not ask about it (or
        the call is invalid, so it will be refused without running)."""
        if self.mode == "auto":
            return None
        call = runner.check(name, arguments, call_id)
        if isinstance(call, CallRejected):
            return None
        kind = approval_kind(self.mode, runner.resources(call))
        return None if kind is None else ApprovalRequest(call.call_id, call.name, dict(call.args), kind)

    def message(self, request: ApprovalRequest) -> str:
        from backend.terminal_input import question

        where = f" on {self.workspace}" if self.workspace else ""
        return f"flywheel mcp{where} ({self.mode}):\n{question(request)}"

    async def settle(self, ctx: Any, request: ApprovalRequest,
                     params: types.CallToolRequestParams) -> ToolResult | types.InputRequiredResult | None:
        """Ask ``ctx``'s client about ``request``. None: run the call; a result: its refusal;
        an ``InputRequiredResult``: the question, to return as the call's answer (2026-07-28)."""
        session = ctx.session
        if not _can_elicit(session.client_capabilities):
            return self._cannot_ask(request, "this MCP client does not support elicitation (it declared no "
                                    "'elicitation' form capability)")
        if _modern(ctx.protocol_version):
            return self._round(request, params)
        if not session.can_send_request:
            return self._cannot_ask(request, "this connection cannot carry a question to the client")
        from mcp import MCPError

        try:
            with anyio.fail_after(self.timeout_s):
                result = await session.elicit_form(self.message(request), REQUESTED_SCHEMA,
                                                   related_request_id=ctx.request_id)
        except TimeoutError:
            decision = ApprovalDecision(False, f"(no answer within {self.timeout_s:g} s)")
        except MCPError as exc:
            log.warning("flywheel mcp: asking the client failed: %s", exc)
            return self._cannot_ask(request, f"asking the client failed ({exc})")
        else:
            decision = decision_of(result)
        return None if decision.approved else declined_result(request, decision)

    def _cannot_ask(self, request: ApprovalRequest, why: str) -> ToolResult:
        what = "command" if request.kind == "command" else f"{request.name} call"
        return ToolResult.error(
            f"this {what} did not run: flywheel mcp runs in --approval-mode {self.mode}, which asks the user "
            f"before it, but {why}. To let the MCP client decide on its own, start the server with "
            "`flywheel mcp --approval-mode auto` (or FLYWHEEL_MCP_APPROVAL_MODE=auto); "
            "`--approval-mode ask-commands` asks about commands only.", approval="unavailable")

    # -- 2026-07-28: InputRequiredResult rounds ----------------------------------

    def _round(self, request: ApprovalRequest, params: types.CallToolRequestParams) -> ToolResult | \
            types.InputRequiredResult | None:
        answer = (params.input_responses or {}).get(ELICIT_KEY)
        if isinstance(answer, types.ElicitResult) and self._redeem(params.request_state, request):
            decision = decision_of(answer)
            return None if decision.approved else declined_result(request, decision)
        ask = types.ElicitRequest(params=types.ElicitRequestFormParams(
            message=self.message(request), requested_schema=REQUESTED_SCHEMA))
        return types.InputRequiredResult(input_requests={ELICIT_KEY: ask}, request_state=self._state(request))

    def _sign(self, payload: bytes) -> str:
        return hmac.new(self._key, payload, hashlib.sha256).hexdigest()

    def _state(self, request: ApprovalRequest) -> str:
        payload = json.dumps({"d": _digest(request), "n": secrets.token_hex(16), "t": time.time()}).encode()
        return base64.urlsafe_b64encode(payload).decode() + "." + self._sign(payload)

    def _redeem(self, state: str | None, request: ApprovalRequest) -> bool:
        """Whether ``state`` is one this process issued for this very call, unexpired and
        unused; it is used up if so."""
        now = time.time()
        for nonce in [n for n, until in self._spent.items() if until < now]:
            del self._spent[nonce]
        try:
            encoded, signature = (state or "").rsplit(".", 1)
            payload = base64.urlsafe_b64decode(encoded.encode())
            if not hmac.compare_digest(signature, self._sign(payload)):
                return False
            fields = json.loads(payload)
            digest, nonce, issued = fields["d"], str(fields["n"]), float(fields["t"])
        except (ValueError, KeyError, TypeError):
            return False
        if digest != _digest(request) or nonce in self._spent or not issued <= now <= issued + self.timeout_s:
            return False
        self._spent[nonce] = issued + self.timeout_s
        return True

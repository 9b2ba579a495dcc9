"""``flywheel acp``: Flywheel as an Agent Client Protocol agent for editors.

* :mod:`backend.acp.cli` -- the command (stdio, in-process or ``--server`` bridge);
* :mod:`backend.acp.transport` -- newline-delimited JSON-RPC on stdio, hardened;
* :mod:`backend.acp.agent` -- the ACP methods, one event pump per session;
* :mod:`backend.acp.sessions` -- the seam to Flywheel (:mod:`~backend.acp.local`:
  an in-process hub; :mod:`~backend.acp.remote`: a running server);
* :mod:`backend.acp.updates` -- events as ``session/update`` notifications;
* :mod:`backend.acp.permission` -- ``session/request_permission`` and the modes;
* :mod:`backend.acp.fs_bridge` -- file tools through the editor's buffers.

The JSON-RPC itself is the ``agent-client-protocol`` package's. ``docs/editors.md``
has the editor settings.
"""

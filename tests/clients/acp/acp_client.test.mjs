// `flywheel acp` driven by the official ACP TypeScript SDK (ClientSideConnection), as an
// editor drives it: spawned on stdio, on a temporary project, with a scripted policy.
// Run: `node --test tests/clients/acp/` (PYTHON names the interpreter; default python3).
// tests/backend/acp/test_ts_client.py runs it as part of the Python suite.
import { spawn } from "node:child_process";
import { mkdtempSync, mkdirSync, readFileSync, writeFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { Readable, Writable } from "node:stream";
import { test } from "node:test";
import assert from "node:assert/strict";
import { fileURLToPath } from "node:url";
import * as acp from "@agentclientprotocol/sdk";

const REPO = resolve(dirname(fileURLToPath(import.meta.url)), "..", "..", "..");
const PYTHON = process.env.PYTHON || "python3";
const CALC = "def add(a, b):\n    return a - b\n";
const FIXED = "def add(a, b):\n    return a + b\n";

const call = (name, params) =>
  `<tool_call name="${name}">\n` +
  Object.entries(params).map(([k, v]) => `<param name="${k}">${v}</param>\n`).join("") +
  "</tool_call>";

const FIX = [
  "Reading it.\n\n" + call("read_file", { path: "calc.py" }),
  "Fixing.\n\n" + call("edit_file", { path: "calc.py", search: "    return a - b\n", replace: "    return a + b\n" }),
  "Checking.\n\n" + call("run_command", { command: "python3 -c 'import calc; print(calc.add(2, 3))'" }),
  "Done: add() now adds.",
];

/** A temporary project and data directory, with a script of model outputs. */
function setup(outputs) {
  const dir = mkdtempSync(join(tmpdir(), "fw-acp-ts-"));
  const project = join(dir, "project");
  mkdirSync(project);
  writeFileSync(join(project, "calc.py"), CALC);
  const script = join(dir, "script.json");
  writeFileSync(script, JSON.stringify({ outputs }));
  return { dir, project, script, data: join(dir, "data"), cleanup: () => rmSync(dir, { recursive: true, force: true }) };
}

/** An editor: records updates and requests; `answer` picks the permission option. */
class Editor {
  constructor({ answer = "allow_once", buffers = {} } = {}) {
    this.answer = answer;
    this.buffers = buffers;
    this.updates = [];
    this.permissions = [];
    this.writes = [];
    this.waiters = [];
  }
  async requestPermission(params) {
    this.permissions.push(params);
    return { outcome: { outcome: "selected", optionId: this.answer } };
  }
  async sessionUpdate(params) {
    this.updates.push(params.update);
    this.waiters = this.waiters.filter(([pred, done]) => (pred(params.update) ? (done(), false) : true));
  }
  async readTextFile({ path }) {
    return { content: path in this.buffers ? this.buffers[path] : readFileSync(path, "utf8") };
  }
  async writeTextFile({ path, content }) {
    this.writes.push({ path, content });
    delete this.buffers[path];
    writeFileSync(path, content);
    return {};
  }
  until(pred) {
    return new Promise((done) => this.waiters.push([pred, done]));
  }
  of(kind) {
    return this.updates.filter((u) => u.sessionUpdate === kind);
  }
  text() {
    return this.of("agent_message_chunk").map((u) => u.content.text).join("");
  }
  forCall(id) {
    return this.updates.filter((u) => u.toolCallId === id);
  }
}

/** Spawn `flywheel acp` and connect the SDK's ClientSideConnection to it. */
async function connect(editor, env, ...args) {
  const child = spawn(PYTHON, ["-m", "backend.cli", "acp", "--data-dir", env.data, "--policy", `scripted:${env.script}`, ...args], {
    cwd: REPO,
    env: { ...process.env, PYTHONPATH: REPO, FLYWHEEL_SEMANTIC_SEARCH: "0" },
    stdio: ["pipe", "pipe", "inherit"],
  });
  const stream = acp.ndJsonStream(Writable.toWeb(child.stdin), Readable.toWeb(child.stdout));
  const conn = new acp.ClientSideConnection(() => editor, stream);
  const init = await conn.initialize({
    protocolVersion: acp.PROTOCOL_VERSION,
    clientCapabilities: { fs: { readTextFile: true, writeTextFile: true } },
  });
  assert.equal(init.protocolVersion, 1);
  assert.equal(init.agentCapabilities.loadSession, true);
  const close = () =>
    new Promise((done) => {
      child.once("exit", done);
      child.stdin.end();
    });
  return { conn, child, close };
}

const prompt = (conn, sessionId, text = "fix add") => conn.prompt({ sessionId, prompt: [{ type: "text", text }] });

test("a prompt streams chunks, tool calls with kinds and locations, diffs, and writes through the editor", async () => {
  const env = setup(FIX);
  const calc = join(env.project, "calc.py");
  const editor = new Editor({ buffers: { [calc]: "# unsaved\n" + CALC } });
  const { conn, close } = await connect(editor, env);
  try {
    const { sessionId, modes } = await conn.newSession({ cwd: env.project, mcpServers: [] });
    assert.deepEqual(modes.availableModes.map((m) => m.id), ["ask", "agent", "auto"]);
    const { stopReason } = await prompt(conn, sessionId);
    assert.equal(stopReason, "end_turn");
    assert.match(editor.text(), /Reading it\.[\s\S]*Done: add\(\) now adds\./);
    const starts = Object.fromEntries(editor.of("tool_call").map((u) => [u.toolCallId, u]));
    assert.deepEqual(["t1s1c0", "t1s2c0", "t1s3c0"].map((id) => starts[id].kind), ["read", "edit", "execute"]);
    assert.deepEqual(starts.t1s1c0.locations, [{ path: calc }]);
    assert.deepEqual(starts.t1s2c0.locations, [{ path: calc }]);
    const diffs = editor.forCall("t1s2c0").flatMap((u) => u.content || []).filter((c) => c.type === "diff");
    assert.deepEqual(diffs.at(-1), { type: "diff", path: calc, oldText: "# unsaved\n" + CALC, newText: "# unsaved\n" + FIXED });
    assert.deepEqual(editor.writes, [{ path: calc, content: "# unsaved\n" + FIXED }]);
    assert.deepEqual(editor.permissions.map((p) => [p.toolCall.toolCallId, p.toolCall.kind]), [["t1s3c0", "execute"]]);
    assert.deepEqual(editor.permissions[0].options.map((o) => o.kind), ["allow_once", "allow_always", "reject_once"]);
    const done = editor.forCall("t1s3c0").filter((u) => u.status === "completed").at(-1);
    assert.match(done.content[0].content.text, /\n5\n/);
  } finally {
    await close();
    env.cleanup();
  }
});

test("a rejected command does not run", async () => {
  const env = setup(FIX);
  const editor = new Editor({ answer: "reject_once" });
  const { conn, close } = await connect(editor, env);
  try {
    const { sessionId } = await conn.newSession({ cwd: env.project, mcpServers: [] });
    assert.equal((await prompt(conn, sessionId)).stopReason, "end_turn");
    const last = editor.forCall("t1s3c0").at(-1);
    assert.equal(last.status, "failed");
    assert.match(last.content[0].content.text, /declined this command; it did not run/);
  } finally {
    await close();
    env.cleanup();
  }
});

test("cancel mid-turn answers cancelled within a second", async () => {
  const env = setup([call("run_command", { command: "sleep 41.5" }), "never reached"]);
  const editor = new Editor();
  const { conn, close } = await connect(editor, env, "--mode", "auto");
  try {
    const { sessionId } = await conn.newSession({ cwd: env.project, mcpServers: [] });
    const running = editor.until((u) => u.toolCallId === "t1s1c0" && u.status === "in_progress");
    const turn = prompt(conn, sessionId);
    await running;
    await new Promise((r) => setTimeout(r, 200));
    const t0 = Date.now();
    await conn.cancel({ sessionId });
    const { stopReason } = await turn;
    const ms = Date.now() - t0;
    assert.equal(stopReason, "cancelled");
    assert.ok(ms < 1000, `cancel took ${ms} ms`);
    assert.equal(editor.forCall("t1s1c0").at(-1).status, "failed");
    assert.doesNotMatch(editor.text(), /never reached/);
  } finally {
    await close();
    env.cleanup();
  }
});

test("session/load replays the recorded history", async () => {
  const env = setup([...FIX, "Second answer."]);
  const first = new Editor();
  let sessionId;
  {
    const { conn, close } = await connect(first, env);
    sessionId = (await conn.newSession({ cwd: env.project, mcpServers: [] })).sessionId;
    await prompt(conn, sessionId);
    await close();
  }
  const again = new Editor();
  const { conn, close } = await connect(again, env);
  try {
    await conn.loadSession({ cwd: env.project, sessionId, mcpServers: [] });
    assert.deepEqual(again.updates[0], { sessionUpdate: "user_message_chunk", content: { type: "text", text: "fix add" } });
    assert.deepEqual(again.of("tool_call").map((u) => u.toolCallId), ["t1s1c0", "t1s2c0", "t1s3c0"]);
    assert.match(again.text(), /Done: add\(\) now adds\./);
    assert.equal(again.permissions.length, 0);
    assert.equal((await prompt(conn, sessionId, "and now?")).stopReason, "end_turn");
    assert.match(again.text(), /Second answer\./);
  } finally {
    await close();
    env.cleanup();
  }
});

// The WebSocket half of docs/protocol.md: one session's live event stream that survives dropped
// connections. It authenticates with the subprotocol `flywheel.token.<TOKEN>` (a browser cannot set
// headers; the token never goes into the URL), asks for `?after=<last seq seen>` on every
// (re)connect, and hands events to the listener in batches, once per animation frame, so a fast
// stream costs one render per frame rather than one per event. Duplicates (seq <= last) are dropped
// here; the server sends no gaps.
//
// Not guaranteed: a browser reports a refused handshake (401/403/404/410) as a plain close, so after
// a failed connect the stream asks the REST API what is wrong before it retries.

import { api, ApiError } from "./api";
import { getToken } from "./auth";
import type { BaseEvent } from "./events";

export type StreamState = "connecting" | "open" | "reconnecting" | "closed" | "failed";

export interface StreamStatus {
  state: StreamState;
  /** why the stream is reconnecting or failed, for the user */
  detail: string;
  /** connections opened so far (1 = never dropped) */
  connects: number;
}

export interface RequestError { type: "request_error"; status: number; message: string }

export interface StreamHandlers {
  onEvents(events: BaseEvent[]): void;
  onStatus(status: StreamStatus): void;
  onRequestError?(error: RequestError): void;
}

const CLOSE_REASONS: Record<number, string> = {
  1001: "the server is restarting",
  1006: "the connection dropped",
  1011: "the server had an internal error",
  4408: "this tab fell behind the stream",
};
const BACKOFF_MS = [0, 250, 500, 1000, 2000, 4000];

export class SessionStream {
  private ws: WebSocket | null = null;
  private lastSeq: number;
  private pending: BaseEvent[] = [];
  private flushScheduled = false;
  private attempts = 0;
  private timer: number | undefined;
  private stopped = false;
  private outbox: string[] = [];
  private status: StreamStatus = { state: "connecting", detail: "", connects: 0 };
  private readonly onOnline = () => this.reconnectNow();

  constructor(private readonly sessionId: string, after: number, private readonly handlers: StreamHandlers) {
    this.lastSeq = after;
    window.addEventListener("online", this.onOnline);
    this.connect();
  }

  /** The last seq handed to the listener (or about to be). */
  get seq(): number {
    return this.lastSeq;
  }

  get isOpen(): boolean {
    return this.ws?.readyState === WebSocket.OPEN;
  }

  /** Send a client message; approvals wait for the next connection if the socket is down. */
  send(message: Record<string, unknown>): boolean {
    const text = JSON.stringify(message);
    if (this.isOpen) {
      this.ws!.send(text);
      return true;
    }
    if (message.type === "approval") this.outbox.push(text);
    return false;
  }

  close(): void {
    this.stopped = true;
    window.removeEventListener("online", this.onOnline);
    window.clearTimeout(this.timer);
    this.ws?.close(1000);
    this.ws = null;
    this.setStatus("closed", "");
  }

  /** Drop the current socket and reconnect at once (the user asked, or the network came back). */
  reconnectNow(): void {
    if (this.stopped) return;
    window.clearTimeout(this.timer);
    this.attempts = 0;
    if (this.ws && this.ws.readyState === WebSocket.OPEN) return;
    this.ws?.close();
    this.connect();
  }

  private url(): string {
    const proto = location.protocol === "https:" ? "wss:" : "ws:";
    return `${proto}//${location.host}/v1/sessions/${encodeURIComponent(this.sessionId)}/ws?after=${this.lastSeq}`;
  }

  private connect(): void {
    if (this.stopped) return;
    const token = getToken();
    if (!token) {
      this.setStatus("failed", "signed out");
      return;
    }
    this.setStatus(this.status.connects === 0 ? "connecting" : "reconnecting", this.status.detail);
    let opened = false;
    const ws = new WebSocket(this.url(), [`flywheel.token.${token}`]);
    this.ws = ws;
    ws.onopen = () => {
      opened = true;
      this.attempts = 0;
      this.status.connects += 1;
      this.setStatus("open", "");
      for (const text of this.outbox.splice(0)) ws.send(text);
    };
    ws.onmessage = (msg) => {
      if (typeof msg.data !== "string") return;
      let data: { type?: string; seq?: number };
      try {
        data = JSON.parse(msg.data);
      } catch {
        return;
      }
      if (data.type === "request_error") {
        this.handlers.onRequestError?.(data as unknown as RequestError);
        return;
      }
      if (typeof data.seq !== "number" || data.seq <= this.lastSeq) return;
      this.lastSeq = data.seq;
      this.pending.push(data as BaseEvent);
      this.scheduleFlush();
    };
    ws.onclose = (ev) => {
      if (this.ws !== ws) return;
      this.ws = null;
      if (this.stopped) return;
      if (ev.code === 4410) {
        this.setStatus("failed", "the session's workspace is gone: branch the session or start a new one");
        return;
      }
      const why = CLOSE_REASONS[ev.code] ?? `the connection closed (${ev.code})`;
      if (!opened) void this.diagnose(why);
      else this.retry(why);
    };
  }

  /** A connect that never opened: ask REST whether it is worth retrying. */
  private async diagnose(why: string): Promise<void> {
    try {
      await api.session(this.sessionId);
    } catch (err) {
      if (err instanceof ApiError && [401, 403, 404, 410].includes(err.status)) {
        this.setStatus("failed", err.message);
        return;
      }
      why = err instanceof ApiError && err.status === 0 ? "the server cannot be reached" : why;
    }
    this.retry(why);
  }

  private retry(why: string): void {
    if (this.stopped) return;
    const delay = BACKOFF_MS[Math.min(this.attempts, BACKOFF_MS.length - 1)];
    this.attempts += 1;
    this.setStatus("reconnecting", `${why}; reconnecting from event ${this.lastSeq}`);
    this.timer = window.setTimeout(() => this.connect(), delay);
  }

  private scheduleFlush(): void {
    if (this.flushScheduled) return;
    this.flushScheduled = true;
    let done = false;
    const flush = () => {
      if (done) return;
      done = true;
      this.flushScheduled = false;
      const batch = this.pending;
      this.pending = [];
      if (batch.length) this.handlers.onEvents(batch);
    };
    requestAnimationFrame(flush);
    window.setTimeout(flush, 100); // hidden tabs get no animation frames
  }

  private setStatus(state: StreamState, detail: string): void {
    this.status = { ...this.status, state, detail };
    this.handlers.onStatus(this.status);
  }
}

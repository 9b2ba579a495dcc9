// The event stream of docs/protocol.md, as the app reads it. Clients ignore types they do not know,
// so every type here is optional to receive and unknown ones pass through as BaseEvent.

export interface BaseEvent {
  type: string;
  seq: number;
  session_id: string;
  ts: number;
  turn: number;
  /** seconds since the session's first event (only on /timeline entries) */
  t?: number;
  [key: string]: unknown;
}

export interface UserMessage extends BaseEvent { type: "user_message"; text: string }
export interface AssistantDelta extends BaseEvent { type: "assistant_delta"; step: number; text: string }
export interface ToolCallDelta extends BaseEvent {
  type: "tool_call_delta"; step: number; index: number; name: string; param: string; text: string;
}
export interface ToolCallStarted extends BaseEvent {
  type: "tool_call_started"; step: number; index: number; call_id: string; name: string | null;
  args: Record<string, unknown>; valid: boolean;
}
export interface ToolCallQueued extends BaseEvent {
  type: "tool_call_queued"; step: number; index: number; call_id: string; waiting_for: string[];
}
export interface ToolCallRunning extends BaseEvent { type: "tool_call_running"; step: number; index: number; call_id: string }
export interface ToolOutputDelta extends BaseEvent {
  type: "tool_output_delta"; step: number; index: number; call_id: string; text: string; cut: boolean;
}
export interface ApprovalRequested extends BaseEvent {
  type: "approval_requested"; step: number; index: number; call_id: string; name: string | null;
  args: Record<string, unknown>; kind: "command" | "edit";
}
export interface ApprovalResolved extends BaseEvent {
  type: "approval_resolved"; step: number; index: number; call_id: string; approved: boolean; reason: string;
  by: "user" | "recording";
}
export interface ToolResult extends BaseEvent {
  type: "tool_result"; step: number; index: number; call_id: string; name: string | null; ok: boolean;
  output: string; data: Record<string, unknown>; duration_ms: number;
}
export interface FileEdit extends BaseEvent {
  type: "file_edit"; call_id: string; path: string; diff: string; created: boolean; deleted: boolean;
}
export interface AssistantMessage extends BaseEvent {
  type: "assistant_message"; step: number; text: string; output_tokens: number; finish_reason: string | null;
}
export interface TurnEnd extends BaseEvent {
  type: "turn_end"; reason: string; steps: number; output_tokens: number; detail: string;
}
export interface ErrorEvent extends BaseEvent { type: "error"; message: string; source: string }
export interface FeedbackEvent extends BaseEvent {
  type: "feedback"; target: "turn" | "file"; of_turn: number | null; path: string | null;
  rating: "up" | "down" | null; verdict: "keep" | "revert" | null; comment: string; by: string; diff: string;
}

export type FlyEvent =
  | UserMessage | AssistantDelta | ToolCallDelta | ToolCallStarted | ToolCallQueued | ToolCallRunning
  | ToolOutputDelta | ApprovalRequested | ApprovalResolved | ToolResult | FileEdit | AssistantMessage
  | TurnEnd | ErrorEvent | FeedbackEvent;

/** The deterministic call id of docs/protocol.md: t{turn}s{step}c{index}. */
export function callId(turn: number, step: number, index: number): string {
  return `t${turn}s${step}c${index}`;
}

// Thumbs up/down with an optional comment on a finished turn. The answer goes to the session log
// (it becomes training data later) and comes back as a `feedback` event, which the transcript shows;
// `given` is the signed-in person's latest one.

import { useState } from "preact/hooks";
import type { FeedbackEvent } from "../lib/events";
import { feedback } from "../lib/feedback";
import { Icon } from "./Icon";
import { Problem } from "./Refused";

export function TurnFeedback({ sessionId, turn, given }: { sessionId: string; turn: number; given?: FeedbackEvent }) {
  const mine = given;
  const [rating, setRating] = useState<"up" | "down" | null>(null);
  const [comment, setComment] = useState("");
  const [error, setError] = useState<unknown>(null);

  async function submit(r: "up" | "down", c: string) {
    setError(null);
    try {
      await feedback.rateTurn(sessionId, turn, r, c);
      setRating(null);
      setComment("");
    } catch (err) {
      setError(err);
    }
  }
  const id = `fb-${turn}`;
  return (
    <div class="feedback" role="group" aria-label={`feedback on turn ${turn}`}>
      <button type="button" class={`thumb${mine?.rating === "up" ? " on" : ""}`} aria-pressed={mine?.rating === "up"}
              aria-label="good answer" onClick={() => setRating("up")}><Icon name="up" /></button>
      <button type="button" class={`thumb${mine?.rating === "down" ? " on" : ""}`} aria-pressed={mine?.rating === "down"}
              aria-label="bad answer" onClick={() => setRating("down")}><Icon name="down" /></button>
      {rating && (
        <form class="row" onSubmit={(e) => { e.preventDefault(); void submit(rating, comment); }}>
          <label for={id} class="visually-hidden">Comment (optional)</label>
          <input id={id} value={comment} maxLength={4000} placeholder="Comment (optional)"
                 onInput={(e) => setComment((e.target as HTMLInputElement).value)} />
          <button type="submit" class="primary small">Save {rating === "up" ? "good" : "bad"}</button>
          <button type="button" class="small" onClick={() => setRating(null)}>Cancel</button>
        </form>
      )}
      <Problem error={error} />
    </div>
  );
}

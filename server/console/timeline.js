// A turn's timeline (§11): its steps, as `GET …/turns/{turn_id}` reads them back from what the turn
// committed, each a bar on the turn's own time axis: what ran, how long, how many tokens, which attempt.

import { api, path } from "./api.js";
import { badge, fill, h } from "./dom.js";

const KINDS = { model: "model", tool: "tool", hook: "hook", permission: "waited", compaction: "compacted" };
const OK = new Set(["ok", "allowed", "completed"]);
// CORRAL_TRACE_URL: where the user's tracing UI shows a trace (`{trace_id}` filled in), if set
const TRACE_URL = document.querySelector('meta[name="corral-trace-url"]')?.content || "";

function traceLink(traceId) {
  if (!traceId) return null;
  const code = h("code.trace", { title: `trace ${traceId}` }, traceId.slice(0, 12));
  if (!TRACE_URL.includes("{trace_id}")) return code;
  return h("a.trace-link", { href: TRACE_URL.replaceAll("{trace_id}", traceId), target: "_blank",
    rel: "noopener noreferrer" }, "Open trace ", code);
}

function at(iso, fallback) { return iso ? Date.parse(iso) : fallback; }

export function duration(ms) {
  if (ms < 1000) return `${Math.max(0, Math.round(ms))} ms`;
  return ms < 60_000 ? `${(ms / 1000).toFixed(ms < 10_000 ? 2 : 1)} s` : `${Math.round(ms / 1000)} s`;
}

function tokens(usage) {
  if (!usage) return null;
  return h("span.step-tokens", { title: "input and output tokens" },
    `${usage.input_tokens ?? 0} in · ${usage.output_tokens ?? 0} out`);
}

function row(step, t0, span, now) {
  const start = at(step.started_at, t0) - t0;
  const end = at(step.ended_at, now) - t0;
  const bar = h("span.bar", { style: `left:${(start / span) * 100}%;`
    + `width:${Math.max(((end - start) / span) * 100, 0.8)}%` });
  const outcome = OK.has(step.outcome) ? null : badge(step.outcome || "running");
  return h(`li.step.k-${step.kind}${OK.has(step.outcome) ? "" : ".off"}`, {},
    h("span.step-kind", {}, KINDS[step.kind] || step.kind),
    h("span.step-name", { title: step.name }, step.name),
    h("span.track", { "aria-hidden": "true" }, bar),
    h("span.step-time", {}, step.ended_at ? duration(end - start) : "running…"),
    h("span.step-extra", {}, step.attempt > 1 ? h("span.tag", {}, `attempt ${step.attempt}`) : null,
      tokens(step.usage), outcome));
}

/** The timeline of `turn` (the GET answer), or nothing when it has no steps yet. */
export function timeline(turn) {
  const steps = turn.steps || [];
  if (!steps.length) return null;
  const now = Date.now();
  const t0 = Math.min(...steps.map((s) => at(s.started_at, now)));
  const last = Math.max(...steps.map((s) => at(s.ended_at, now)));
  const span = Math.max(last - t0, 1);
  const usage = turn.usage && (turn.usage.input_tokens || turn.usage.output_tokens) ? turn.usage : null;
  return h("section.timeline", { "aria-label": "Timeline" },
    h("div.timeline-head", {}, h("span.timeline-title", {}, "Timeline"),
      h("span.muted", {}, `${steps.length} steps · ${duration(last - t0)}`),
      usage ? h("span.muted", {}, ` · ${usage.input_tokens} in · ${usage.output_tokens} out`) : null,
      turn.attempts > 1 ? h("span.tag", {}, `${turn.attempts} attempts`) : null,
      traceLink(turn.trace_id)),
    h("ol.steps-timeline", {}, steps.map((s) => row(s, t0, span, now))));
}

async function read(conversationId, turnId, holder) {
  try {
    fill(holder, timeline(await api(path("/v1/conversations/{}/turns/{}", conversationId, turnId))));
  } catch { /* the turn is gone (its conversation deleted): nothing to show */ }
}

// A long transcript replays every turn's events at once: each timeline is read when its turn is
// on screen, not all of them as the page opens.
const visible = new IntersectionObserver((entries) => {
  for (const entry of entries) {
    if (!entry.isIntersecting) continue;
    visible.unobserve(entry.target);
    entry.target.load?.();
  }
}, { rootMargin: "200px" });

/** Show the turn's timeline in `holder`, read now if it is on screen, else once it scrolls into view
 *  (a failed read leaves the holder as it was). */
export function loadTimeline(conversationId, turnId, holder) {
  holder.load = () => read(conversationId, turnId, holder);
  visible.unobserve(holder);
  visible.observe(holder);
}

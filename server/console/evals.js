// Evals beside each digest (§12): an agent digest's results, the two sides of a diff, a swap's runs.

import { api, path } from "./api.js";
import { attempt, badge, digest, fill, h, table, time } from "./dom.js";
import { state } from "./state.js";

/** The outcome of a run as a badge: passed, failed, error, running; "not run" when there is none. */
export function outcome(run) {
  if (!run) return h("span.badge.s-none", {}, "not run");
  const score = run.score === null || run.score === undefined ? "" : ` ${Math.round(run.score * 100)}%`;
  return h("span", { title: run.id }, badge(run.status), h("span.muted", {}, score));
}

/** A run seen on `/v1/events`: kept by agent digest, for the feed and the agent page. */
export function runSeen(run) {
  const runs = state.evalRuns.get(run.agent_digest) || new Map();
  runs.set(run.eval, run);
  state.evalRuns.set(run.agent_digest, runs);
}

/** `#/agent/{ref}`'s Evals card: each Eval of the agent at its current digest, on this digest. */
export async function renderEvals(box, ref) {
  const found = await attempt(() => api(path("/v1/agents/{}/evals", ref)), "Evals");
  if (!found) return;
  if (!found.items.length) {
    fill(box, h("p.muted", {}, "No Evals check this agent."));
    return;
  }
  const run = async (name) => {
    const started = await attempt(() => api(path("/v1/evals/{}/runs", name),
      { method: "POST", body: { agent: `${found.agent}@${found.digest}` } }), `Run ${name}`);
    if (started) { runSeen(started); renderEvals(box, ref); }
  };
  fill(box, h("p.muted", {}, "The latest run of each Eval on ", digest(found.digest), ":"),
    table(["Eval", "Eval digest", "Result", "Ended", ""], found.items.map((e) => [
      h("strong", {}, e.name), digest(e.digest), outcome(e.latest_run), time(e.latest_run?.ended_at),
      h("button.small", { type: "button", "aria-label": `Run ${e.name}`, onclick: () => run(e.name) },
        "Run")])));
}

/** The evals of two digests of an agent, side by side (the diff's before and after). */
export async function evalsDiff(name, from, to) {
  const [a, b] = await Promise.all([from, to].map((d) =>
    api(path("/v1/agents/{}/evals", `${name}@${d}`)).catch(() => null)));
  if (!a || !b || !b.items.length) return null;
  const before = new Map(a.items.map((e) => [e.name, e]));
  return h("div.evals-diff", {}, h("h3", {}, "Evals"),
    table(["Eval", "From", "To"], b.items.map((e) => [e.name, outcome(before.get(e.name)?.latest_run),
      outcome(e.latest_run)])));
}

const FEED_SWAPS = 10; // the newest applied swaps whose digests' results a fresh page reads

/**
 * On a fresh load (or a resync), the results of the agent digests the newest applied swaps brought in,
 * so the feed shows them beside their swap without waiting for the next `eval.finished`.
 */
export async function loadSwapEvals() {
  const wanted = new Map();
  for (const swap of state.swaps.filter((s) => s.status === "applied").slice(0, FEED_SWAPS)) {
    for (const c of swap.changes || []) {
      if (c.kind === "Agent" && c.to && !state.evalRuns.has(c.to)) wanted.set(c.to, c.name);
    }
  }
  await Promise.all([...wanted].map(async ([digestValue, name]) => {
    const found = await api(path("/v1/agents/{}/evals", `${name}@${digestValue}`)).catch(() => null);
    for (const e of found?.items || []) if (e.latest_run) runSeen(e.latest_run);
  }));
}

/** The eval runs of the agent digests a swap brought in, as far as this page has seen them. */
export function swapEvals(report) {
  const rows = [];
  for (const c of report.changes || []) {
    if (c.kind !== "Agent" || !c.to) continue;
    for (const run of (state.evalRuns.get(c.to) || new Map()).values()) rows.push([c.name, run]);
  }
  if (!rows.length) return null;
  return h("ul.swap-evals", { "aria-label": "Eval runs" }, rows.map(([agent, run]) => h("li", {},
    h("span.kind", {}, "eval"), h("strong", {}, run.eval), h("span.muted", {}, ` on ${agent} `),
    outcome(run))));
}

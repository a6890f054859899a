// The overview (`#/`): what the server serves now, its agents, its replicas.

import { api } from "./api.js";
import { badge, digest, fill, h, table, time } from "./dom.js";
import { state } from "./state.js";

function stat(label, ...value) {
  return h("div.stat", {}, h("div.stat-label", {}, label), value);
}

export async function homeView(main) {
  const replicas = await api("/v1/replicas").then((r) => r.items).catch(() => []);
  const counts = {};
  for (const d of state.definitions) counts[d.kind] = (counts[d.kind] || 0) + 1;
  const last = state.swaps[0];
  fill(main, h("div.view", {},
    h("div.view-head", {}, h("div", {}, h("h1", {}, "Overview"),
      h("p.muted", {}, "What this server serves now. Edit a definition file and watch the swap land "
        + "on the right."))),
    h("div.stats", {},
      stat("Definition set", digest(state.setDigest)),
      stat("Agents", h("div.stat-value", {}, String(counts.Agent || 0))),
      stat("Definitions", h("div.stat-value", {}, String(state.definitions.length)),
        h("div.muted", {}, Object.entries(counts).map(([k, n]) => `${n} ${k}`).join(" · "))),
      stat("Last swap", last ? h("div", {}, badge(last.status), " ", time(last.at))
        : h("div.muted", {}, "none yet"))),
    h("section.card", {}, h("h2", {}, "Agents"), h("div.agent-cards", {}, state.agents.map((a) =>
      h("a.agent-card", { href: `#/agent/${encodeURIComponent(a.name)}` }, h("strong", {}, a.name),
        h("span.muted", {}, a.description || ""), digest(a.digest, { copy: false }),
        h("span.muted.small", {}, [a.model, ...a.tools].join(" · ")))))),
    replicas.length ? h("section.card", {}, h("h2", {}, "Replicas"),
      table(["Replica", "Set digest", "Running turns", "Heartbeat"], replicas.map((r) => [
        h("span", {}, r.id, r.self ? h("span.tag", {}, "this one") : null), digest(r.set_digest),
        String(r.running_turns), time(r.heartbeat_at)]))) : null));
}

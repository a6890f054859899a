// Agents: the sidebar list, an agent's page (closure, aliases, diff), every definition, a spec.

import { api, path } from "./api.js";
import { closureDiff } from "./diff.js";
import { evalsDiff, renderEvals } from "./evals.js";
import { attempt, digest, fill, h, json, short, table, time, where } from "./dom.js";
import { digestBefore, knownDigests, loadAliases, state } from "./state.js";

export function renderAgentList(current) {
  const list = document.getElementById("agents");
  fill(list, state.agents.length ? state.agents.map((a) => {
    const href = `#/agent/${encodeURIComponent(a.name)}`;
    const go = (e) => { if (!e.target.closest("a, button")) location.hash = href; };
    return h("li.row.agent-row", { onclick: go },
      h("div.agent-line", {},
        h("a.name", { href, "aria-current": current === a.name ? "page" : false }, a.name), digest(a.digest)),
      h("div.sub", {}, a.description || `model ${a.model}`));
  }) : h("li.empty", {}, "No agents are served."));
}

/** The spec of one definition, in a dialog. */
export function showSpec(d) {
  const dialog = document.getElementById("spec-dialog");
  fill(document.getElementById("spec-h"), `${d.kind} ${d.name}`);
  fill(document.getElementById("spec-body"),
    h("div.facts-inline", {}, digest(d.digest), h("span.source", {}, where(d.source))),
    json(d.spec));
  if (!dialog.open) dialog.showModal();
}

async function openSpec(kind, name) {
  const d = await attempt(() => api(path("/v1/definitions/{}/{}", kind.toLowerCase(), name)), "Spec");
  if (d) showSpec(d);
}

function sourceButton(d, onclick) {
  return h("button.link.source", { type: "button", onclick, title: `Show the spec of ${d.kind} ${d.name}`,
    "aria-label": `Spec of ${d.kind} ${d.name} at ${where(d.source)}` }, where(d.source));
}

/** `#/definitions`: every definition being served, each with its source. */
export function definitionsView(main) {
  const kinds = ["Agent", "Model", "Tool", "MCPServer", "Hook", "Skill", "Eval"];
  const rows = [...state.definitions].sort((a, b) =>
    kinds.indexOf(a.kind) - kinds.indexOf(b.kind) || a.name.localeCompare(b.name));
  fill(main, h("div.view", {},
    h("div.view-head", {}, h("div", {}, h("h1", {}, "Definitions"),
      h("p.muted", {}, `${rows.length} definitions in set `, digest(state.setDigest)))),
    h("section.card", {}, table(["Kind", "Name", "Digest", "Source"], rows.map((d) => [
      h("span.kind", {}, d.kind), d.name, digest(d.digest),
      sourceButton(d, () => openSpec(d.kind, d.name))])))));
}

/** `#/agent/{ref}`: an agent (at its current digest, or the one `ref` pins). */
export async function agentView(main, ref, isCurrent) {
  const name = ref.split("@")[0];
  const [closure] = await Promise.all([api(path("/v1/agents/{}/closure", ref)), loadAliases(name)]);
  if (!isCurrent()) return;
  const aliasesBox = h("div");
  const diffBox = h("div");
  const evalsBox = h("div", {}, h("p.muted", {}, "Loading…"));
  fill(main, h("div.view", {}, agentHead(name, closure), agentFacts(closure, ref),
    card("closure-h", "Closure",
      h("p.muted", {}, "Everything a turn of this digest runs on: change any of them and the agent's "
        + "digest changes."),
      table(["Kind", "Name", "Digest", "Source"], closure.definitions.map((d) => [
        h("span.kind", {}, d.kind), d.name, digest(d.digest), sourceButton(d, () => showSpec(d))]))),
    card("evals-h", "Evals", evalsBox),
    card("aliases-h", "Aliases", aliasesBox),
    card("diff-h", "Compare digests", diffBox)));
  const refresh = () => { // an alias moved: its row, and the digests the selects name
    renderAliases(aliasesBox, name, refresh);
    renderCompare(diffBox, name, closure.digest);
  };
  refresh();
  renderEvals(evalsBox, `${name}@${closure.digest}`);
}

function card(id, title, ...children) {
  return h("section.card", { "aria-labelledby": id }, h("h2", { id }, title), children);
}

function agentHead(name, closure) {
  const pinned = state.agents.find((a) => a.name === name)?.digest !== closure.digest;
  const ref = pinned ? `${name}@${closure.digest}` : name;
  return h("div.view-head", {},
    h("div", {},
      h("h1", {}, name, h(pinned ? "span.tag.warn" : "span.tag", {}, pinned ? "not current" : "current")),
      h("p.muted", {}, closure.definitions[0].spec.description || "")),
    h("div.head-actions", {},
      h("a.button.primary", { href: `#/new?agent=${encodeURIComponent(ref)}` },
        pinned ? "Chat with this digest" : "Chat"),
      h("a.button", { href: `#/conversations?agent=${encodeURIComponent(name)}` }, "Conversations")));
}

function agentFacts(closure, ref) {
  const agent = closure.definitions[0];
  // how other programs reach it: the MCP tool named after it, and its A2A card (of the reference shown)
  const card = `${location.origin}/a2a/${ref}/.well-known/agent-card.json`;
  const facts = [["Digest", digest(closure.digest)], ["Source", sourceButton(agent, () => showSpec(agent))],
    ["Model", agent.spec.model], ["On busy", agent.spec.on_busy],
    ["Max steps", String(agent.spec.max_steps)], ["MCP tool", h("code", {}, agent.name)],
    ["A2A card", h("code.a2a-card", { title: "The agent's A2A card (version = its digest)" }, card)]];
  return h("dl.facts", {}, facts.map(([term, value]) => [h("dt", {}, term), h("dd", {}, value)]));
}

function field(id, label, control) {
  return h("div.field", {}, h("label", { for: id }, label), control);
}

function digestSelect(id, name, selected) {
  const options = knownDigests(name);
  if (selected && !options.some((o) => o.digest === selected)) {
    options.unshift({ digest: selected, why: ["shown"] });
  }
  return h("select", { id }, options.map((o) => h("option", { value: o.digest, title: o.digest,
    selected: o.digest === selected }, `${short(o.digest)}  ${o.why.join(", ")}`)));
}

function renderAliases(box, name, changed) {
  const aliases = state.aliases.get(name) || [];
  const rows = aliases.map((a) => {
    const back = digestBefore(name, a.digest);
    return [h("strong.mono", {}, `@${a.alias}`), [digest(a.digest), canaryLine(name, a, changed)],
      time(a.updated_at),
      h("div.row-actions", {},
        h("button.small", { type: "button", disabled: !back, "aria-label": `Roll back ${a.alias}`,
          title: back ? `Point @${a.alias} at ${back}, the digest served before this one`
            : "The swap history shows no earlier digest",
          onclick: () => point(name, a.alias, back, changed) },
        "Roll back"),
        h("button.small.danger", { type: "button", "aria-label": `Remove ${a.alias}`,
          onclick: () => remove(name, a.alias, changed) }, "Remove"),
        h("a.button.small", { href: `#/new?agent=${encodeURIComponent(`${name}@${a.alias}`)}`,
          "aria-label": `Chat with ${name}@${a.alias}` }, "Chat"))];
  });
  const alias = h("input", { id: "alias-name", placeholder: "prod", spellcheck: false, autocomplete: "off",
    required: true, pattern: "[a-z0-9][a-z0-9_.\\-]{0,62}" });
  const select = digestSelect("alias-digest", name, state.agents.find((a) => a.name === name)?.digest);
  const submit = (e) => { e.preventDefault(); point(name, alias.value, select.value, changed); };
  const form = h("form.inline", { onsubmit: submit },
    field("alias-name", "Alias", alias), field("alias-digest", "Digest", select),
    h("button.primary", { type: "submit" }, "Point alias"));
  fill(box, rows.length ? table(["Alias", "Digest", "Updated", ""], rows)
    : h("p.muted", {}, `No aliases yet: point one at a digest, then chat with ${name}@ALIAS.`), form);
}

/** An alias's canary: its digest and weight, each side's conversations and turns, Promote and End. */
function canaryLine(name, a, changed) {
  if (!a.canary) return a.require_evals ? h("div.sub", {}, "requires passing evals") : null;
  const side = (s) => (s ? `${s.conversations} conv., ${s.turns_completed} ok, ${s.turns_failed} failed` : "");
  const act = (method, suffix, what) => async () => {
    const done = await attempt(() => api(path(`/v1/agents/{}/aliases/{}/${suffix}`, name, a.alias), { method }),
      what);
    if (done === undefined) return;
    await attempt(() => loadAliases(name), "Aliases");
    changed();
  };
  return h("div.canary", { "aria-label": `Canary of ${a.alias}` },
    h("span.tag.warn", {}, `canary ${Math.round(a.canary.weight * 100)}%`), " ", digest(a.canary.digest),
    h("div.sub", {}, `stable: ${side(a.sides?.stable)} · canary: ${side(a.sides?.canary)}`
      + (a.require_evals ? " · requires passing evals" : "")),
    h("button.small", { type: "button", "aria-label": `Promote the canary of ${a.alias}`,
      onclick: act("POST", "promote", `Promote @${a.alias}`) }, "Promote"),
    h("button.small", { type: "button", "aria-label": `End the canary of ${a.alias}`,
      onclick: act("DELETE", "canary", `End the canary of @${a.alias}`) }, "End canary"));
}

async function point(name, alias, digestValue, changed) {
  const done = await attempt(() => api(path("/v1/agents/{}/aliases/{}", name, alias),
    { method: "PUT", body: { digest: digestValue } }), `Point @${alias}`);
  if (!done) return; // the table shows where it points now
  await attempt(() => loadAliases(name), "Aliases");
  changed();
}

async function remove(name, alias, changed) {
  if (await attempt(() => api(path("/v1/agents/{}/aliases/{}", name, alias), { method: "DELETE" }),
    `Remove @${alias}`) === undefined) return;
  await attempt(() => loadAliases(name), "Aliases");
  changed();
}

function renderCompare(box, name, shown) {
  const known = knownDigests(name);
  const older = known.find((k) => k.digest !== shown)?.digest || shown;
  const from = digestSelect("diff-from", name, older);
  const to = digestSelect("diff-to", name, shown);
  const out = h("div.diff-out");
  const run = async () => {
    const [a, b] = await Promise.all([from.value, to.value].map((d) =>
      attempt(() => api(path("/v1/agents/{}/closure", `${name}@${d}`)), "Compare")));
    if (a && b) fill(out, closureDiff(a, b), await evalsDiff(name, from.value, to.value));
  };
  fill(box, h("form.inline", { onsubmit: (e) => { e.preventDefault(); run(); } },
    field("diff-from", "From digest", from), field("diff-to", "To digest", to),
    h("button", { type: "submit" }, "Compare")), out);
  if (older !== shown) run();
}

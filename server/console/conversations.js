// Conversations: the filtered list, a transcript streaming live, and the chat composer.

import { all, api, path, stream } from "./api.js";
import { contextMeter, conversationActions } from "./controls.js";
import { attempt, badge, digest, fill, h, json, time, toast } from "./dom.js";
import { state } from "./state.js";
import { loadTimeline } from "./timeline.js";

const rows = new Map(); // conversation id -> its list row's badge holder

function filters() {
  return { agent: document.getElementById("f-agent").value,
    status: document.getElementById("f-status").value,
    digest: document.getElementById("f-digest").value.trim() };
}

export function renderAgentFilter() {
  const select = document.getElementById("f-agent");
  const chosen = select.value;
  fill(select, h("option", { value: "" }, "All agents"),
    state.agents.map((a) => h("option", { value: a.name, selected: a.name === chosen }, a.name)));
}

export function setAgentFilter(name) {
  renderAgentFilter();
  document.getElementById("f-agent").value = name;
}

let listing = null;
export async function loadConversations() {
  const ticket = (listing = {});
  const query = new URLSearchParams(Object.entries(filters()).filter(([, v]) => v));
  const items = await all(`/v1/conversations${query.size ? `?${query}` : ""}`, 100);
  if (ticket !== listing) return; // a newer load has started
  const open = location.hash.match(/^#\/conversation\/([^/?]+)/)?.[1];
  rows.clear();
  fill(document.getElementById("conversations"), items.length ? items.map((c) => {
    const status = h("span.status", {}, badge(c.status));
    rows.set(c.id, status);
    return h("li.row", {},
      h("a.row-main", { href: `#/conversation/${c.id}`, "aria-current": open === c.id ? "page" : false },
        h("span.name", {}, c.title || c.agent),
        h("span.sub", {}, h("code", { title: c.id }, c.id.replace(/^conv_/, "").slice(0, 10)), " · ",
          time(c.updated_at))),
      status);
  }) : h("li.empty", {}, "No conversations match."));
}

/** A status change from `/v1/events`: update the row, or reload the list if it is not shown. */
export function statusChanged({ conversation_id: id, status }) {
  const holder = rows.get(id);
  if (holder) fill(holder, badge(status));
  else if (!filters().status || filters().status === status) scheduleReload();
  if (view?.id === id) view.status(status);
}

let timer = null;
export function scheduleReload() {
  clearTimeout(timer);
  timer = setTimeout(() => attempt(loadConversations, "Conversations"), 250);
}

export function wireFilters() {
  for (const id of ["f-agent", "f-status"]) {
    document.getElementById(id).addEventListener("change", scheduleReload);
  }
  document.getElementById("f-digest").addEventListener("input", scheduleReload);
}

function composer(onSend, extra = []) {
  const box = h("textarea", { id: "message", rows: 3, placeholder: "Write a message…  (Ctrl+Enter sends)",
    required: true });
  const form = h("form.composer", { onsubmit: (e) => {
    e.preventDefault();
    const content = box.value.trim();
    if (!content) return;
    box.value = "";
    onSend(content);
  } }, extra, h("label", { for: "message" }, "Message"), h("div.composer-row", {}, box,
    h("button.primary", { type: "submit" }, "Send")));
  box.addEventListener("keydown", (e) => {
    if (e.key === "Enter" && (e.ctrlKey || e.metaKey)) form.requestSubmit();
  });
  return form;
}

async function send(id, content) {
  await attempt(() => api(path("/v1/conversations/{}/messages", id), { method: "POST", body: { content } }),
    "Send");
}

/** `#/new?agent=REF`: start a conversation with any reference (name, name@sha256:…, name@alias). */
export function newChatView(main, ref) {
  const refs = [];
  for (const a of state.agents) {
    refs.push(a.name, `${a.name}@${a.digest}`);
    for (const alias of state.aliases.get(a.name) || []) refs.push(`${a.name}@${alias.alias}`);
  }
  const agent = h("input", { id: "agent-ref", value: ref || state.agents[0]?.name || "", spellcheck: false,
    autocomplete: "off", list: "agent-refs", required: true });
  fill(main, h("div.view.chat-view", {},
    h("div.view-head", {}, h("div", {}, h("h1", {}, "New chat"),
      h("p.muted", {}, "Name an agent (its current digest), pin a digest (name@sha256:…) or follow an "
        + "alias (name@alias)."))),
    h("div.spacer"),
    composer(async (content) => {
      const body = { agent: agent.value.trim() };
      const created = await attempt(() => api("/v1/conversations", { method: "POST", body }),
        "New conversation");
      if (!created) return;
      location.hash = `#/conversation/${created.id}`;
      scheduleReload();
      await send(created.id, content);
    }, [h("div.pick", { role: "group", "aria-label": "Pick an agent" }, state.agents.map((a) =>
      h("button.small", { type: "button", title: a.description || a.name,
        onclick: () => { agent.value = a.name; document.getElementById("message").focus(); } }, a.name))),
    h("label", { for: "agent-ref" }, "Agent reference"), agent,
    h("datalist", { id: "agent-refs" }, refs.map((r) => h("option", { value: r })))])));
  document.getElementById("message").focus();
}

let view = null; // the open conversation: {id, status(s)}

/** `#/conversation/{id}`: the transcript, replayed then live, and the composer. */
export async function conversationView(main, id, signal) {
  const conv = await api(path("/v1/conversations/{}", id), { signal });
  const turns = new Map((await all(path("/v1/conversations/{}/turns", id))).map((t) => [t.id, t]));
  const statusBox = h("span", {}, badge(conv.status));
  const interrupt = h("button.small.danger", { type: "button", hidden: conv.status === "idle",
    onclick: () => attempt(() => api(path("/v1/conversations/{}/interrupt", id), { method: "POST" }),
      "Interrupt") }, "Interrupt");
  const transcript = h("ol.transcript", { "aria-label": "Transcript" });
  const heading = h("h1", {}, conv.title || `Chat with ${conv.agent_name}`);
  const meter = contextMeter(id);
  const changed = (what, body) => {
    if (what === "forked") location.hash = `#/conversation/${body.id}`;
    if (what === "renamed") fill(heading, body.title || `Chat with ${conv.agent_name}`);
    if (what === "archived") toast("Archived: it leaves the list (it stays readable here)");
    scheduleReload();
  };
  fill(main, h("div.view.chat-view", {},
    h("div.view-head", {},
      h("div", {}, heading,
        h("p.meta", {}, h("code.mono", { title: "Conversation id" }, conv.id), " · ",
          h("a", { href: `#/agent/${encodeURIComponent(conv.agent)}` }, conv.agent),
          conv.pinned ? h("span.tag", {}, "pinned") : null, " · ", statusBox),
        h("p.meta", {}, h("span", {}, "Context"), meter)),
      h("div.head-actions", {}, conversationActions(conv, meter, changed), interrupt)),
    transcript,
    composer((content) => send(id, content))));
  view = { id, status: (s) => { fill(statusBox, badge(s)); interrupt.hidden = s === "idle"; } };
  const render = renderer(transcript, turns, id, () => meter.refresh());
  let last = 0;
  while (!signal.aborted) { // the stream ends on a server restart: resume where it stopped
    try {
      await stream(path("/v1/conversations/{}/events", id), { signal, lastEventId: last,
        onEvent: (e) => { last = e.id ?? last; render(e); } });
    } catch (error) {
      if (error.status === 401 || error.status === 404) return; // no key any more, or no conversation
    }
    await new Promise((r) => setTimeout(r, 1000));
  }
}

// What each conversation event does to its turn's block (`b`): {el, state, input, steps, answer}.
const ON = {
  "message.delta": (b, d) => { b.answer.textContent += d.text; },
  "tool.started": (b, d) => { b.steps.append(toolCard(d)); },
  "tool.finished": (b, d) => {
    finishTool(b.steps, d);
    if (b.state.textContent === "waiting") fill(b.state, badge("running"));
  },
  "permission.requested": (b, d) => { fill(b.state, badge("waiting")); waitOn(b.steps, d, b.conversationId); },
  "turn.completed": (b, d) => {
    fill(b.state, badge("completed"));
    b.answer.textContent = d.output ?? b.answer.textContent;
  },
  "turn.failed": (b, d) => {
    fill(b.state, badge("failed"));
    b.steps.append(h("div.note.error", {}, `${d.error?.code}: ${d.error?.message}`));
  },
  "turn.cancelled": (b) => { fill(b.state, badge("cancelled")); },
};

const TIMED = new Set(["permission.requested", "tool.finished", "turn.completed", "turn.failed",
  "turn.cancelled"]); // events after which a turn's timeline is read again

function renderer(list, turns, conversationId, ended) {
  const blocks = new Map();
  const said = (b, input) => fill(b.input, h("span.who", {}, "You"), input);
  function start(data) {
    const known = turns.get(data.turn_id);
    const b = { answer: h("div.answer"), steps: h("div.steps"), input: h("div.said"),
      state: h("span", {}, badge(known?.status || "running")), timeline: h("div.timeline-holder"),
      conversationId };
    b.el = h("li.turn", {},
      h("div.turn-head", {},
        h("span.turn-id", { title: data.turn_id }, data.turn_id.replace(/^turn_/, "").slice(0, 10)),
        digest(data.digest, { label: "ran on" }), b.state),
      b.input, b.steps, b.answer, b.timeline);
    blocks.set(data.turn_id, b);
    list.append(b.el);
    if (known) said(b, known.input);
    else { // a turn that started after the page loaded: its input is in the store by now
      all(path("/v1/conversations/{}/turns", conversationId)).then((ts) => {
        const t = ts.find((x) => x.id === data.turn_id);
        if (t) said(b, t.input);
      }).catch(() => {});
    }
    return b;
  }
  return ({ name, data }) => {
    const pane = list.closest(".main");
    const following = pane && pane.scrollHeight - pane.scrollTop - pane.clientHeight < 120;
    const id = data.turn_id || [...blocks.keys()].pop();
    if (name === "turn.started") start(data);
    else if (id) {
      const b = blocks.get(id) || start({ turn_id: id });
      if (ON[name]) ON[name](b, data);
      else b.steps.append(h("div.note", {}, `${name} `, h("code", {}, JSON.stringify(data))));
      if (TIMED.has(name)) loadTimeline(conversationId, id, b.timeline);
      if (name.startsWith("turn.") && name !== "turn.resumed") ended();
    }
    if (following) pane.scrollTop = pane.scrollHeight; // unless the reader scrolled up
  };
}

function toolCard(data) {
  return h("details.tool", { open: true, "data-call": data.tool_call_id },
    h("summary", {}, h("span.tool-name", {}, data.name), h("span.muted", {}, " tool call "),
      h("span.tool-state", {}, "running…")),
    h("div.tool-io", {}, h("div.io-label", {}, "Input"), json(data.arguments ?? {})));
}

function cardOf(steps, data) {
  return [...steps.querySelectorAll("details.tool")].find((d) => d.dataset.call === data.tool_call_id)
    || (steps.append(toolCard(data)), steps.lastElementChild);
}

function waitOn(steps, data, conversationId) {
  const c = cardOf(steps, data);
  fill(c.querySelector(".tool-state"), "waiting for permission");
  const answer = (decision) => attempt(() => api(path("/v1/conversations/{}/permissions/{}", conversationId,
    data.request_id), { method: "POST", body: { decision } }), decision === "allow" ? "Allow" : "Deny");
  c.append(h("div.note.waiting", {}, h("span", {}, "Asks permission to run"),
    h("span.row-actions", {},
      h("button.small.danger", { type: "button", onclick: () => answer("deny") }, "Deny"),
      h("button.small.primary", { type: "button", onclick: () => answer("allow") }, "Allow"))));
}

function finishTool(steps, data) {
  const card = cardOf(steps, data);
  card.querySelector(".note.waiting")?.remove();
  card.classList.toggle("failed", !!data.is_error);
  const outcome = data.is_error ? "error" : data.outcome === "unknown" ? "outcome unknown" : "done";
  fill(card.querySelector(".tool-state"), outcome);
  card.querySelector(".tool-io").append(h("div.io-label", {}, "Result"), json(data.content ?? ""));
}


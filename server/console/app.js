// The console's entry: the API key, the views behind the location hash, and `/v1/events`.

import { agentView, definitionsView, renderAgentList } from "./agents.js";
import { api, auth, onUnauthorized, stream } from "./api.js";
import {
  conversationView, loadConversations, newChatView, renderAgentFilter, scheduleReload, setAgentFilter,
  statusChanged, wireFilters,
} from "./conversations.js";
import { attempt, digest, fill, h, toast } from "./dom.js";
import {
  addReport, loadPermissions, reloadNow, renderBanner, renderFeed, schedulePermissions,
} from "./feed.js";
import { loadSwapEvals, runSeen } from "./evals.js";
import { homeView } from "./home.js";
import { loadDefinitions, loadHistory, state } from "./state.js";

const $ = (id) => document.getElementById(id);
const main = $("main");
let generation = 0;    // bumped by every (re)start: older loops and views stop
let routed = null;     // the view shown: {name, arg, controller}
let following = null;  // aborts the `/v1/events` stream

/** Stop every stream (the key was refused or forgotten): nothing more is read until a key is given. */
function stop() {
  generation++;
  following?.abort();
  routed?.controller.abort();
}

// --- the API key ---------------------------------------------------------------------------------

function askKey(message = "") {
  fill($("key-error"), message);
  const dialog = $("key-dialog");
  if (!dialog.open) dialog.showModal();
  $("key-input").focus();
}

$("key-dialog").addEventListener("cancel", (e) => e.preventDefault()); // there is nothing to see without one
$("key-form").addEventListener("submit", (e) => {
  e.preventDefault();
  auth.key = $("key-input").value.trim();
  $("key-input").value = "";
  $("key-dialog").close();
  start();
});
$("forget-key").addEventListener("click", () => { auth.key = ""; location.reload(); }); // and what it showed
onUnauthorized(() => {
  if (!auth.required && !auth.key) auth.required = true; // a server whose page did not say so
  const had = auth.key;
  auth.key = "";
  stop();
  if (had) askKey("The server refused this key.");
  else if (!$("key-dialog").open) askKey();
});

// --- views ---------------------------------------------------------------------------------------

function parseHash() {
  const [route, query = ""] = location.hash.replace(/^#\/?/, "").split("?");
  const [name = "", ...rest] = route.split("/");
  return { name, arg: decodeURIComponent(rest.join("/")), query: new URLSearchParams(query) };
}

async function route() {
  const { name, arg, query } = parseHash();
  routed?.controller.abort();
  const controller = new AbortController();
  const mine = (routed = { name, arg, controller });
  const isCurrent = () => routed === mine;
  renderAgentList(name === "agent" ? arg.split("@")[0] : null);
  if (name === "agent" || name === "conversation") { // read from the server: nothing stale meanwhile
    fill(main, h("div.view", {}, h("p.muted", {}, "Loading…")));
  }
  try {
    if (name === "agent") await agentView(main, arg, isCurrent);
    else if (name === "definitions") definitionsView(main);
    else if (name === "new") newChatView(main, query.get("agent"));
    else if (name === "conversation") await conversationView(main, arg, controller.signal);
    else {
      if (name === "conversations") { setAgentFilter(query.get("agent") || ""); scheduleReload(); }
      await homeView(main);
    }
  } catch (error) {
    if (controller.signal.aborted || !isCurrent()) return;
    const why = `${error.message}${error.code ? ` (${error.code})` : ""}`;
    fill(main, h("div.view", {}, h("div.empty-state", {}, h("h1", {}, "Not found"), h("p", {}, why),
      h("a", { href: "#/" }, "Back to the overview"))));
  }
}

function renderSet() {
  fill($("set-digest"), h("span.muted", {}, "serving"), digest(state.setDigest, { label: "set" }));
  renderAgentList(routed?.name === "agent" ? routed.arg.split("@")[0] : null);
  renderAgentFilter();
}

// --- the server's events -------------------------------------------------------------------------

function onServerEvent({ name, data }) {
  if (name === "definitions.swapped" || name === "definitions.rejected") {
    addReport(data);
    if (name === "definitions.swapped") {
      attempt(loadDefinitions, "Definitions").then(() => {
        renderSet();
        if (["agent", "definitions", ""].includes(routed?.name)) route();
      });
    }
  } else if (name === "conversation.status") {
    statusChanged(data);
    schedulePermissions();
  } else if (name === "eval.started" || name === "eval.finished") {
    runSeen(data.run);
    renderFeed();
    if (name === "eval.finished" && routed?.name === "agent" && routed.arg.split("@")[0] === data.run.agent) {
      route(); // its Evals card shows the new result
    }
  } else if (name === "mcp.catalog_drift") {
    toast(`MCP server ${data.server}: its tool catalog drifted from the lock`, "error");
  } else if (name === "a2a.card_drift") {
    toast(`A2A tool ${data.tool}: its agent card drifted from the lock`, "error");
  }
}

function setLive(on) {
  const el = $("live");
  el.className = on ? "live on" : "live off";
  fill(el, on ? "live" : "reconnecting…");
}

async function follow(mine) {
  let delay = 1000, first = true;
  while (mine === generation) {
    following = new AbortController();
    try {
      await stream("/v1/events", { signal: following.signal, onEvent: onServerEvent, onOpen: () => {
        setLive(true);
        delay = 1000;
        if (!first) resync(); // events sent while we were away are gone: read the state again
        first = false;
      } });
    } catch (error) {
      if (error.status === 401) return;
    }
    if (mine !== generation) return;
    setLive(false);
    await new Promise((r) => setTimeout(r, delay));
    delay = Math.min(delay * 2, 10000);
  }
}

async function resync() {
  await attempt(async () => {
    await Promise.all([loadDefinitions(), loadHistory(), loadConversations(), loadPermissions()]);
    await loadSwapEvals();
    renderSet();
    renderFeed();
    renderBanner(state.swaps[0]);
  }, "Refresh");
}

async function start() {
  const mine = ++generation;
  $("forget-key").hidden = !auth.required;
  if (auth.required && !auth.key) return askKey();
  try {
    await Promise.all([loadDefinitions(), loadHistory()]);
  } catch (error) {
    if (error.status === 401) return; // onUnauthorized asked for a key
    toast(`Could not reach the server: ${error.message}; trying again`, "error");
    setTimeout(() => { if (mine === generation) start(); }, 3000);
    return;
  }
  renderSet();
  renderFeed();
  renderBanner(state.swaps[0]);
  attempt(loadSwapEvals, "Evals").then(renderFeed);
  follow(mine);
  attempt(loadConversations, "Conversations");
  attempt(loadPermissions, "Permissions");
  route();
}

wireFilters();
$("reload").addEventListener("click", reloadNow);
$("spec-close").addEventListener("click", () => $("spec-dialog").close());
window.addEventListener("hashchange", route);
start();

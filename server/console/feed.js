// The live column: pending permission requests, and the feed of swaps (with the rejected banner).

import { all, api, path } from "./api.js";
import { attempt, badge, digest, fill, h, json, time, toast } from "./dom.js";
import { swapEvals } from "./evals.js";
import { emit, state } from "./state.js";

/** `file:line:col: kind/name: field: message`, as `corral validate` prints an error. */
export function errorLine(e) {
  const at = e.file ? `${e.file}:${e.line ?? "?"}:${e.column ?? "?"}` : "";
  const what = [e.kind && e.name ? `${e.kind}/${e.name}` : "", e.field, e.message].filter(Boolean).join(": ");
  return h("li", {}, at ? h("code.loc", {}, at) : null, h("span", {}, what || e.code));
}

const plural = (n, word) => `${n} ${word}${n === 1 ? "" : "s"}`;
const fromTo = (a, b) => [digest(a, { copy: false }), h("span.arrow", {}, "→"), digest(b, { copy: false })];

function changeList(changes) {
  return h("ul.changes", {}, changes.map((c) => h("li", {},
    h(`span.change.c-${c.change}`, {}, c.change), h("span.kind", {}, c.kind), h("strong", {}, c.name),
    h("span.fromto", {}, fromTo(c.from, c.to)))));
}

function busyList(busy) {
  return h("div.busy", {},
    h("div.busy-head", {}, `Busy: ${plural(busy.length, "conversation")} kept the old digest`),
    h("ul", {}, busy.map((b) => h("li", {},
      h("a", { href: `#/conversation/${b.conversation_id}` }, b.conversation_id), " ",
      h("span.muted", {}, b.agent), " ", digest(b.digest, { copy: false }), " since ", time(b.since)))));
}

/** One swap report: its status, the set digests, what changed, who was busy, every error. */
function swapEntry(r) {
  const changes = r.changes || [], busy = r.busy || [], errors = r.errors || [];
  return h(`li.swap.s-${r.status}`, {},
    h("div.swap-head", {}, badge(r.status), h("span.muted", {}, r.trigger || ""), time(r.at)),
    h("div.swap-set", {},
      r.status === "applied" ? fromTo(r.previous, r.current) : ["serving ", digest(r.current)]),
    changes.length ? changeList(changes) : null,
    busy.length ? busyList(busy) : null,
    errors.length ? h("ul.errors", { "aria-label": "Errors" }, errors.map(errorLine)) : null,
    swapEvals(r),
    r.status === "unchanged" ? h("div.muted", {}, "No definition changed.") : null);
}

export function renderFeed() {
  const feed = document.getElementById("feed");
  fill(feed, state.swaps.length ? state.swaps.slice(0, 50).map(swapEntry)
    : h("li.empty", {}, "No swaps yet. Edit a definition file and it shows up here."));
}

/**
 * The banner shows the latest report while it is a rejection: the state as it is now. A fix that restores
 * the set being served is an `unchanged` report, announced and kept in the history after a rejection, so it
 * clears the banner live and on a fresh load (the rejection stays in the feed, as history). The banner
 * offers to check again for a fix the server has not looked at yet (a reload).
 */
export function renderBanner(report) {
  const banner = document.getElementById("rejected");
  if (!report || report.status !== "rejected") { banner.hidden = true; fill(banner); return; }
  banner.hidden = false;
  fill(banner, h("div.banner-head", {},
    h("strong", {}, `Definitions rejected: ${plural(report.errors.length, "error")}`), " at ",
    time(report.at), ". Still serving ", digest(report.current),
    h("button.small", { type: "button", onclick: reloadNow }, "Check again")),
  h("ul.errors", {}, report.errors.map(errorLine)));
}

/** A report from `/v1/events` or from a reload: first in the feed; the banner follows it. */
export function addReport(report) {
  state.swaps = [report, ...state.swaps.filter((s) => s.id !== report.id)];
  renderFeed();
  renderBanner(report);
  emit("swaps");
}

export async function reloadNow() {
  const report = await attempt(() => api("/v1/definitions/reload", { method: "POST" }), "Reload");
  if (!report) return;
  addReport(report);
  if (report.status === "unchanged") toast("Reloaded: no definition changed");
}

// --- permissions -------------------------------------------------------------------------------

let timer = null;
export function schedulePermissions() {
  clearTimeout(timer);
  timer = setTimeout(() => attempt(loadPermissions, "Permissions"), 150);
}

export async function loadPermissions() {
  const waiting = await all("/v1/conversations?status=waiting", 200);
  const lists = await Promise.all(waiting.map((c) => api(path("/v1/conversations/{}/permissions", c.id))
    .then((r) => r.items.filter((p) => p.status === "pending").map((p) => ({ ...p, agent: c.agent })))
    .catch(() => [])));
  renderPermissions(lists.flat());
}

function renderPermissions(pending) {
  fill(document.getElementById("perm-count"), pending.length ? String(pending.length) : "");
  fill(document.getElementById("permissions"), pending.length ? pending.map((p) => h("li.card.perm", {},
    h("div.perm-head", {}, h("strong.tool-name", {}, p.name), h("span.muted", {}, " wants to run, for "),
      h("a", { href: `#/conversation/${p.conversation_id}` }, p.agent)),
    p.reason ? h("p.reason", {}, p.reason) : null,
    json(p.arguments ?? {}),
    h("div.perm-foot", {}, h("span.muted", {}, "expires ", time(p.expires_at)),
      h("div.row-actions", {},
        h("button.small.danger", { type: "button", onclick: () => decide(p, "deny") }, "Deny"),
        h("button.small.primary", { type: "button", onclick: () => decide(p, "allow") }, "Allow")))))
    : h("li.empty", {}, "Nothing is waiting on you."));
}

async function decide(p, decision) {
  await attempt(() => api(path("/v1/conversations/{}/permissions/{}", p.conversation_id, p.request_id),
    { method: "POST", body: { decision } }), decision === "allow" ? "Allow" : "Deny");
  schedulePermissions();
}

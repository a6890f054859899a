// A conversation's controls (§11): its context use (`used` of `window`), and fork, compact, rename,
// archive. Each acts through the public API and tells the caller what changed.

import { api, path } from "./api.js";
import { attempt, fill, h, toast } from "./dom.js";

function thousands(n) { return n >= 10_000 ? `${Math.round(n / 1000)}k` : n.toLocaleString("en"); }

/** The context meter; `refresh()` reads `GET …/context` again (after a turn, a compaction). */
export function contextMeter(id) {
  const meter = h("meter", { min: 0, max: 1, value: 0, "aria-label": "Context used" });
  const text = h("span.context-text", {}, "context …");
  const el = h("span.context", { title: "what the next model request will carry" }, meter, text);
  el.refresh = async () => {
    try {
      const c = await api(path("/v1/conversations/{}/context", id));
      meter.max = c.window || 1;
      meter.value = c.used || 0;
      meter.high = (c.threshold || 0.8) * meter.max;
      fill(text, `${thousands(c.used || 0)} of ${thousands(c.window || 0)} tokens`
        + `${c.source === "estimated" ? " (estimated)" : ""}`);
    } catch { fill(text, "context unknown"); }
  };
  el.refresh();
  return el;
}

/** Fork, Compact, Rename and Archive buttons for `conv`; `changed(what, body)` after each. */
export function conversationActions(conv, meter, changed) {
  const patch = (body) => api(path("/v1/conversations/{}", conv.id), { method: "PATCH", body });
  const title = h("input", { id: "rename-title", value: conv.title || "", autocomplete: "off" });
  const rename = h("form.rename", { hidden: true, onsubmit: async (e) => {
    e.preventDefault();
    const done = await attempt(() => patch({ title: title.value.trim() || null }), "Rename");
    if (done) { rename.hidden = true; changed("renamed", done); }
  } }, h("label", { for: "rename-title" }, "Title"), title, h("button.small.primary", { type: "submit" }, "Save"));
  let archived = !!conv.archived;
  const archive = h("button.small", { type: "button", onclick: async () => {
    const done = await attempt(() => patch({ archived: !archived }), "Archive");
    if (!done) return;
    archived = done.archived;
    archive.textContent = archived ? "Unarchive" : "Archive";
    changed(archived ? "archived" : "unarchived", done);
  } }, archived ? "Unarchive" : "Archive");
  return [
    h("button.small", { type: "button", onclick: async () => {
      const made = await attempt(() => api(path("/v1/conversations/{}/fork", conv.id), { method: "POST",
        body: {} }), "Fork");
      if (made) changed("forked", made);
    } }, "Fork"),
    h("button.small", { type: "button", onclick: async () => {
      const done = await attempt(() => api(path("/v1/conversations/{}/compact", conv.id),
        { method: "POST" }), "Compact");
      if (!done) return;
      toast(done.compacted === false ? "Nothing to compact yet" : "Compacted");
      meter.refresh();
    } }, "Compact"),
    h("button.small", { type: "button", onclick: () => { rename.hidden = !rename.hidden; title.focus(); } },
      "Rename"),
    archive,
    rename,
  ];
}

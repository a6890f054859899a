// Building the page: elements from data (text only, never parsed as HTML), digests, times, toasts.

const SVG = "http://www.w3.org/2000/svg";

/** An element: `h("a.link", {href, onclick}, "text", child)`; class names after the dots. */
export function h(spec, props = {}, ...children) {
  const [tag, ...classes] = spec.split(".");
  const el = document.createElement(tag || "div");
  if (classes.length) el.className = classes.join(" ");
  for (const [key, value] of Object.entries(props || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (key.startsWith("on")) el.addEventListener(key.slice(2), value);
    else if (key === "class") el.className += ` ${value}`;
    else if (key === "text") el.textContent = value;
    else if (key in el && !key.includes("-") && key !== "list") el[key] = value;
    else el.setAttribute(key, value === true ? "" : value);
  }
  append(el, children);
  return el;
}

function append(el, children) {
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
}

/** Replace the children of `el`. */
export function fill(el, ...children) {
  el.replaceChildren();
  append(el, children);
  return el;
}

export function icon(name) {
  const paths = {
    copy: "M9 9h10v10H9zM5 15V5h10",
    check: "M5 12l5 5 9-10",
  };
  const svg = document.createElementNS(SVG, "svg");
  svg.setAttribute("viewBox", "0 0 24 24");
  svg.setAttribute("aria-hidden", "true");
  svg.classList.add("icon");
  const p = document.createElementNS(SVG, "path");
  p.setAttribute("d", paths[name]);
  svg.append(p);
  return svg;
}

/** `sha256:1a2b3c4d…` from a full digest. */
export function short(digest) {
  if (!digest) return "—";
  const [algo, hex = ""] = digest.split(":");
  return hex ? `${algo}:${hex.slice(0, 8)}…` : digest;
}

/** A digest in its short form, the full value on hover, with a copy button. */
export function digest(value, { copy = true, label } = {}) {
  if (!value) return h("span.digest.none", {}, "—");
  const code = h("code", { title: value }, short(value));
  const chip = h("span.digest", {}, label ? h("span.digest-label", {}, label) : null, code);
  if (copy) {
    const button = h("button.copy", { type: "button", title: "Copy the full digest",
      "aria-label": `Copy ${short(value)}` }, icon("copy"));
    button.addEventListener("click", (event) => {
      event.stopPropagation();
      event.preventDefault();
      copyText(value).then(() => {
        button.replaceChildren(icon("check"));
        setTimeout(() => button.replaceChildren(icon("copy")), 1200);
      });
    });
    chip.append(button);
  }
  return chip;
}

async function copyText(text) {
  try {
    await navigator.clipboard.writeText(text);
  } catch {
    toast("Copy failed: select the digest from its tooltip instead", "error");
  }
}

export function badge(status) {
  return h(`span.badge.s-${status}`, {}, status);
}

/** `hh:mm:ss` today, else the date; the ISO value on hover. */
export function time(iso) {
  if (!iso) return h("span.muted", {}, "—");
  const d = new Date(iso);
  const today = new Date().toDateString() === d.toDateString();
  const text = today ? d.toLocaleTimeString([], { hour12: false }) : d.toLocaleString([], { hour12: false });
  return h("time", { datetime: iso, title: iso }, text);
}

/** A table: `head` the column titles, `rows` a list of cells (elements or text). */
export function table(head, rows) {
  return h("table", {}, h("thead", {}, h("tr", {}, head.map((x) => h("th", { scope: "col" }, x)))),
    h("tbody", {}, rows.map((cells) => h("tr", {}, cells.map((c) => h("td", {}, c))))));
}

export function json(value) {
  return h("pre.json", {}, typeof value === "string" ? value : JSON.stringify(value, null, 2));
}

export function toast(message, kind = "info") {
  const el = h(`div.toast.${kind}`, {}, message);
  document.getElementById("toasts").append(el);
  setTimeout(() => el.remove(), kind === "error" ? 7000 : 3500);
}

/** Run `fn`; an API error becomes a toast instead of an unhandled rejection. */
export async function attempt(fn, what) {
  try {
    return await fn();
  } catch (error) {
    toast(`${what}: ${error.message}${error.code ? ` (${error.code})` : ""}`, "error");
    return undefined;
  }
}

/** `kind/name`'s source as a short label: `file:line`. */
export function where(source) {
  return source ? `${source.file}:${source.line}` : "stored";
}

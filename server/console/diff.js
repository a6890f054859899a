// Spec against spec: two closures of an agent, definition by definition, as line diffs of their JSON.

import { digest, h } from "./dom.js";

const CONTEXT = 3;

/** Lines of `a` and `b` as [op, text] with op one of " ", "-", "+" (longest common subsequence). */
export function diffLines(a, b) {
  const n = a.length, m = b.length;
  if (n * m > 4_000_000) return [...a.map((t) => ["-", t]), ...b.map((t) => ["+", t])];
  const lcs = Array.from({ length: n + 1 }, () => new Uint32Array(m + 1));
  for (let i = n - 1; i >= 0; i--) {
    for (let j = m - 1; j >= 0; j--) {
      lcs[i][j] = a[i] === b[j] ? lcs[i + 1][j + 1] + 1 : Math.max(lcs[i + 1][j], lcs[i][j + 1]);
    }
  }
  const out = [];
  let i = 0, j = 0;
  while (i < n && j < m) {
    if (a[i] === b[j]) { out.push([" ", a[i]]); i++; j++; }
    else if (lcs[i + 1][j] >= lcs[i][j + 1]) out.push(["-", a[i++]]);
    else out.push(["+", b[j++]]);
  }
  while (i < n) out.push(["-", a[i++]]);
  while (j < m) out.push(["+", b[j++]]);
  return out;
}

/** Only the changed lines and CONTEXT lines around them; a gap marker between hunks. */
function hunks(lines) {
  const keep = lines.map(() => false);
  lines.forEach(([op], i) => {
    if (op === " ") return;
    for (let k = Math.max(0, i - CONTEXT); k <= Math.min(lines.length - 1, i + CONTEXT); k++) keep[k] = true;
  });
  const out = [];
  lines.forEach((line, i) => {
    if (keep[i]) out.push(line);
    else if (i > 0 && keep[i - 1]) out.push(["…", ""]);
  });
  return out;
}

const text = (d) => (d ? JSON.stringify(d.spec, null, 2).split("\n") : []);

/** The rendered diff of closures `from` and `to` (each as `GET /v1/agents/{ref}/closure` answers). */
export function closureDiff(from, to) {
  const key = (d) => `${d.kind}/${d.name}`;
  const before = new Map(from.definitions.map((d) => [key(d), d]));
  const after = new Map(to.definitions.map((d) => [key(d), d]));
  const keys = [...new Set([...before.keys(), ...after.keys()])];
  const rows = keys.map((k) => {
    const a = before.get(k), b = after.get(k);
    const change = !a ? "added" : !b ? "removed" : a.digest === b.digest ? "same" : "changed";
    return { k, a, b, change };
  });
  const changed = rows.filter((r) => r.change !== "same");
  const same = rows.filter((r) => r.change === "same");
  return h("div.diff", {},
    h("p.diff-summary", {}, changed.length
      ? `${changed.length} of ${rows.length} definitions differ`
      : "The two digests have the same closure."),
    changed.map((r) => h("section.diff-file", {},
      h("header", {},
        h(`span.change.c-${r.change}`, {}, r.change),
        h("strong", {}, r.k.replace("/", " ")),
        digest(r.a?.digest, { copy: false }), h("span.arrow", {}, "→"),
        digest(r.b?.digest, { copy: false })),
      h("pre.diff-body", {}, hunks(diffLines(text(r.a), text(r.b))).map(([op, line]) =>
        h(`span.dl.${{ " ": "ctx", "-": "del", "+": "add", "…": "gap" }[op]}`, {},
          op === "…" ? "⋯" : `${op} ${line}`))))),
    same.length ? h("p.muted", {}, `Unchanged: ${same.map((r) => r.k).join(", ")}`) : null);
}

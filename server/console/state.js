// What the console knows of the server, reloaded from the API when an event says it changed.

import { all, api, path } from "./api.js";

export const state = {
  agents: [],          // GET /v1/agents
  definitions: [],     // GET /v1/definitions: kind, name, digest, source
  setDigest: "",
  swaps: [],           // GET /v1/definitions/history, newest first (and live reports)
  aliases: new Map(),  // agent name -> [{alias, digest, updated_at}]
  evalRuns: new Map(), // agent digest -> eval name -> the latest run seen on /v1/events
};

const listeners = new Map();

export function on(topic, fn) {
  if (!listeners.has(topic)) listeners.set(topic, new Set());
  listeners.get(topic).add(fn);
  return () => listeners.get(topic).delete(fn);
}

export function emit(topic, value) {
  for (const fn of listeners.get(topic) || []) fn(value);
}

export async function loadDefinitions() {
  const [agents, listing] = await Promise.all([all("/v1/agents"), api("/v1/definitions")]);
  state.agents = agents;
  state.definitions = listing.definitions;
  state.setDigest = listing.digest;
  emit("definitions");
}

export async function loadHistory() {
  state.swaps = await all("/v1/definitions/history", 200);
  emit("swaps");
}

export async function loadAliases(name) {
  const { items } = await api(path("/v1/agents/{}/aliases", name));
  state.aliases.set(name, items);
  emit("aliases", name);
  return items;
}

export function definition(kind, name) {
  return state.definitions.find((d) => d.kind === kind && d.name === name);
}

/**
 * Every digest of agent `name` the console can name, newest first, each with what it is:
 * the current one, an alias's, and the ones the swap history shows it was served with.
 */
export function knownDigests(name) {
  const found = new Map();
  const note = (digest, why) => {
    if (!digest) return;
    if (!found.has(digest)) found.set(digest, []);
    if (!found.get(digest).includes(why)) found.get(digest).push(why);
  };
  note(state.agents.find((a) => a.name === name)?.digest, "current");
  for (const a of state.aliases.get(name) || []) note(a.digest, `@${a.alias}`);
  for (const swap of state.swaps) {
    for (const c of swap.changes || []) {
      if (c.kind !== "Agent" || c.name !== name) continue;
      note(c.to, `swapped in ${swap.at.slice(11, 19)}`);
      note(c.from, "before");
    }
  }
  return [...found].map(([digest, why]) => ({ digest, why }));
}

/** The digest served before `digest` for agent `name`, by the swap history; null if none is known. */
export function digestBefore(name, digest) {
  for (const swap of state.swaps) {
    const c = (swap.changes || []).find((x) => x.kind === "Agent" && x.name === name && x.to === digest);
    if (c?.from) return c.from;
  }
  return null;
}

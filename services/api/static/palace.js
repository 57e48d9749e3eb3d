// The palace browser. Plain DOM, no build step. Drawers hold arbitrary user text, so content is only
// ever written as text nodes (textContent / createTextNode), never parsed as HTML.
"use strict";

const KEY = "palace.apiKey";
const KEY_WS = "palace.apiKeyWorkspace";  // the workspace the stored key was entered for
const WS = "palace.workspace";
const PAGE = 25;
const STOP = new Set(("a an and are as at be but by did do does for from had has have he her his how i if in into " +
  "is it its me my no not of on or our she so that the their them then there they this to was we were what when " +
  "where which who why will with you your").split(" "));
const SIGNAL_NAMES = { full_text: "full text", time_window: "time window", dense: "vector", text: "full text" };

const $ = (id) => document.getElementById(id);
const state = { ws: "", room: null, query: null, after: null, drawerId: null };

/** An element with attributes and children; strings become text nodes (never HTML). */
function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "class") node.className = v;
    else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else node.setAttribute(k, v === true ? "" : String(v));
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined || c === false) continue;
    node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return node;
}

function status(text, isError) {
  const s = $("status");
  s.textContent = text;
  s.classList.toggle("error", Boolean(isError));
}

function when(iso) {
  if (!iso) return "—";
  const d = new Date(iso);
  return isNaN(d) ? String(iso) : d.toISOString().replace("T", " ").slice(0, 19) + " UTC";
}

class AuthNeeded extends Error {}

/** fetch with the tab's API key; a 401 asks for a key, any other failure says the server's reason. */
async function api(path, options) {
  const headers = { Accept: "application/json" };
  const key = sessionStorage.getItem(KEY);
  if (key) headers.Authorization = "Bearer " + key;
  const r = await fetch(path, Object.assign({}, options, { headers }));
  let body = null;
  try { body = await r.json(); } catch (_) { body = null; }
  if (r.status === 401 || r.status === 403) {
    const input = $("apikey");
    input.setAttribute("aria-invalid", "true");
    input.focus();
    throw new AuthNeeded(r.status === 403 ? "This API key belongs to another workspace: enter this workspace's key."
                         : key ? "The API key was refused: enter a valid key for this workspace."
                         : "This API needs a key: enter the workspace's API key.");
  }
  if (!r.ok) {
    let detail = body && body.detail !== undefined ? body.detail : r.statusText;
    if (typeof detail !== "string") detail = JSON.stringify(detail);
    throw new Error(r.status + ": " + detail);
  }
  $("apikey").removeAttribute("aria-invalid");
  return body;
}

const wsPath = () => "/v1/workspaces/" + encodeURIComponent(state.ws) + "/palace";

async function guarded(work) {
  try { await work(); } catch (e) { status(e.message, true); }
}

// ------------------------------------------------------------------------------------ highlighting
/** The query's words as stems to look for (stopwords dropped, common suffixes cut). */
function terms(query) {
  const words = (query.toLowerCase().match(/[\p{L}\p{N}]+/gu) || []).filter((w) => w.length > 1 && !STOP.has(w));
  const stems = words.map((w) => w.replace(/(ing|ed|es|s|ly)$/u, "")).map((s, i) => (s.length >= 3 ? s : words[i]));
  return [...new Set(stems)].sort((a, b) => b.length - a.length);
}

/** ``text`` as a fragment whose words starting with one of ``stems`` are wrapped in <mark>, built by
 * splitting text nodes (the text is never parsed). */
function highlighted(text, stems) {
  const frag = document.createDocumentFragment();
  if (!stems.length) { frag.append(text); return frag; }
  const escaped = stems.map((s) => s.replace(/[.*+?^${}()|[\]\\]/g, "\\$&"));
  const re = new RegExp("(?<![\\p{L}\\p{N}])(?:" + escaped.join("|") + ")[\\p{L}\\p{N}]*", "giu");
  let last = 0;
  for (const m of text.matchAll(re)) {
    if (m.index > last) frag.append(text.slice(last, m.index));
    frag.append(el("mark", {}, m[0]));
    last = m.index + m[0].length;
  }
  if (last < text.length) frag.append(text.slice(last));
  return frag;
}

// ------------------------------------------------------------------------------------ taxonomy
async function loadTaxonomy() {
  const tax = await api(wsPath() + "/taxonomy");
  const nav = $("taxonomy");
  const list = el("ul", { class: "wings" });
  for (const w of tax.wings) {
    const rooms = el("ul", { class: "rooms" });
    for (const r of w.rooms) {
      const current = state.room && state.room.wing === w.wing && state.room.room === r.room;
      rooms.append(el("li", {}, el("button", {
        type: "button", class: "room", "data-wing": w.wing, "data-room": r.room,
        "aria-current": current ? "true" : null,
        onclick: () => guarded(() => openRoom(w.wing, r.room)),
      }, r.room, " ", el("span", { class: "count", "aria-label": r.drawers + " drawers" }, String(r.drawers)))));
    }
    list.append(el("li", { class: "wing" },
      el("h3", {}, w.wing, " ", el("span", { class: "count", "aria-label": w.drawers + " drawers" }, String(w.drawers))),
      rooms));
  }
  nav.replaceChildren(el("h2", { id: "taxonomy-h" }, "Wings and rooms"),
    el("p", { class: "total" }, tax.drawers + " live drawers in " + tax.wings.length + " wings"),
    tax.wings.length ? list : el("p", { class: "empty" }, "No drawers yet."));
}

// ------------------------------------------------------------------------------------ a room
function drawerCard(d, opts) {
  const stems = (opts && opts.stems) || [];
  const body = el("p", { class: "content" });
  body.append(highlighted(d.content, stems));
  return el("li", { class: "card", "data-drawer": d.drawer_id || d.id },
    el("button", { type: "button", class: "open", onclick: () => guarded(() => openDrawer(d.drawer_id || d.id)) },
      el("code", { class: "citation" }, d.citation || [d.wing, d.room, d.drawer_id || d.id].join("/"))),
    body,
    el("p", { class: "meta" }, [d.memory_type || "unclassified", d.speaker ? "said by " + d.speaker : null,
      d.occurred_at ? when(d.occurred_at) : null].filter(Boolean).join(" · ")),
    opts && opts.extra ? opts.extra : null);
}

let roomRequests = 0;  // the latest room page asked for: an answer to an earlier one is dropped

async function openRoom(wing, room, more) {
  const asked = ++roomRequests;
  if (!more) state.after = null;
  state.room = { wing, room };
  state.query = null;
  const q = new URLSearchParams({ wing, room, limit: String(PAGE) });
  if (more && state.after) q.set("after", state.after);
  const pending = more ? $("list").querySelector("button.more") : null;
  if (pending) pending.disabled = true;  // a second click would ask for the same page again
  let page;
  try {
    page = await api(wsPath() + "/drawers?" + q);
  } finally {
    if (pending && asked === roomRequests) pending.disabled = false;
  }
  // Another room (or page) was asked for meanwhile: this answer belongs under no heading shown now.
  if (asked !== roomRequests) return;
  state.after = page.next;
  const section = $("list");
  let items = section.querySelector("ol.cards");
  if (!more || !items) {
    items = el("ol", { class: "cards", "aria-label": "Drawers in " + wing + " / " + room });
    section.replaceChildren(el("h2", { id: "list-h" }, "Drawers in ", el("span", { class: "where" }, wing + " / " + room)),
      items);
  }
  for (const d of page.drawers) items.append(drawerCard(d));
  section.querySelector("button.more")?.remove();
  if (page.next) section.append(el("button", { type: "button", class: "more",
    onclick: () => guarded(() => openRoom(wing, room, true)) }, "More drawers"));
  if (!items.children.length) items.replaceWith(el("p", { class: "empty" }, "This room is empty."));
  markCurrentRoom();
  status(page.drawers.length + (more ? " more" : "") + " drawers in " + wing + " / " + room);
}

function markCurrentRoom() {
  for (const b of document.querySelectorAll("button.room")) {
    const cur = state.room && b.dataset.wing === state.room.wing && b.dataset.room === state.room.room;
    if (cur) b.setAttribute("aria-current", "true"); else b.removeAttribute("aria-current");
  }
}

// ------------------------------------------------------------------------------------ search
/** Why a hit came back: the explanation's signals (when the API gives them), else the two signals. */
function explanation(hit) {
  const ex = hit.explanation;
  const parts = [];
  let raw = [];
  if (ex && typeof ex === "object") {
    for (const [k, v] of Object.entries(ex)) {
      if (typeof v !== "number") continue;
      if (k === "cosine" || k === "bm25") raw.push(k + " " + v.toFixed(3));
      else if (v !== 0) parts.push([k, v]);
    }
  } else {
    for (const k of ["dense", "text"]) if (typeof hit[k] === "number") parts.push([k, hit[k]]);
  }
  parts.sort((a, b) => Math.abs(b[1]) - Math.abs(a[1]));
  const list = el("ul", { class: "explain", "aria-label": "Why this result" });
  const top = Math.max(1e-9, ...parts.map((p) => Math.abs(p[1])));
  for (const [k, v] of parts) {
    const bar = el("span", { class: "bar" + (v < 0 ? " neg" : ""), "aria-hidden": "true" });
    bar.style.width = Math.round((Math.abs(v) / top) * 100) + "%";
    list.append(el("li", {}, el("span", { class: "signal" }, SIGNAL_NAMES[k] || k.replace(/_/g, " ")),
      el("span", { class: "track" }, bar), el("span", { class: "value" }, (v > 0 && ex ? "+" : "") + v.toFixed(3))));
  }
  const box = el("div", { class: "why" }, el("p", { class: "why-h" }, "Why: score " +
    (typeof hit.score === "number" ? hit.score.toFixed(3) : "?")), list);
  if (typeof ex === "string") box.append(el("p", {}, ex));
  if (raw.length) box.append(el("p", { class: "raw" }, raw.join(" · ")));
  return box;
}

async function search(query) {
  const q = new URLSearchParams({ workspace_id: state.ws, q: query, k: "10" });
  const res = await api("/v1/search?" + q);
  state.room = null;
  state.query = query;
  markCurrentRoom();
  const stems = terms(query);
  const items = el("ol", { class: "cards hits", "aria-label": "Search results" });
  for (const h of res.hits) items.append(drawerCard(h, { stems, extra: explanation(h) }));
  $("list").replaceChildren(el("h2", { id: "list-h" }, "Results for ", el("q", {}, query)),
    res.hits.length ? items : el("p", { class: "empty" }, "Nothing relevant found."));
  status(res.hits.length + " results for “" + query + "”, best first");
}

// ------------------------------------------------------------------------------------ a drawer
function dl(pairs) {
  const list = el("dl", { class: "facts" });
  for (const [k, v] of pairs) if (v !== null && v !== undefined && v !== "") list.append(el("dt", {}, k), el("dd", {}, v));
  return list;
}

/** A raw message with the drawer's chunk(s) of it marked. drawer_sources counts characters as Python does
 * (code points); a JS string slices UTF-16 units, so an emoji before a chunk moved its mark, and could
 * split a surrogate pair. The text is sliced as code points. */
function messageText(content, spans) {
  const p = el("p", { class: "msg-text" });
  const chars = Array.from(content);
  const part = (a, b) => chars.slice(a, b).join("");
  const good = spans.filter(([a, b]) => b > a && a >= 0 && b <= chars.length).sort((x, y) => x[0] - y[0]);
  let last = 0;
  for (const [a, b] of good) {
    if (a < last) continue;
    p.append(part(last, a), el("mark", { class: "chunk" }, part(a, b)));
    last = b;
  }
  p.append(part(last, chars.length));
  return p;
}

async function openDrawer(id, quiet) {
  const d = await api(wsPath() + "/drawers/" + encodeURIComponent(id));
  state.drawerId = id;
  const section = $("drawer");
  const actions = el("div", { class: "actions" });
  if (d.deleted_at) {
    actions.append(el("p", { class: "deleted", role: "note" }, "Deleted " + when(d.deleted_at) + "."),
      el("button", { type: "button", onclick: () => guarded(() => restore(id)) }, "Restore drawer"));
  } else {
    actions.append(el("button", { type: "button", class: "danger", onclick: () => guarded(() => remove(id)) },
      "Delete drawer"));
  }
  const content = el("p", { class: "content" }, d.content);
  const prov = el("section", { class: "provenance", "aria-labelledby": "prov-h" }, el("h3", { id: "prov-h" }, "Provenance"));
  if (!d.sessions.length) prov.append(el("p", { class: "empty" }, "No source session recorded (source: " + d.source + ")."));
  for (const s of d.sessions) {
    const msgs = el("ol", { class: "messages", "aria-label": "Messages of session " + s.session_id });
    for (const m of s.messages) {
      // A span is marked only where the message still says the drawer: a sighting edited away since is not.
      const here = d.sources.filter((x) => x.session_id === s.session_id && x.seq === m.seq);
      const spans = here.filter((x) => x.revision == null).map((x) => [x.char_start, x.char_end]);
      const edited = (m.revision ? " · edited" + (m.revision > 1 ? " " + m.revision + " times" : "") : "") +
        (here.length && !spans.length ? " · filed from an earlier version" : "");
      msgs.append(el("li", { class: "msg" + (m.is_source ? " source" : ""), value: m.seq + 1 },
        el("p", { class: "who" }, (m.name || m.role) + (m.name ? " (" + m.role + ")" : "") + " · #" + m.seq +
          (m.created_at ? " · " + when(m.created_at) : "") + (m.is_source ? " · filed from here" : "") + edited),
        messageText(m.content, spans)));
    }
    prov.append(el("h4", {}, "Session ", el("code", { class: "session-id" }, s.session_id)),
      dl([["Agent", s.agent_id], ["User", s.user_id], ["Started", s.started_at && when(s.started_at)],
        ["Completed", s.completed_at && when(s.completed_at)], ["Messages", String(s.message_count)],
        ["Received", when(s.received_at)]]), msgs);
  }
  if (d.sources.length) {
    prov.append(el("p", { class: "meta" }, "Seen " + d.sources.length + " time(s): " + d.sources.map((s) =>
      "#" + s.seq + " chunk " + s.chunk_index + " [" + s.char_start + "–" + s.char_end + ")").join(", ")));
  }
  const hist = el("section", { class: "history", "aria-labelledby": "hist-h" }, el("h3", { id: "hist-h" }, "History"));
  if (d.history.length) {
    const body = el("tbody");
    for (const h of d.history) {
      body.append(el("tr", { "data-action": h.action }, el("td", {}, when(h.created_at)), el("td", {}, h.action),
        el("td", {}, h.actor), el("td", {}, h.reason || ""),
        el("td", {}, el("code", {}, h.new_value === null ? "" : JSON.stringify(h.new_value)))));
    }
    hist.append(el("table", {}, el("caption", { class: "sr-only" }, "Audit trail, newest first"),
      el("thead", {}, el("tr", {}, ["When", "Action", "Actor", "Reason", "Change"].map((c) => el("th", { scope: "col" }, c)))),
      body));
  } else {
    hist.append(el("p", { class: "empty" }, "No recorded changes."));
  }
  section.replaceChildren(
    el("h2", { id: "drawer-h" }, "Drawer"),
    el("p", { class: "cite" }, "Cite as ", el("code", { class: "citation" }, d.citation)),
    actions, content,
    dl([["Wing / room", d.wing + " / " + d.room], ["Hall", d.hall], ["Type", d.memory_type || "unclassified"],
      ["State", d.state], ["Importance", d.importance.toFixed(1)], ["Speaker", d.speaker],
      ["Said", d.occurred_at && when(d.occurred_at)], ["Filed", when(d.filed_at)],
      ["Recalled", d.access_count + (d.access_count === 1 ? " time" : " times") + (d.last_accessed_at ? ", last " + when(d.last_accessed_at) : "")],
      ["Summary", d.summary], ["Superseded by", d.superseded_by]]),
    prov, hist);
  if (!quiet) { section.focus(); status("Drawer " + d.citation); }
}

async function remove(id) {
  if (!window.confirm("Delete this drawer? It stops being recalled; you can restore it.")) return;
  const q = new URLSearchParams({ reason: "deleted in the palace browser" });
  const out = await api(wsPath() + "/drawers/" + encodeURIComponent(id) + "?" + q, { method: "DELETE" });
  await refreshAfterChange(id);
  status(out.deleted ? "Drawer deleted (audited; restorable)." : "That drawer was already deleted.");
}

async function restore(id) {
  const out = await api(wsPath() + "/drawers/" + encodeURIComponent(id) + "/restore", { method: "POST" });
  await refreshAfterChange(id);
  status(out.restored ? "Drawer restored." : "That drawer was not deleted.");
}

async function refreshAfterChange(id) {
  await loadTaxonomy();
  if (state.room) await openRoom(state.room.wing, state.room.room);
  else if (state.query) await search(state.query);
  await openDrawer(id, true);
}

// ------------------------------------------------------------------------------------ start
async function open(ws) {
  if (ws !== state.ws) {
    // Another workspace: the open drawer is the last one's, and so is a key entered for it.
    state.drawerId = null;
    $("drawer").replaceChildren(el("h2", { id: "drawer-h" }, "Drawer"),
      el("p", { class: "empty" }, "Pick a drawer to see where it came from and what happened to it."));
    const keyFor = sessionStorage.getItem(KEY_WS);
    if (keyFor !== null && keyFor !== ws) {
      sessionStorage.removeItem(KEY);
      sessionStorage.removeItem(KEY_WS);
      $("apikey").placeholder = "only if the API asks for one";
    }
  }
  state.ws = ws;
  state.room = null;
  state.query = null;
  sessionStorage.setItem(WS, ws);
  $("list").replaceChildren(el("h2", { id: "list-h" }, "Drawers"), el("p", { class: "empty" }, "Pick a room, or search."));
  await loadTaxonomy();
  status("Workspace " + ws);
}

document.addEventListener("DOMContentLoaded", () => {
  const fromUrl = new URLSearchParams(location.search).get("workspace");
  const ws = fromUrl || sessionStorage.getItem(WS) || "";
  $("workspace").value = ws;
  $("connect").addEventListener("submit", (e) => {
    e.preventDefault();
    const key = $("apikey").value.trim();
    if (key) {
      sessionStorage.setItem(KEY, key);
      sessionStorage.setItem(KEY_WS, $("workspace").value.trim());
    }
    $("apikey").value = "";
    $("apikey").placeholder = sessionStorage.getItem(KEY) ? "key stored for this tab" : "only if the API asks for one";
    guarded(() => open($("workspace").value.trim()));
  });
  $("search").addEventListener("submit", (e) => {
    e.preventDefault();
    if (!state.ws) { status("Open a workspace first.", true); return; }
    guarded(() => search($("q").value.trim()));
  });
  if (sessionStorage.getItem(KEY)) $("apikey").placeholder = "key stored for this tab";
  if (ws) guarded(() => open(ws));
});

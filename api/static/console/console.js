// Setu console: a client of the JSON API, in the browser (README, "Operations").
// No framework and no build step: plain DOM, hash routes, the API key in sessionStorage.
// Every value from the API is put in the page as text (never as HTML).
"use strict";

const KEY = "setu.apiKey";
const REFRESH_MS = 3000;
let timer = null;

// --- DOM and API helpers -------------------------------------------------

function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs || {})) {
    if (name.startsWith("on")) el.addEventListener(name.slice(2), value);
    else if (value !== null && value !== undefined && value !== false) el.setAttribute(name, value);
  }
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return el;
}

function toast(text) {
  const el = document.getElementById("toast");
  el.textContent = text;
  el.className = "show";
  setTimeout(() => { el.className = ""; }, 5000);
}

class ApiError extends Error {}

async function api(method, path, body) {
  const headers = { Authorization: "Bearer " + sessionStorage.getItem(KEY) };
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const response = await fetch(path, {
    method, headers, body: body === undefined ? undefined : JSON.stringify(body),
  });
  if (response.status === 401) {
    sessionStorage.removeItem(KEY);
    location.hash = "#/signin";
    throw new ApiError("the key was refused: sign in again");
  }
  const text = await response.text();
  const data = text ? JSON.parse(text) : null;
  if (!response.ok) {
    const message = data && data.error ? data.error.message : response.statusText;
    throw new ApiError(`${response.status}: ${message}`);
  }
  return data;
}

function when(ms) {
  return ms ? new Date(ms).toISOString().replace("T", " ").replace("Z", " UTC") : "-";
}

function expiring(ageMs, leftMs) {
  if (ageMs === null) return "-";
  return leftMs === null ? `${age(ageMs)} (kept)` : `${age(ageMs)}, expires in ${age(Math.max(0, leftMs))}`;
}

function age(ms) {
  if (ms === null || ms === undefined) return "-";
  const s = ms / 1000;
  return s < 120 ? `${s.toFixed(1)} s` : s < 7200 ? `${(s / 60).toFixed(1)} min` : `${(s / 3600).toFixed(1)} h`;
}

function table(columns, rows, empty) {
  if (!rows.length) return h("p", { class: "muted" }, empty || "none");
  return h("table", {},
    h("thead", {}, h("tr", {}, columns.map(([title]) => h("th", {}, title)))),
    h("tbody", {}, rows.map((row) => h("tr", {}, columns.map(([, cell]) => h("td", {}, cell(row)))))));
}

function link(href, text) { return h("a", { href }, text); }
const enc = encodeURIComponent;

function crumbs(...parts) {
  const nav = document.getElementById("crumbs");
  nav.replaceChildren(...parts.flatMap((p, i) => (i ? [" / ", p] : [p])));
}

function show(...children) {
  document.getElementById("main").replaceChildren(...children);
}

// Body of a dead letter: pretty JSON, else text, else base64.
function bodyText(letter) {
  let raw = letter.body;
  if (letter.body_encoding === "base64") {
    try { raw = atob(letter.body); } catch (e) { return letter.body; }
  }
  try { return JSON.stringify(JSON.parse(raw), null, 2); } catch (e) { /* not JSON */ }
  return /[\x00-\x08\x0e-\x1f]/.test(raw) ? "(base64) " + btoa(raw) : raw;
}

// --- pages ----------------------------------------------------------------

function signIn() {
  crumbs();
  const input = h("input", { type: "password", id: "api-key", size: 60, autocomplete: "off" });
  show(
    h("h1", {}, "Sign in"),
    h("form", {
      class: "inline", id: "signin",
      onsubmit: async (event) => {
        event.preventDefault();
        sessionStorage.setItem(KEY, input.value.trim());
        try {
          await api("GET", "/v1/projects");
          location.hash = "#/";
        } catch (e) { toast(e.message); }
      },
    }, h("label", {}, "API key", input), h("button", { class: "primary", type: "submit" }, "Sign in")),
    h("p", { class: "muted" }, "The key stays in this tab only (session storage). `setu dev up` prints one."));
}

async function projects() {
  crumbs(link("#/", "projects"));
  const data = await api("GET", "/v1/projects");
  show(h("h1", {}, "Projects"), table([
    ["project", (p) => link(`#/p/${enc(p.name)}`, p.name)],
    ["description", (p) => p.description],
    ["quota", (p) => JSON.stringify(p.quota)],
    ["created", (p) => when(p.created_at_ms)],
  ], data.projects, "no project this key may see"));
}

async function project(name) {
  crumbs(link("#/", "projects"), link(`#/p/${enc(name)}`, name));
  const base = `/v1/projects/${enc(name)}`;
  const [topics, subs] = await Promise.all([api("GET", `${base}/topics`), api("GET", `${base}/subscriptions`)]);
  const fields = {
    name: h("input", { name: "name", required: true, placeholder: "billing" }),
    topic: h("select", { name: "topic" }, topics.topics.map((t) => h("option", { value: t.name }, t.name))),
    url: h("input", { name: "url", required: true, size: 40, placeholder: "https://example.com/hook" }),
    delays: h("input", { name: "delays", value: "5000,60000,600000", size: 18 }),
  };
  const create = h("form", {
    class: "inline", id: "new-subscription",
    onsubmit: async (event) => {
      event.preventDefault();
      const delays = fields.delays.value.split(",").map((s) => parseInt(s.trim(), 10)).filter((n) => !isNaN(n));
      try {
        await api("POST", `${base}/subscriptions`, {
          name: fields.name.value.trim(), topic: fields.topic.value,
          endpoint: { url: fields.url.value.trim() }, retry: { delays_ms: delays },
        });
        location.hash = `#/s/${enc(name)}/${enc(fields.name.value.trim())}`;
      } catch (e) { toast(e.message); }
    },
  }, h("label", {}, "name", fields.name), h("label", {}, "topic", fields.topic),
  h("label", {}, "webhook URL", fields.url), h("label", {}, "retry delays (ms)", fields.delays),
  h("button", { class: "primary", type: "submit" }, "Create subscription"));
  show(
    h("h1", {}, name),
    h("h2", {}, "Topics"),
    table([
      ["topic", (t) => t.name], ["grouped", (t) => String(t.grouped)],
      ["partitions", (t) => t.partitions], ["retention", (t) => `${t.retention_hours} h`],
    ], topics.topics),
    h("h2", {}, "Subscriptions"),
    table([
      ["subscription", (s) => link(`#/s/${enc(name)}/${enc(s.name)}`, s.name)],
      ["topic", (s) => s.topic], ["state", (s) => s.state], ["endpoint", (s) => s.endpoint.url],
      ["retry delays", (s) => s.retry.delays_ms.join(", ")], ["version", (s) => s.version],
    ], subs.subscriptions),
    h("h2", {}, "New subscription"), create);
}

async function subscription(p, s) {
  crumbs(link("#/", "projects"), link(`#/p/${enc(p)}`, p), link(`#/s/${enc(p)}/${enc(s)}`, s));
  const base = `/v1/projects/${enc(p)}/subscriptions/${enc(s)}`;
  const sub = await api("GET", base);
  const statusBox = h("div", { id: "status" });
  const groupsBox = h("div", { id: "groups" });
  const dlqBox = h("div", { id: "dlq" });
  const lookupBox = h("div", { id: "lookup" });
  const replaysBox = h("div", { id: "replays" });
  let previous = null;

  async function act(action, question) {
    if (question && !confirm(question)) return;
    try {
      const answer = await api("POST", `${base}/${action}`);
      toast(`${s}: ${answer.state}`);
      await refresh();
    } catch (e) { toast(e.message); }
  }

  async function unsideline(body, question) {
    if (!confirm(question)) return;
    try {
      const answer = await api("POST", `${base}/dlq/unsideline`, body);
      toast(`requeued ${answer.requeued}`);
      await refresh();
    } catch (e) { toast(e.message); }
  }

  async function replay(body, question) {
    if (!confirm(question)) return;
    try {
      const answer = await api("POST", `${base}/replays`, body);
      toast(`replay ${answer.id} started`);
      await refresh();
    } catch (e) { toast(e.message); }
  }

  async function cancelReplay(id) {
    if (!confirm(`Cancel replay ${id}? Calls already made stay made.`)) return;
    try {
      await api("POST", `${base}/replays/${enc(id)}/cancel`);
      toast(`replay ${id} cancelled`);
      await refresh();
    } catch (e) { toast(e.message); }
  }

  async function refresh() {
    const [status, groups, replays] = await Promise.all([api("GET", `${base}/status`),
      api("GET", `${base}/groups?limit=100`), api("GET", `${base}/replays?limit=10`)]);
    replaysBox.replaceChildren(table([
      ["replay", (r) => r.id], ["state", (r) => r.state],
      ["window", (r) => `${when(r.from_ms)} to ${when(r.to_ms)}`],
      ["groups", (r) => (r.group_ids ? r.group_ids.join(", ") : "all")],
      ["matched", (r) => r.progress.matched], ["delivered", (r) => r.progress.delivered],
      ["failed", (r) => r.progress.failed],
      ["waiting groups", (r) => r.progress.waiting_group_ids.join(", ") || "-"],
      ["partitions done", (r) => `${r.progress.partitions_done}/${r.progress.partitions}`],
      ["", (r) => (r.state === "running"
        ? h("button", { class: "cancel-replay", "data-replay": r.id, onclick: () => cancelReplay(r.id) }, "Cancel")
        : "")],
    ], replays.replays, "no replays"));
    const now = Date.now();
    let rates = ["-", "-"];
    if (previous) {
      const seconds = (now - previous.at) / 1000;
      rates = [(status.delivered_total - previous.delivered) / seconds, (status.dead_lettered - previous.dead) / seconds]
        .map((r) => `${Math.max(0, r).toFixed(1)}/s`);
    }
    previous = { at: now, delivered: status.delivered_total, dead: status.dead_lettered };
    const card = (title, value, cls) => h("div", { class: "card" }, h("b", { class: cls }, value), title);
    const breaker = status.breaker;
    const breakerText = breaker.state === "closed" ? "closed"
      : `${breaker.state.replace("_", "-")} since ${when(breaker.since_ms)} (${breaker.last_error || "-"})`;
    statusBox.replaceChildren(
      status.paused_reason ? h("p", { class: "bad" }, `Paused by a policy: ${status.paused_reason}`) : "",
      status.group_state === "rebuilding"
        ? h("p", { class: "bad" }, "Group state is being rebuilt after Redis lost it: failed groups and parked messages may show too few until it is done.")
        : "",
      h("div", { class: "cards" },
      card("state", status.state), card("endpoint breaker", breakerText, breaker.state === "closed" ? "good" : "bad"),
      card("lag", status.lag),
      card("oldest undelivered", age(status.oldest_undelivered_age_ms)),
      card("delivery rate", rates[0]), card("dead-letter rate", rates[1], "bad"),
      card("failed groups", status.failed_groups, status.failed_groups ? "bad" : "good"),
      card("scheduled groups", status.scheduled_groups),
      card("retry backlog", status.retry_backlog), card("in flight", status.in_flight),
      card("oldest parked", expiring(status.oldest_parked_age_ms, status.parked_expire_in_ms), status.oldest_parked_age_ms === null ? "good" : "bad"),
      card("oldest retrying", expiring(status.oldest_retrying_age_ms, status.retrying_expire_in_ms))),
      table([["partition", (x) => x.partition], ["lag", (x) => x.lag],
        ["oldest undelivered", (x) => when(x.oldest_undelivered_ms)]], status.partitions));
    groupsBox.replaceChildren(table([
      ["group", (g) => g.group_id], ["state", (g) => g.state], ["tier", (g) => g.tier || "-"],
      ["parked", (g) => g.parked], ["due", (g) => (g.due_at_ms ? when(g.due_at_ms) : "-")],
      ["head message", (g) => g.head_message_id ? h("a", { href: "#", onclick: (e) => { e.preventDefault(); lookup(g.head_message_id); } }, g.head_message_id) : "-"],
      ["unhealthy since", (g) => when(g.since_ms)],
      ["", (g) => g.state === "dead_lettered"
        ? h("button", { class: "unsideline", "data-group": g.group_id,
          onclick: () => unsideline({ group_ids: [g.group_id] }, `Deliver group ${g.group_id}'s dead letters again, in order?`) }, "Unsideline")
        : ""],
    ], groups.groups, "every group is healthy"));
  }

  async function browse(after) {
    const page = await api("GET", `${base}/dlq/messages?limit=50${after ? "&after=" + enc(after) : ""}`);
    const picked = new Set();
    const rows = page.messages.map((m) => ({ ...m }));
    dlqBox.replaceChildren(
      table([
        ["", (m) => h("input", { type: "checkbox", onchange: (e) => (e.target.checked ? picked.add(m.message_id) : picked.delete(m.message_id)) })],
        ["message", (m) => m.message_id], ["group", (m) => m.group_id || "-"],
        ["failed at", (m) => when(m.failed_at)], ["attempts", (m) => m.attempts],
        ["error", (m) => m.error], ["headers", (m) => JSON.stringify(m.headers)],
        ["body", (m) => h("pre", {}, bodyText(m))],
      ], rows, "the dead-letter queue is empty"),
      h("p", {},
        h("button", { onclick: () => picked.size && unsideline({ message_ids: [...picked] }, `Deliver ${picked.size} selected dead letter(s) again?`) }, "Unsideline selected"),
        " ",
        page.next ? h("button", { onclick: () => browse(page.next) }, "Next page") : ""));
  }

  async function lookup(id) {
    try {
      const record = await api("GET", `${base}/messages/${enc(id)}`);
      const steps = record.attempts.map((a) => ({ at: a.at_ms, what: `attempt ${a.attempt} from ${a.tier}: ${a.outcome}`, detail: a.status || a.error, ms: a.duration_ms, answer: a.response_excerpt }))
        .concat(record.moves.map((m) => ({ at: m.at_ms, what: `moved to ${m.to} (${m.why})` })))
        .sort((x, y) => x.at - y.at);
      lookupBox.replaceChildren(h("p", {}, h("b", {}, record.message_id), ": ", record.location,
        record.deliver_at_ms ? ` (scheduled for ${when(record.deliver_at_ms)})` : ""),
        table([["when", (x) => when(x.at)], ["what", (x) => x.what], ["status / error", (x) => x.detail || "-"],
          ["ms", (x) => (x.ms === undefined ? "-" : x.ms)], ["answer", (x) => (x.answer ? h("pre", {}, x.answer) : "-")]], steps));
    } catch (e) { lookupBox.replaceChildren(h("p", { class: "bad" }, e.message)); }
  }

  const replayFrom = h("input", { type: "datetime-local", id: "replay-from" });
  const replayTo = h("input", { type: "datetime-local", id: "replay-to" });
  const replayGroups = h("input", { id: "replay-groups", size: 30, placeholder: "group ids, comma-separated (empty: all)" });
  const replayForm = h("form", { class: "inline", id: "new-replay", onsubmit: (e) => {
    e.preventDefault();
    // From: the time given, else an hour ago; to: the time given, else now (the API's).
    const from = replayFrom.value ? new Date(replayFrom.value).getTime() : Date.now() - 3600_000;
    const body = { from_ms: from };
    if (replayTo.value) body.to_ms = new Date(replayTo.value).getTime();
    const groups = replayGroups.value.split(",").map((g) => g.trim()).filter((g) => g);
    if (groups.length) body.group_ids = groups;
    const which = groups.length ? `group(s) ${groups.join(", ")}` : "every group";
    replay(body, `Deliver again what ${which} got since ${when(from)}${body.to_ms ? ` until ${when(body.to_ms)}` : ""}? Each group's messages arrive again in order.`);
  } }, "from ", replayFrom, " to ", replayTo, " ", replayGroups, " ", h("button", { type: "submit" }, "Replay"));
  const seekInput = h("input", { type: "datetime-local", id: "seek-time" });
  const lookupInput = h("input", { id: "message-id", size: 40, placeholder: "message id" });
  show(
    h("h1", {}, `${p} / ${s}`),
    h("p", {},
      ...["pause", "resume", "start"].flatMap((a) => [h("button", { class: "lifecycle", onclick: () => act(a) }, a), " "]),
      h("button", { class: "danger", onclick: () => act("stop", `Stop ${s}? Its partitions are released until it starts again.`) }, "stop"),
      " ", seekInput, " ",
      h("button", { class: "danger", onclick: async () => {
        if (!seekInput.value) return toast("pick a time first");
        const ms = new Date(seekInput.value).getTime();
        if (!confirm(`Start ${s} again from ${when(ms)}? It must be stopped; messages after that time are delivered again.`)) return;
        try { await api("POST", `${base}/seek`, { timestamp_ms: ms }); toast("seek recorded"); } catch (e) { toast(e.message); }
      } }, "seek")),
    h("h2", {}, "Status"), statusBox,
    h("h2", {}, "Unhealthy groups"), groupsBox,
    h("h2", {}, "Dead letters"), h("button", { onclick: () => browse() }, "Browse the DLQ"), dlqBox,
    h("h2", {}, "Replays"),
    h("p", {}, "Deliver again what a window already delivered (docs/replays.md): for a receiver that acknowledged messages and lost them."),
    replayForm, replaysBox,
    h("h2", {}, "Message lookup"),
    h("form", { class: "inline", onsubmit: (e) => { e.preventDefault(); lookup(lookupInput.value.trim()); } },
      lookupInput, h("button", { type: "submit" }, "Show its attempts")), lookupBox,
    h("h2", {}, "Configuration"), h("pre", {}, JSON.stringify(sub, null, 2)));
  // A failed refresh (a dependency briefly away: 503) is shown and tried again, not fatal.
  timer = setInterval(() => refresh().catch((e) => toast(e.message)), REFRESH_MS);
  await refresh().catch((e) => toast(e.message));
}

// --- routing --------------------------------------------------------------

async function route() {
  clearInterval(timer);
  timer = null;
  const parts = location.hash.replace(/^#\/?/, "").split("/").map(decodeURIComponent);
  if (!sessionStorage.getItem(KEY) || parts[0] === "signin") return signIn();
  document.getElementById("who").textContent = "signed in";
  try {
    if (parts[0] === "p" && parts[1]) await project(parts[1]);
    else if (parts[0] === "s" && parts[2]) await subscription(parts[1], parts[2]);
    else await projects();
  } catch (e) {
    show(h("p", { class: "bad" }, e.message));
  }
}

window.addEventListener("hashchange", route);
route();

// InferScale memory inspector: one page over /ui/api (inferscale_engine/server/ui/api.py).
//
// Safety rules of this file: every text that comes from the server (facts, turns, user ids,
// errors) is put in the page as a text node (el.append(string) / textContent), never as HTML;
// no innerHTML, no inline handlers, no eval. The API key stays in sessionStorage (this tab)
// and travels as `Authorization: Bearer` on fetch; no cookies are used.
"use strict";

(() => {
  const KEY = "inferscale.key";
  const REFRESH_MS = 3000;
  const state = { who: null, timer: null, lastServer: null };
  const $ = (id) => document.getElementById(id);

  // ---- DOM helpers: children are nodes or plain text ----------------------------------------
  function h(tag, props, ...children) {
    const el = document.createElement(tag);
    for (const [name, value] of Object.entries(props || {})) {
      if (value === undefined || value === null || value === false) continue;
      if (name === "class") el.className = value;
      else if (name.startsWith("on")) el.addEventListener(name.slice(2), value);
      else el.setAttribute(name, value === true ? "" : String(value));
    }
    for (const child of children.flat(Infinity)) {
      if (child === undefined || child === null || child === false) continue;
      el.append(child instanceof Node ? child : String(child));  // a string becomes text
    }
    return el;
  }

  function show(...nodes) {
    stopRefresh();
    $("main").replaceChildren(...nodes.filter((n) => n));
  }

  const fmtTime = (seconds) => {
    if (seconds === null || seconds === undefined) return "";
    const d = new Date(seconds * 1000);
    const p = (n) => String(n).padStart(2, "0");
    return `${d.getFullYear()}-${p(d.getMonth() + 1)}-${p(d.getDate())} ` +
      `${p(d.getHours())}:${p(d.getMinutes())}:${p(d.getSeconds())}`;
  };
  const fmtNum = (v, digits = 0) => (v === null || v === undefined || Number.isNaN(v))
    ? "–" : Number(v).toLocaleString("en-US", { maximumFractionDigits: digits,
      minimumFractionDigits: digits });
  const fmtPct = (num, den) => (den > 0 ? fmtNum((100 * num) / den, 1) + " %" : "–");

  // ---- the API ------------------------------------------------------------------------------
  class ApiError extends Error {
    constructor(status, message) { super(message); this.status = status; }
  }

  async function api(method, path, body) {
    const headers = { Accept: "application/json" };
    const key = sessionStorage.getItem(KEY);
    if (key) headers.Authorization = "Bearer " + key;
    if (body !== undefined) headers["Content-Type"] = "application/json";
    const response = await fetch(path, {
      method, headers, credentials: "omit", cache: "no-store", redirect: "error",
      body: body === undefined ? undefined : JSON.stringify(body),
    });
    let data = null;
    try { data = await response.json(); } catch (_) { data = null; }
    if (!response.ok) {
      const err = data && data.error;
      const message = (err && err.message) || (data && (data.message || JSON.stringify(data.detail)))
        || response.statusText;
      throw new ApiError(response.status, String(message));
    }
    return data;
  }

  const q = (params) => "?" + new URLSearchParams(params).toString();

  function errorBox(err) {
    const status = err instanceof ApiError ? `Refused (${err.status}): ` : "Error: ";
    return h("div", { class: "error", role: "alert" }, status + (err.message || String(err)));
  }

  // ---- a confirmation dialog ----------------------------------------------------------------
  function confirmDialog({ title, body, ok = "Delete", typed = null }) {
    const dialog = $("confirm");
    $("confirm-title").textContent = title;
    $("confirm-body").textContent = body;
    $("confirm-ok").textContent = ok;
    $("confirm-typed-label").hidden = typed === null;
    $("confirm-expected").textContent = typed || "";
    const input = $("confirm-typed");
    input.value = "";
    const okButton = $("confirm-ok");
    okButton.disabled = typed !== null;
    return new Promise((resolve) => {
      const done = (answer) => {
        input.oninput = null; okButton.onclick = null; $("confirm-cancel").onclick = null;
        dialog.onclose = null;
        if (dialog.open) dialog.close();
        resolve(answer);
      };
      input.oninput = () => { okButton.disabled = input.value !== typed; };
      okButton.onclick = () => done(true);
      $("confirm-cancel").onclick = () => done(false);
      dialog.onclose = () => done(false);
      dialog.showModal();
      (typed !== null ? input : $("confirm-cancel")).focus();
    });
  }

  // ---- sign-in ------------------------------------------------------------------------------
  function renderHeader() {
    const who = state.who;
    const route = parseRoute();
    const nav = [h("a", { href: "#/users", class: route.view !== "server" ? "active" : null },
      "Users")];
    if (who && who.admin) {
      nav.push(h("a", { href: "#/server", class: route.view === "server" ? "active" : null },
        "Server"));
    }
    $("nav").replaceChildren(...(who ? nav : []));
    if (!who) { $("who").replaceChildren(); return; }
    $("who").replaceChildren(...[
      h("span", { id: "tenant" }, who.keys ? `tenant ${who.tenant}` : "no API keys (loopback)"),
      who.admin ? h("span", { class: "badge admin" }, "admin") : null,
      who.keys ? h("button", { id: "signout", class: "secondary", onclick: signOut }, "Sign out")
        : null].filter((n) => n));
  }

  function renderSignIn(message) {
    state.who = null;
    renderHeader();
    const input = h("input", { id: "signin-key", type: "password", autocomplete: "off",
      placeholder: "API key (from the server's --api-keys file)", "aria-label": "API key" });
    const form = h("form", { id: "signin", onsubmit: async (event) => {
      event.preventDefault();
      sessionStorage.setItem(KEY, input.value.trim());
      await start();
    } }, input, h("button", { id: "signin-submit", type: "submit" }, "Sign in"));
    show(h("div", { class: "signin card" },
      h("h1", {}, "Sign in"),
      h("p", { class: "muted" }, "An API key of this server. A tenant key shows its own users; " +
        "an admin key every user and the server panel. The key stays in this tab."),
      message ? h("div", { class: "error", id: "signin-error", role: "alert" }, message) : null,
      form));
    input.focus();
  }

  function signOut() {
    sessionStorage.removeItem(KEY);
    location.hash = "#/users";
    renderSignIn("");
  }

  async function start() {
    try {
      state.who = await api("GET", "/ui/api/whoami");
    } catch (err) {
      const tried = Boolean(sessionStorage.getItem(KEY));
      sessionStorage.removeItem(KEY);
      if (err instanceof ApiError && err.status === 401) {
        renderSignIn(tried ? `Refused (401): ${err.message}` : "");
      } else {
        renderSignIn(`Error: ${err.message}`);
      }
      return;
    }
    render();
  }

  // ---- routing: #/users, #/user/<id>/<tab>, #/server ----------------------------------------
  function parseRoute() {
    const parts = location.hash.replace(/^#\/?/, "").split("/");
    let decoded;
    try { decoded = parts.map(decodeURIComponent); } catch (_) { decoded = ["users"]; }
    if (decoded[0] === "user" && decoded[1]) {
      return { view: "user", user: decoded[1], tab: decoded[2] || "memories" };
    }
    if (decoded[0] === "server") return { view: "server" };
    return { view: "users" };
  }
  const userLink = (user, tab = "memories") => `#/user/${encodeURIComponent(user)}/${tab}`;

  function render() {
    if (!state.who) return;
    renderHeader();
    const route = parseRoute();
    if (route.view === "user") renderUser(route.user, route.tab);
    else if (route.view === "server") renderServer();
    else renderUsers();
  }

  // ---- users --------------------------------------------------------------------------------
  async function renderUsers() {
    const filter = h("input", { id: "user-filter", type: "search", placeholder: "Filter users",
      "aria-label": "Filter users" });
    const list = h("div", { id: "users" }, h("p", { class: "muted" }, "Loading…"));
    const load = async () => {
      try {
        const data = await api("GET", "/ui/api/users" + q({ q: filter.value }));
        const items = data.users.map((u) => h("li", {}, h("a", { href: userLink(u) }, u)));
        list.replaceChildren(
          h("p", { class: "muted", id: "users-count" },
            `${data.total} user${data.total === 1 ? "" : "s"} this key reaches` +
            (data.total > data.users.length ? ` (first ${data.users.length} shown)` : "")),
          items.length ? h("ul", { class: "users" }, items)
            : h("p", { class: "muted" }, "No users with memories or turns yet."));
      } catch (err) { list.replaceChildren(errorBox(err)); }
    };
    let pending = null;
    filter.addEventListener("input", () => { clearTimeout(pending); pending = setTimeout(load, 250); });
    show(h("div", { class: "card" }, h("h1", {}, "Users"),
      h("div", { class: "toolbar" }, filter), list));
    await load();
  }

  // ---- one user -----------------------------------------------------------------------------
  const TABS = [["memories", "Memories"], ["search", "Search"], ["ask", "Ask"],
    ["sessions", "Sessions"]];

  async function renderUser(user, tab) {
    const body = h("div", { id: "user-body" }, h("p", { class: "muted" }, "Loading…"));
    const head = h("div", { id: "user-head" });
    show(h("div", { class: "card" },
      h("p", { class: "muted" }, h("a", { href: "#/users" }, "← Users")),
      head, body));
    const fill = (...nodes) => body.replaceChildren(...nodes.flat().filter((n) => n));
    const opened = () => {  // only once the server let this key see the user
      head.replaceChildren(h("h1", { id: "user-id" }, user),
        h("div", { class: "tabs" }, TABS.map(([name, label]) =>
          h("a", { href: userLink(user, name), class: name === tab ? "active" : null,
            id: `tab-${name}` }, label))));
    };
    const refused = (err) => { head.replaceChildren(); fill(errorBox(err)); };
    try {
      await api("GET", "/ui/api/user" + q({ user_id: user }));  // 403 for a user not ours
    } catch (err) { refused(err); return; }
    const views = { memories: memoriesTab, search: searchTab, ask: askTab, sessions: sessionsTab };
    (views[tab] || memoriesTab)(user, fill, opened, refused);
  }

  function tierBadges(tiers) {
    if (!tiers.length) return [h("span", { class: "badge none" }, "not resident")];
    const names = { slab: "GPU slab", host: "host RAM", disk: "disk" };
    return tiers.map((t) => h("span", { class: `badge ${t}` }, names[t] || t));
  }

  async function memoriesTab(user, fill, opened, refused, notice) {
    let data;
    try {
      data = await api("GET", "/ui/api/memories" + q({ user_id: user }));
    } catch (err) { refused(err); return; }
    opened();
    const reload = (message) => memoriesTab(user, fill, opened, refused, message);
    const rows = [];
    for (const m of data.memories) {
      const textCell = h("td", { class: "text" }, m.pinned ? h("span", { class: "badge pinned",
        title: "Pinned: in every answer of this user, before the retrieved memories; its KV " +
          "stays in the GPU slab" }, "\u{1F4CC} pinned") : null, m.memory);
      const sub = h("tr", { class: "sub", hidden: true }, h("td", { colspan: 9 }));
      const historyButton = h("button", { class: "link", onclick: async () => {
        if (!sub.hidden) { sub.hidden = true; return; }
        try {
          const events = await api("GET", "/ui/api/history" + q({ id: m.id }));
          sub.firstChild.replaceChildren(h("ol", { class: "events" }, events.events.map(describe)));
        } catch (err) { sub.firstChild.replaceChildren(errorBox(err)); }
        sub.hidden = false;
      } }, "History");
      const editButton = h("button", { class: "link", onclick: () => {
        const area = h("textarea", { class: "edit-text", "aria-label": "Memory text" });
        area.value = m.memory;
        const save = h("button", { class: "save", onclick: async () => {
          try {
            await api("POST", `/ui/api/memories/${m.id}`, { text: area.value });
            reload(`Memory #${m.id} updated (its KV was encoded again).`);
          } catch (err) { textCell.prepend(errorBox(err)); }
        } }, "Save");
        const cancel = h("button", { class: "secondary", onclick: () => reload() }, "Cancel");
        textCell.replaceChildren(area, h("div", { class: "toolbar" }, save, cancel));
        area.focus();
      } }, "Edit");
      const deleteButton = h("button", { class: "link danger", onclick: async () => {
        const yes = await confirmDialog({ title: `Delete memory #${m.id}?`,
          body: m.memory, ok: "Delete" });
        if (!yes) return;
        try {
          await api("DELETE", `/ui/api/memories/${m.id}`);
          const events = await api("GET", "/ui/api/history" + q({ id: m.id }));
          reload(`Memory #${m.id} deleted. Its history: ` +
            events.events.map((e) => e.event).join(" → ") + ".");
        } catch (err) { fill(errorBox(err)); }
      } }, "Delete");
      rows.push(h("tr", { "data-id": m.id },
        h("td", { class: "num" }, m.id), textCell,
        h("td", { class: "nowrap" }, fmtTime(m.created_at)),
        h("td", { class: "nowrap" }, fmtTime(m.updated_at)),
        h("td", { class: "nowrap expires" }, m.expires_at === null ?
          h("span", { class: "muted" }, "never") : fmtTime(m.expires_at)),
        h("td", { class: "session", title: m.session_id },
          m.session_id === null ? h("span", { class: "muted" }, "–") : m.session_id),
        h("td", { class: "num" }, m.tokens),
        h("td", { class: "kv" }, tierBadges(m.tiers)),
        h("td", { class: "nowrap" }, historyButton, editButton, deleteButton)), sub);
    }
    const deleteAll = h("button", { id: "delete-all", class: "danger",
      disabled: data.memories.length === 0, onclick: async () => {
        const yes = await confirmDialog({ title: `Delete all ${data.memories.length} memories?`,
          body: "Every memory of this user is deleted, in one step; this cannot be undone " +
            "(the user's conversation turns and the memories' history stay).",
          ok: "Delete all", typed: user });
        if (!yes) return;
        try {
          const done = await api("DELETE", "/ui/api/memories" + q({ user_id: user, confirm: user }));
          reload(`Deleted ${done.deleted.length} memories.`);
        } catch (err) { fill(errorBox(err)); }
      } }, "Delete all memories");
    fill(
      notice ? h("div", { class: "notice", id: "notice" }, notice) : null,
      h("div", { class: "toolbar" },
        h("span", { id: "memories-count" }, `${data.memories.length} memories`),
        h("span", { class: "spacer" }),
        h("button", { class: "secondary", onclick: () => reload() }, "Refresh"), deleteAll),
      data.memories.length === 0 ? h("p", { class: "muted" }, "No memories.") :
        h("table", { class: "memories" },
          h("thead", {}, h("tr", {}, h("th", { class: "num" }, "#"), h("th", {}, "Memory"),
            h("th", {}, "Created"), h("th", {}, "Updated"), h("th", {}, "Expires"),
            h("th", {}, "Session"),
            h("th", { class: "num" }, "Tokens"), h("th", {}, "KV"), h("th", {}, ""))),
          h("tbody", {}, rows)));
  }

  function describe(e) {
    const when = fmtTime(e.at);
    if (e.event === "ADD") return h("li", {}, `${when}  ADD: `, e.new);
    if (e.event === "UPDATE") return h("li", {}, `${when}  UPDATE: `, e.old, "  →  ", e.new);
    return h("li", {}, `${when}  ${e.event}: `, e.old === null ? "" : e.old);
  }

  function factsTable(facts, id) {
    return h("table", { class: "facts", id },
      h("thead", {}, h("tr", {}, h("th", { class: "num" }, "Rank"), h("th", { class: "num" }, "Score"),
        h("th", { title: "embedding: among the embedding's own top k; keywords: a word of the " +
          "query brought it in; both" }, "Found by"),
        h("th", { class: "num" }, "#"), h("th", {}, "Memory"))),
      h("tbody", {}, facts.map((f, i) => h("tr", { "data-id": f.id },
        h("td", { class: "num" }, i + 1), h("td", { class: "num score" }, fmtNum(f.score, 3)),
        h("td", { class: "found-by" }, f.found_by || ""),
        h("td", { class: "num" }, f.id), h("td", { class: "text" }, f.memory)))));
  }

  function searchTab(user, fill, opened, refused) {
    opened();
    const query = h("input", { id: "search-query", type: "search", class: "wide",
      placeholder: "Search this user's memories", "aria-label": "Search query" });
    const topK = h("input", { id: "search-k", type: "number", class: "num", min: 1, max: 100,
      value: 10, "aria-label": "Top k" });
    const out = h("div", { id: "search-results" });
    const form = h("form", { class: "toolbar", onsubmit: async (event) => {
      event.preventDefault();
      out.replaceChildren(h("p", { class: "muted" }, "Searching…"));
      try {
        const data = await api("POST", "/ui/api/search",
          { user_id: user, query: query.value, top_k: Number(topK.value) });
        out.replaceChildren(data.results.length ? factsTable(data.results, "search-table")
          : h("p", { class: "muted" }, "Nothing found."));
      } catch (err) { out.replaceChildren(errorBox(err)); }
    } }, query, h("label", {}, "top k ", topK), h("button", { id: "search-submit" }, "Search"));
    fill(form, out);
    query.focus();
  }

  function answerCard(mode, title, a) {
    return h("div", { class: "card", id: `answer-${mode}` },
      h("h2", {}, title),
      h("div", { class: "answer" }, a.answer),
      h("dl", { class: "stats" },
        h("dt", {}, "TTFT"), h("dd", { class: "ttft" },
          a.ttft_ms === null ? "–" : `${fmtNum(a.ttft_ms, 1)} ms`),
        h("dt", {}, "whole answer"), h("dd", {}, `${fmtNum(a.latency_ms, 1)} ms`),
        h("dt", {}, "prompt tokens"), h("dd", {}, fmtNum(a.prompt_tokens)),
        h("dt", {}, "… injected"), h("dd", { class: "injected" }, fmtNum(a.injected_tokens)),
        h("dt", {}, "… from vLLM's prefix cache"), h("dd", {}, fmtNum(a.prefix_cached_tokens)),
        h("dt", {}, "… prefilled"), h("dd", {}, fmtNum(a.prefilled_tokens)),
        h("dt", {}, "plan status"), h("dd", { class: "plan" }, a.plan_status +
          (a.fallback ? ` (fallback: ${a.fallback})` : "")),
        mode === "kv" ? [h("dt", {}, "facts repaired as text"),
          h("dd", {}, fmtNum(a.repaired_facts))] : null));
  }

  function askTab(user, fill, opened, refused) {
    opened();
    const question = h("input", { id: "ask-question", type: "text", class: "wide",
      placeholder: "Ask a question as this user", "aria-label": "Question" });
    const k = h("input", { id: "ask-k", type: "number", class: "num", min: 0, max: 64,
      placeholder: "server", "aria-label": "Facts to retrieve" });
    const maxTokens = h("input", { id: "ask-max-tokens", type: "number", class: "num", min: 1,
      max: 512, value: 48, "aria-label": "Answer tokens" });
    const out = h("div", { id: "ask-results" });
    const form = h("form", { class: "toolbar", onsubmit: async (event) => {
      event.preventDefault();
      out.replaceChildren(h("p", { class: "muted" }, "Answering twice (kv, then text)…"));
      const body = { user_id: user, question: question.value, max_tokens: Number(maxTokens.value) };
      if (k.value !== "") body.k = Number(k.value);
      try {
        const data = await api("POST", "/ui/api/ask", body);
        out.replaceChildren(
          h("div", { class: "row" },
            answerCard("kv", "KV mode: facts injected as stored KV", data.kv),
            answerCard("text", "Text mode: facts prefilled as text", data.text)),
          h("div", { class: "card" }, h("h2", {}, `Retrieved facts (k = ${data.k})`),
            data.facts.length ? factsTable(data.facts, "ask-facts")
              : h("p", { class: "muted" }, "No facts retrieved.")));
      } catch (err) { out.replaceChildren(errorBox(err)); }
    } }, question, h("label", {}, "k ", k), h("label", {}, "max tokens ", maxTokens),
    h("button", { id: "ask-submit" }, "Ask"));
    fill(h("p", { class: "muted" }, "The question is answered twice through the serving path, " +
      "with the same retrieved facts: injected as their stored KV, and prefilled as text. " +
      "Asked again, a question is found in vLLM's prefix cache: fewer tokens are injected or " +
      "prefilled."),
    form, out);
    question.focus();
  }

  async function sessionsTab(user, fill, opened, refused) {
    let data;
    try {
      data = await api("GET", "/ui/api/sessions" + q({ user_id: user }));
    } catch (err) { refused(err); return; }
    opened();
    const turns = h("div", { id: "turns" });
    const open = async (s) => {
      const params = { user_id: user };
      if (s.session_id !== null) params.session_id = s.session_id;
      try {
        const t = await api("GET", "/ui/api/turns" + q(params));
        turns.replaceChildren(h("h2", {}, "Turns of ",
          s.session_id === null ? "(no session)" : s.session_id),
        h("table", { class: "turns" },
          h("thead", {}, h("tr", {}, h("th", { class: "num" }, "#"), h("th", {}, "Time"),
            h("th", {}, "Role"), h("th", {}, "Content"))),
          h("tbody", {}, t.turns.map((turn) => h("tr", {},
            h("td", { class: "num" }, turn.id), h("td", { class: "nowrap" }, fmtTime(turn.at)),
            h("td", {}, turn.role), h("td", { class: "text" }, turn.content))))));
      } catch (err) { turns.replaceChildren(errorBox(err)); }
    };
    fill(data.sessions.length === 0 ? h("p", { class: "muted" }, "No conversation turns.") :
      h("table", { class: "sessions" },
        h("thead", {}, h("tr", {}, h("th", {}, "Session"), h("th", { class: "num" }, "Turns"),
          h("th", {}, "First turn"), h("th", {}, "Last turn"))),
        h("tbody", {}, data.sessions.map((s) => h("tr", {},
          h("td", {}, h("button", { class: "link session", onclick: () => open(s) },
            s.session_id === null ? "(no session)" : s.session_id)),
          h("td", { class: "num" }, s.turns), h("td", { class: "nowrap" }, fmtTime(s.first_at)),
          h("td", { class: "nowrap" }, fmtTime(s.last_at)))))),
    turns);
    if (data.sessions.length) await open(data.sessions[0]);
  }

  // ---- the server panel ---------------------------------------------------------------------
  function stopRefresh() {
    if (state.timer !== null) { clearTimeout(state.timer); state.timer = null; }
  }

  function renderServer() {
    const body = h("div", { id: "server-body" }, h("p", { class: "muted" }, "Loading…"));
    const stamp = h("span", { id: "server-updated", class: "muted" });
    show(h("div", { class: "toolbar" }, h("h1", {}, "Server"), h("span", { class: "spacer" }),
      stamp), body);
    state.lastServer = null;
    const tick = async () => {
      try {
        const snap = await api("GET", "/ui/api/server");
        body.replaceChildren(...serverCards(snap, state.lastServer));
        state.lastServer = snap;
        stamp.textContent = `updated ${fmtTime(snap.time)}, every ${REFRESH_MS / 1000} s`;
        stamp.dataset.time = String(snap.time);
      } catch (err) { body.replaceChildren(errorBox(err)); }
      if (parseRoute().view === "server" && $("server-body") === body) {
        state.timer = setTimeout(tick, REFRESH_MS);
      }
    };
    tick();
  }

  function meter(used, capacity) {
    const bar = h("div", {});
    bar.style.width = capacity > 0 ? `${Math.min(100, (100 * used) / capacity)}%` : "0";
    return h("div", { class: "meter" }, bar);
  }

  function stat(label, value, id) {
    return [h("dt", {}, label), h("dd", id ? { id } : {}, value)];
  }

  function serverCards(snap, last) {
    const v = (name) => snap.values[name] || 0;
    const has = (name) => name in snap.values;
    const dt = last ? snap.time - last.time : 0;
    const rate = (name) => (last && dt > 0
      ? Math.max(0, (v(name) - (last.values[name] || 0)) / dt) : null);
    const slabUsed = v("inferscale_slab_tokens");
    const slabCap = v("inferscale_slab_capacity_tokens");
    const hostUsed = v("inferscale_host_tokens");
    const hostCap = v("inferscale_host_capacity_tokens");
    const returned = v("inferscale_host_hits_total") + v("inferscale_disk_hits_total") +
      v("inferscale_reencoded_facts_total");
    const reqRate = rate("vllm:request_success_total");
    return [
      h("div", { class: "row" },
        h("div", { class: "card", id: "card-memory" }, h("h2", {}, "Memory"),
          h("div", { class: "big", id: "stat-facts" }, fmtNum(v("inferscale_facts"))),
          h("div", { class: "muted" }, "facts stored"),
          h("dl", { class: "stats" },
            stat("users", fmtNum(v("inferscale_users"))),
            stat("KV in the GPU slab", fmtNum(v("inferscale_resident_facts")) + " facts", "stat-resident"),
            stat("KV in host RAM", fmtNum(v("inferscale_host_facts")) + " facts"))),
        h("div", { class: "card", id: "card-slab" }, h("h2", {}, "Slab and tiers"),
          h("div", { class: "big", id: "stat-slab" }, fmtPct(slabUsed, slabCap)),
          h("div", { class: "muted" }, "of the GPU slab holds fact KV"),
          meter(slabUsed, slabCap),
          h("dl", { class: "stats" },
            stat("slab tokens", `${fmtNum(slabUsed)} of ${fmtNum(slabCap)}`),
            stat("free slab pages", fmtNum(v("inferscale_slab_free_pages"))),
            stat("host RAM tokens", `${fmtNum(hostUsed)} of ${fmtNum(hostCap)}`)),
          meter(hostUsed, hostCap)),
        h("div", { class: "card", id: "card-requests" }, h("h2", {}, "Requests"),
          h("div", { class: "big", id: "stat-rate" },
            reqRate === null ? "–" : `${fmtNum(reqRate, 2)}/s`),
          h("div", { class: "muted" }, "finished requests per second (since the last poll)"),
          h("dl", { class: "stats" },
            stat("finished", fmtNum(v("vllm:request_success_total")), "stat-finished"),
            stat("running / waiting", `${fmtNum(v("vllm:num_requests_running"))} / ` +
              fmtNum(v("vllm:num_requests_waiting"))),
            stat("with injected KV", fmtNum(v("inferscale_injected_requests_total"))),
            stat("tokens injected", fmtNum(v("inferscale_injected_tokens_total"))),
            stat("refused (4xx)", fmtNum(v("inferscale_refused_requests_total")))))),
      h("div", { class: "row" },
        h("div", { class: "card", id: "card-hits" }, h("h2", {}, "Hit rates"),
          h("dl", { class: "stats" },
            has("vllm:prefix_cache_queries_total") ? stat("vLLM prefix cache",
              fmtPct(v("vllm:prefix_cache_hits_total"), v("vllm:prefix_cache_queries_total")))
              : null,
            stat("facts back in the slab on use", fmtNum(v("inferscale_returned_facts_total"))),
            stat("… from host RAM", `${fmtNum(v("inferscale_host_hits_total"))} (` +
              fmtPct(v("inferscale_host_hits_total"), returned) + ")"),
            stat("… from disk", `${fmtNum(v("inferscale_disk_hits_total"))} (` +
              fmtPct(v("inferscale_disk_hits_total"), returned) + ")"),
            stat("… encoded again", `${fmtNum(v("inferscale_reencoded_facts_total"))} (` +
              fmtPct(v("inferscale_reencoded_facts_total"), returned) + ")"),
            stat("evicted from the slab", fmtNum(v("inferscale_evicted_facts_total"))))),
        h("div", { class: "card", id: "card-fallbacks" }, h("h2", {}, "Fallbacks"),
          h("dl", { class: "stats" },
            stat("served as text (KV could not be resident)",
              fmtNum(v("inferscale_fallback_text_evicted_total"))),
            stat("plans rejected", fmtNum(v("inferscale_fallback_rejected_total"))),
            stat("plans mismatched", fmtNum(v("inferscale_fallback_mismatch_total"))),
            stat("injection errors", fmtNum(v("inferscale_load_errors_total"))),
            stat("facts repaired as text", fmtNum(v("inferscale_repaired_facts_total"))))),
        ttftCard(snap.ttft)),
    ];
  }

  function ttftCard(ttft) {
    const bars = [];
    const labels = [];
    let previous = 0;
    const counts = ttft.buckets.map(([le, cumulative]) => {
      const count = cumulative - previous;
      previous = cumulative;
      return [le, count];
    });
    // Up to the slowest bucket in use (and a little beyond): vLLM's reach 2560 s.
    const used = counts.reduce((last, [, c], i) => (c > 0 ? i : last), -1);
    const shown = counts.slice(0, Math.max(used + 3, 8));
    const top = Math.max(1, ...shown.map(([, c]) => c));
    for (const [le, count] of shown) {
      const fill = h("div", {});
      fill.style.height = `${(100 * count) / top}%`;
      bars.push(h("div", { class: "bar", title: `≤ ${le === null ? "∞" : le} s: ${count}` },
        h("span", {}, count ? fmtNum(count) : ""), fill));
      labels.push(h("span", {}, le === null ? "∞" : (le < 1 ? fmtNum(le * 1000) : `${le}s`)));
    }
    const mean = ttft.count > 0 ? (1000 * ttft.sum) / ttft.count : null;
    return h("div", { class: "card", id: "card-ttft" },
      h("h2", {}, "Time to first token"),
      h("div", { class: "muted" }, "vLLM's histogram of every request; buckets up to (ms)"),
      h("dl", { class: "stats" }, stat("requests", fmtNum(ttft.count), "stat-ttft-count"),
        stat("mean", mean === null ? "–" : `${fmtNum(mean, 1)} ms`)),
      bars.length ? [h("div", { class: "hist", id: "ttft-hist" }, bars),
        h("div", { class: "hist-labels" }, labels)]
        : h("p", { class: "muted" }, "No TTFT histogram in this vLLM's metrics."));
  }

  window.addEventListener("hashchange", render);
  document.addEventListener("DOMContentLoaded", start);
})();

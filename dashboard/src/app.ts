// The cronoq-server dashboard: hash-routed views over the same-origin JSON API.
type J = any;
const TOKEN_KEY = "cronoq.token";
const main = document.getElementById("main") as HTMLElement;
const errors = document.getElementById("errors") as HTMLElement;
let timer: number | undefined;
let abort: AbortController | undefined;
let authOn = false;

class ApiError extends Error {
  constructor(public status: number, text: string) { super(text); }
}

function h(tag: string, attrs: Record<string, string> = {}, ...kids: (Node | string)[]): HTMLElement {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) el.setAttribute(k, v);
  for (const c of kids) el.append(c);
  return el;
}

async function api(path: string, init: RequestInit = {}): Promise<J> {
  const headers = new Headers(init.headers);
  const tok = sessionStorage.getItem(TOKEN_KEY);
  if (tok) headers.set("Authorization", `Bearer ${tok}`);
  const r = await fetch(path, { ...init, headers, signal: init.signal ?? abort?.signal });
  if (r.status === 401) { sessionStorage.removeItem(TOKEN_KEY); askToken("the token was not accepted"); throw new ApiError(401, "the token was not accepted"); }
  const body = await r.json().catch(() => ({}));
  if (!r.ok) throw new ApiError(r.status, body.error ?? `HTTP ${r.status}`);
  return body;
}

function showError(where: HTMLElement, e: unknown, view: string): void {
  if (e instanceof DOMException && e.name === "AbortError") return;
  const msg = e instanceof ApiError && e.status === 403 ? `this token's role does not allow ${view}` : String((e as Error).message ?? e);
  where.replaceChildren(h("p", { class: "error", role: "alert" }, msg));
}

function nsDate(ns: string | number | undefined): string {
  if (!ns || ns === "0") return "";
  const ms = Number(BigInt(ns) / 1000000n);
  const age = Math.round((Date.now() - ms) / 1000);
  const rel = Math.abs(age) < 60 ? `${Math.abs(age)} s` : Math.abs(age) < 3600 ? `${Math.round(Math.abs(age) / 60)} min` : `${Math.round(Math.abs(age) / 3600)} h`;
  return `${new Date(ms).toLocaleString()} (${age >= 0 ? rel + " ago" : "in " + rel})`;
}

function seconds(from: string, to: string): string {
  return `${(Number(BigInt(to) - BigInt(from)) / 1e9).toFixed(3)} s`;
}

function table(cols: string[], rows: (Node | string)[][], label: string): HTMLElement {
  return h("div", { class: "scroll" }, h("table", { "aria-label": label },
    h("thead", {}, h("tr", {}, ...cols.map((c) => h("th", { scope: "col" }, c)))),
    h("tbody", {}, ...rows.map((r) => h("tr", {}, ...r.map((c, i) => h("td", { "data-label": cols[i] }, c)))))));
}

function taskLink(id: string): HTMLElement { return h("a", { href: `#/tasks/${id}` }, id); }

// --- auth ---
function askToken(msg = ""): void {
  stop();
  const input = h("input", { id: "token", type: "password", autocomplete: "off", required: "" }) as HTMLInputElement;
  const form = h("form", { class: "token" }, h("h1", {}, "Sign in"), msg ? h("p", { class: "error", role: "alert" }, msg) : "",
    h("label", { for: "token" }, "API token"), input, h("button", { type: "submit" }, "Use token"));
  form.addEventListener("submit", (ev) => { ev.preventDefault(); sessionStorage.setItem(TOKEN_KEY, input.value); route(); });
  main.replaceChildren(form);
  input.focus();
}

// --- overview ---
const series = new Map<string, { t: number; busy: number; capacity: number; pending: number }[]>();
let lastTotals: { t: number; v: J } | undefined;
const WINDOW_MS = 10 * 60 * 1000;
// The chart spans what the page has seen, at least this much, so a page just opened shows a line.
const MIN_SPAN_MS = 60 * 1000;

function chart(points: { t: number; [k: string]: number }[], keys: string[], label: string): SVGElement {
  const ns = "http://www.w3.org/2000/svg";
  const W = 300, H = 80;
  const svg = document.createElementNS(ns, "svg");
  svg.setAttribute("viewBox", `0 0 ${W} ${H}`);
  svg.setAttribute("role", "img");
  svg.setAttribute("aria-label", label);
  svg.setAttribute("class", "chart");
  svg.setAttribute("preserveAspectRatio", "none");
  const now = Date.now();
  const span = Math.min(WINDOW_MS, Math.max(MIN_SPAN_MS, points.length ? now - points[0].t : 0));
  const max = Math.max(1, ...points.flatMap((p) => keys.map((k) => p[k])));
  keys.forEach((k, i) => {
    const line = document.createElementNS(ns, "polyline");
    line.setAttribute("points", points.map((p) => `${(W * (1 - (now - p.t) / span)).toFixed(1)},${(H - 2 - (H - 4) * p[k] / max).toFixed(1)}`).join(" "));
    line.setAttribute("class", `s${i}`);
    svg.append(line);
  });
  return svg;
}

async function overview(): Promise<void> {
  const box = h("section", { "aria-labelledby": "h-ov" });
  main.replaceChildren(h("h1", { id: "h-ov" }, "Overview"), box);
  const tick = async () => {
    try {
      const s = await api("/v1/snapshot");
      const t = Date.now();
      const rates: Record<string, string> = {};
      for (const [k, v] of Object.entries(s.totals as Record<string, number>)) {
        rates[k] = lastTotals ? (((v - lastTotals.v[k]) * 1000) / (t - lastTotals.t)).toFixed(2) : "";
      }
      lastTotals = { t, v: s.totals };
      const totals = Object.keys(s.totals);
      const pools: HTMLElement[] = [];
      for (const p of s.pools) {
        const pts = series.get(p.name) ?? [];
        pts.push({ t, busy: p.busy, capacity: p.capacity, pending: p.pending });
        while (pts.length && t - pts[0].t > WINDOW_MS) pts.shift();
        series.set(p.name, pts);
        const pc = p.pending_by_class;
        pools.push(h("article", { class: "pool", "data-pool": p.name }, h("h3", {}, p.name),
          chart(pts, ["busy", "capacity", "pending"], `busy, capacity and pending in ${p.name} while this page has been open (at most the last 10 minutes)`),
          h("p", { class: "legend" }, h("span", { class: "k0" }, "busy"), " ", h("span", { class: "k1" }, "capacity"), " ", h("span", { class: "k2" }, "pending")),
          h("dl", {}, ...[["capacity", p.capacity], ["busy", p.busy], ["desired", p.desired], ["held", p.held], ["workers", p.workers_connected],
            ["pending", `${p.pending} (critical ${pc[0]}, high ${pc[1]}, normal ${pc[2]}, low ${pc[3]})`],
            ["utilization", `${(p.utilization * 100).toFixed(0)}%`], ["priority adherence", `${(p.priority_adherence * 100).toFixed(0)}%`],
            ["fixed-start hit rate", `${(p.fixed_start_hit_rate * 100).toFixed(0)}%`],
            ["wait p50/p90/p99", `${p.wait_p50_s.toFixed(3)} / ${p.wait_p90_s.toFixed(3)} / ${p.wait_p99_s.toFixed(3)} s`]]
            .flatMap(([k, v]) => [h("dt", {}, String(k)), h("dd", { "data-field": String(k) }, String(v))]))));
      }
      box.replaceChildren(
        h("dl", { class: "summary" }, ...([["live tasks", "live_tasks"], ["running", "running"], ["pending", "pending"], ["workers", "workers_connected"]] as const)
          .flatMap(([label, k]) => [h("dt", {}, label), h("dd", { "data-summary": k }, String(s[k]))])),
        s.unavailable_shards.length ? h("p", { class: "error", role: "alert" }, `unavailable shards: ${s.unavailable_shards.join(", ")}`) : "",
        h("h2", {}, "Pools"), h("div", { class: "pools" }, ...pools),
        h("h2", {}, "Totals"),
        h("div", { class: "totals" }, table(["counter", "total", "per second"], totals.map((k) => [k.split("_").join(" "), h("span", { "data-total": k }, String(s.totals[k])), rates[k]]), "totals")));
    } catch (e) { showError(box, e, "the overview"); }
  };
  await tick();
  timer = window.setInterval(tick, 2000);
}

// --- tasks ---
const STATUSES = ["", "blocked", "scheduled", "ready", "running", "retrying", "succeeded", "failed", "dead_lettered", "cancelled", "skipped", "missed", "shed"];

async function tasks(q: URLSearchParams): Promise<void> {
  const field = (name: string, label: string, el: HTMLElement) => { el.id = `f-${name}`; el.setAttribute("name", name); return h("div", { class: "field" }, h("label", { for: `f-${name}` }, label), el); };
  const sel = h("select", {}, ...STATUSES.map((s) => h("option", { value: s }, s || "any"))) as HTMLSelectElement;
  const pool = h("input", { type: "text" }) as HTMLInputElement;
  const kind = h("input", { type: "text" }) as HTMLInputElement;
  pool.value = q.get("pool") ?? ""; kind.value = q.get("kind") ?? ""; sel.value = q.get("status") ?? "";
  const filter = h("form", { class: "filters", role: "search", "aria-label": "filter tasks" }, field("pool", "Pool", pool), field("status", "Status", sel), field("kind", "Kind", kind), h("button", { type: "submit" }, "Filter"));
  filter.addEventListener("submit", (ev) => { ev.preventDefault(); const n = new URLSearchParams(); for (const [k, v] of [["pool", pool.value], ["status", sel.value], ["kind", kind.value], ["limit", q.get("limit") ?? ""]]) if (v) n.set(k, v); location.hash = `#/tasks?${n}`; });
  const findIn = h("input", { type: "text" }) as HTMLInputElement;
  const by = h("select", {}, h("option", { value: "id" }, "id"), h("option", { value: "key" }, "key")) as HTMLSelectElement;
  const find = h("form", { class: "filters", role: "search", "aria-label": "find a task" }, field("by", "Find by", by), field("find", "Id or key", findIn), h("button", { type: "submit" }, "Find"));
  const box = h("div", { "aria-live": "polite" });
  find.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    try {
      const t = await api(by.value === "id" ? `/v1/tasks/${encodeURIComponent(findIn.value.trim())}` : `/v1/tasks/by-key/${encodeURIComponent(findIn.value)}`);
      location.hash = `#/tasks/${t.id}`;
    } catch (e) { showError(box, e, "tasks"); }
  });
  main.replaceChildren(h("h1", {}, "Tasks"), filter, find, box);
  const cursors = (q.get("stack") ?? "").split(",").filter(Boolean);
  const params = new URLSearchParams();
  for (const k of ["pool", "status", "kind"]) if (q.get(k)) params.set(k, q.get(k)!);
  params.set("limit", q.get("limit") ?? "50");
  if (q.get("after")) params.set("after", q.get("after")!);
  try {
    const r = await api(`/ui/api/tasks?${params}`);
    const rows = r.tasks.map((t: J) => [taskLink(t.id), t.key ?? "", t.pool, t.kind ?? "", h("span", { class: `status st-${t.status}` }, t.status), String(t.attempt), nsDate(t.created_unix_ns)]);
    const nav = h("nav", { class: "pager", "aria-label": "pages" });
    const base = new URLSearchParams(params); base.delete("after");
    if (q.get("after")) {
      const prev = new URLSearchParams(base); const st = [...cursors]; const back = st.pop();
      if (back && back !== "0") prev.set("after", back); if (st.length) prev.set("stack", st.join(","));
      nav.append(h("a", { href: `#/tasks?${prev}`, class: "button" }, "Previous"));
    }
    if (r.next_after && r.next_after !== "0") {
      const next = new URLSearchParams(base); next.set("after", String(r.next_after)); next.set("stack", [...cursors, q.get("after") ?? "0"].join(","));
      nav.append(h("a", { href: `#/tasks?${next}`, class: "button" }, "Next"));
    }
    box.replaceChildren(r.tasks.length ? table(["id", "key", "pool", "kind", "status", "attempt", "created"], rows, "tasks") : h("p", {}, "No tasks match."), nav);
  } catch (e) { showError(box, e, "tasks"); }
}

function preview(p: J | null): HTMLElement {
  if (!p) return h("p", {}, "none");
  const body = p.json !== undefined ? JSON.stringify(p.json, null, 2) : p.text !== undefined ? p.text : p.hex;
  return h("div", {}, h("p", { class: "meta" }, `${p.size} bytes${p.content_type ? ", " + p.content_type : ""}${p.truncated ? ", truncated" : ""}`), h("pre", {}, body));
}

const TERMINAL = new Set(["succeeded", "failed", "dead_lettered", "cancelled", "skipped", "missed", "shed"]);

async function taskPage(id: string, notice = ""): Promise<void> {
  const box = h("div", {});
  const msg = h("p", { "aria-live": "assertive", class: "notice" }, notice);
  main.replaceChildren(h("h1", {}, `Task ${id}`), msg, box);
  try {
    const r = await api(`/ui/api/tasks/${encodeURIComponent(id)}`);
    const t = r.task;
    const actions = h("div", { class: "actions" });
    if (!TERMINAL.has(t.status)) {
      const b = h("button", { type: "button" }, "Cancel");
      b.addEventListener("click", async () => { try { const a = await api(`/v1/tasks/${id}`, { method: "DELETE" }); await taskPage(id, a.cancelled ? "Cancelled." : "Not cancelled: the task has ended."); } catch (e) { msg.textContent = (e as Error).message; } });
      actions.append(b);
    }
    if ((t.status === "failed" || t.status === "dead_lettered") && r.resubmit) {
      const b = h("button", { type: "button" }, "Submit again");
      b.addEventListener("click", async () => { try { const a = await api("/v1/tasks", { method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(r.resubmit) }); location.hash = `#/tasks/${a.id}?from=${encodeURIComponent(id)}`; } catch (e) { msg.textContent = (e as Error).message; } });
      actions.append(b);
    }
    const facts: [string, string | Node][] = [["status", h("span", { class: `status st-${t.status}`, "data-field": "status" }, t.status)], ["pool", t.pool], ["key", t.key ?? ""], ["kind", t.kind ?? ""], ["priority", t.priority ?? ""], ["attempt", `${t.attempt}${t.max_attempts ? " of " + t.max_attempts : ""}`], ["created", nsDate(t.created_unix_ns)], ["started", nsDate(t.started_unix_ns)], ["finished", nsDate(t.finished_unix_ns)], ["message", t.message ?? ""]];
    const deps = (list: J[], label: string) => list.length ? table(["id", "key", "condition", "status"], list.map((d) => [d.id ? taskLink(String(d.id)) : "", d.key ?? "", d.condition ?? "", d.status ?? ""]), label) : h("p", {}, "none");
    box.replaceChildren(actions,
      h("dl", { class: "facts" }, ...facts.flatMap(([k, v]) => [h("dt", {}, k), h("dd", {}, v)])),
      h("h2", {}, "Attempts"), (r.attempts ?? []).length ? h("ol", { class: "timeline" }, ...r.attempts.map((a: J) => h("li", { class: `st-${a.status}`, "data-attempt": String(a.attempt) },
        h("strong", {}, `attempt ${a.attempt}: ${a.status}`), h("span", { class: "meta" }, ` started ${nsDate(a.started_unix_ns)}${a.started_unix_ns && a.finished_unix_ns ? `, ended ${nsDate(a.finished_unix_ns)} after ${seconds(a.started_unix_ns, a.finished_unix_ns)}` : ""}`),
        a.message ? h("pre", { class: "error" }, a.message) : ""))) : h("p", {}, "none yet"),
      h("h2", {}, "Payload"), h("div", { class: "payload" }, preview(r.payload)),
      h("h2", {}, "Output"), h("div", { class: "output" }, preview(r.output)),
      h("h2", {}, "Parents"), deps(r.parents ?? [], "parents"),
      h("h2", {}, "Children"), deps(r.children ?? [], "children"),
      h("h2", {}, "Spec"), h("pre", {}, JSON.stringify(r.spec, null, 2)));
  } catch (e) { showError(box, e, "tasks"); }
}

// --- events ---
let paused = false;
const EVENT_COLS = ["time", "id", "pool", "key", "kind", "status", "attempt", "message"];
async function events(q: URLSearchParams): Promise<void> {
  const inputs = ["pool", "kind", "status"].map((n) => { const i = h("input", { id: `e-${n}`, type: "text" }) as HTMLInputElement; i.value = q.get(n) ?? ""; return [n, i] as const; });
  const form = h("form", { class: "filters", "aria-label": "filter events" }, ...inputs.map(([n, i]) => h("div", { class: "field" }, h("label", { for: `e-${n}` }, n), i)), h("button", { type: "submit" }, "Apply"));
  form.addEventListener("submit", (ev) => { ev.preventDefault(); const n = new URLSearchParams(); for (const [k, i] of inputs) if (i.value) n.set(k, i.value); location.hash = `#/events?${n}`; });
  const pause = h("button", { type: "button", "aria-pressed": String(paused) }, paused ? "Resume" : "Pause");
  pause.addEventListener("click", () => { paused = !paused; pause.textContent = paused ? "Resume" : "Pause"; pause.setAttribute("aria-pressed", String(paused)); });
  const list = h("tbody", {});
  const box = h("div", {});
  const state = h("span", { id: "stream-state", class: "meta", role: "status" });
  main.replaceChildren(h("h1", {}, "Live events"), form, h("p", {}, pause, " ", state), box, h("div", { class: "scroll" }, h("table", { "aria-label": "events" }, h("thead", {}, h("tr", {}, ...EVENT_COLS.map((c) => h("th", { scope: "col" }, c)))), list)));
  const params = new URLSearchParams(); for (const k of ["pool", "kind", "status"]) if (q.get(k)) params.set(k, q.get(k)!);
  const signal = abort!.signal;
  // The stream ends when the server stops or the Watch falls behind: connect again then.
  while (!signal.aborted) {
    try {
      const headers = new Headers(); const tok = sessionStorage.getItem(TOKEN_KEY); if (tok) headers.set("Authorization", `Bearer ${tok}`);
      state.textContent = "connecting"; state.dataset.state = "connecting";
      const r = await fetch(`/ui/api/events?${params}`, { headers, signal });
      if (r.status === 401) { sessionStorage.removeItem(TOKEN_KEY); askToken("the token was not accepted"); return; }
      if (!r.ok || !r.body) { const b = await r.json().catch(() => ({})); throw new ApiError(r.status, b.error ?? `HTTP ${r.status}`); }
      state.textContent = "live"; state.dataset.state = "live";
      const reader = r.body.pipeThrough(new TextDecoderStream()).getReader();
      let buf = "";
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buf += value;
        let i;
        while ((i = buf.indexOf("\n")) >= 0) {
          const line = buf.slice(0, i).trimEnd(); buf = buf.slice(i + 1);
          if (!line.startsWith("data:") || paused) continue;
          const e = JSON.parse(line.slice(5));
          list.prepend(h("tr", { "data-id": String(e.id), "data-status": e.status ?? "" }, ...[nsDate(e.at_unix_ns), taskLink(String(e.id)), e.pool ?? "", e.key ?? "", e.kind ?? "", h("span", { class: `status st-${e.status}` }, e.status ?? ""), String(e.attempt ?? ""), e.message ?? ""].map((c, n) => h("td", { "data-label": EVENT_COLS[n] }, c))));
          while (list.childElementCount > 500) list.lastElementChild!.remove();
        }
      }
    } catch (e) {
      if (e instanceof ApiError) { state.textContent = ""; state.dataset.state = "refused"; showError(box, e, "live events"); return; }
      if (signal.aborted) return;
    }
    state.textContent = "reconnecting"; state.dataset.state = "reconnecting";
    await new Promise((done) => setTimeout(done, 1000));
  }
}

// --- workers, recurring, shards ---
async function simple(title: string, path: string, view: string, f: (r: J) => HTMLElement): Promise<void> {
  const box = h("div", {});
  main.replaceChildren(h("h1", {}, title), box);
  try { box.replaceChildren(f(await api(path))); } catch (e) { showError(box, e, view); }
}

const workers = () => simple("Workers", "/v1/workers", "workers", (r) => r.workers.length ? table(["id", "name", "pool", "labels", "slots", "leases held", "connected since"], r.workers.map((w: J) => [w.id, w.name ?? "", w.pool, Object.entries(w.labels ?? {}).map(([k, v]) => `${k}=${v}`).join(", "), String(w.slots), String(w.busy ?? 0), nsDate(w.connected_unix_ns)]), "workers") : h("p", {}, "No workers connected."));
const recurring = () => simple("Recurring", "/v1/recurring", "recurring schedules", (r) => r.schedules.length ? table(["name", "cron", "time zone", "pool", "kind", "overlap", "next occurrence", "last task"], r.schedules.map((s: J) => [s.name, s.cron, s.tz ?? "UTC", s.pool, s.kind, s.overlap, nsDate(s.next_unix_ns), s.last_task_id ? taskLink(String(s.last_task_id)) : ""]), "recurring schedules") : h("p", {}, "No recurring schedules."));
const shardsView = () => simple("Shards", "/ui/api/shards", "shards", (r) => !r.shards.length ? h("p", {}, "This server is not sharded.") : table(["name", "endpoint", "up", "this server"], r.shards.map((s: J) => [s.name, s.endpoint, s.up ? "up" : "down", s.own ? "yes" : ""]), "shards"));

// --- routing ---
function stop(): void { if (timer !== undefined) clearInterval(timer); timer = undefined; abort?.abort(); abort = new AbortController(); }

async function route(): Promise<void> {
  stop();
  errors.textContent = "";
  if (authOn && !sessionStorage.getItem(TOKEN_KEY)) return askToken();
  const hash = location.hash.replace(/^#\/?/, "") || "overview";
  const [path, query = ""] = hash.split("?");
  const q = new URLSearchParams(query);
  const parts = path.split("/");
  for (const a of document.querySelectorAll("nav.main a")) a.toggleAttribute("aria-current", a.getAttribute("href") === `#/${parts[0]}`);
  document.body.classList.remove("nav-open");
  document.getElementById("nav-toggle")!.setAttribute("aria-expanded", "false");
  if (parts[0] === "tasks" && parts[1]) return taskPage(decodeURIComponent(parts[1]), q.get("from") ? `Submitted again as a copy of task ${q.get("from")}.` : "");
  switch (parts[0]) {
    case "tasks": return tasks(q);
    case "events": return events(q);
    case "workers": return workers();
    case "recurring": return recurring();
    case "shards": return shardsView();
    default: return overview();
  }
}

async function start(): Promise<void> {
  const toggle = document.getElementById("nav-toggle")!;
  toggle.addEventListener("click", () => { const open = document.body.classList.toggle("nav-open"); toggle.setAttribute("aria-expanded", String(open)); });
  document.querySelector("a.skip")!.addEventListener("click", (ev) => { ev.preventDefault(); main.focus(); });
  try {
    const r = await fetch("/ui/api/info");
    const info = await r.json();
    authOn = !!info.auth;
    document.getElementById("version")!.textContent = `cronoq ${info.version}`;
  } catch (e) { errors.textContent = `cannot reach the server: ${(e as Error).message}`; }
  window.addEventListener("hashchange", route);
  await route();
  if (!authOn || sessionStorage.getItem(TOKEN_KEY)) {
    try { const s = await api("/ui/api/shards"); if (s.shards?.length) document.getElementById("nav-shards")!.hidden = false; } catch { /* view hidden */ }
  }
}

start();

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

// A write: JSON body; the browser adds the page's Origin, which the API's writes require.
function post(path: string, body: J): Promise<J> {
  return api(path, { method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body) });
}

const aborted = (e: unknown) => e instanceof DOMException && e.name === "AbortError";

function errorText(e: unknown, what: string): string {
  return e instanceof ApiError && e.status === 403 ? `this token's role does not allow ${what}` : String((e as Error).message ?? e);
}

function showError(where: HTMLElement, e: unknown, view: string): void {
  if (!aborted(e)) where.replaceChildren(h("p", { class: "error", role: "alert" }, errorText(e, view)));
}

function say(notice: HTMLElement, text: string, bad = false): void {
  notice.textContent = text;
  notice.classList.toggle("error", bad);
}

// A modal question: true only when `yes` is pressed (Escape, Back or leaving the view: false).
function confirmDialog(title: string, body: (Node | string)[], yes: string, allowed = true): Promise<boolean> {
  const ok = h("button", { type: "button", class: "primary" }, yes) as HTMLButtonElement;
  const back = h("button", { type: "button" }, "Back");
  ok.disabled = !allowed;
  const dialog = h("dialog", { "aria-labelledby": "dlg-title" }, h("h2", { id: "dlg-title" }, title), h("p", { id: "dlg-text" }, ...body), h("div", { class: "actions" }, back, ok)) as HTMLDialogElement;
  let answer = false;
  ok.addEventListener("click", () => { answer = true; dialog.close(); });
  back.addEventListener("click", () => dialog.close());
  document.body.append(dialog);
  dialog.showModal();
  return new Promise((done) => dialog.addEventListener("close", () => { dialog.remove(); done(answer); }));
}

function nsDate(ns: string | number | undefined): string {
  if (!ns || ns === "0") return "";
  const ms = Number(BigInt(ns) / 1000000n);
  const age = Math.round((Date.now() - ms) / 1000);
  const rel = Math.abs(age) < 60 ? `${Math.abs(age)} s` : Math.abs(age) < 3600 ? `${Math.round(Math.abs(age) / 60)} min` : `${Math.round(Math.abs(age) / 3600)} h`;
  return `${new Date(ms).toLocaleString()} (${age >= 0 ? rel + " ago" : "in " + rel})`;
}

// A time in a table: the clock time (the date too unless today), the full date on hover.
function when(ns?: string): Node | string {
  if (!ns || ns === "0") return "";
  const d = new Date(Number(BigInt(ns) / 1000000n));
  return h("time", { datetime: d.toISOString(), title: d.toLocaleString() }, d.toDateString() === new Date().toDateString() ? d.toLocaleTimeString() : d.toLocaleString());
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
let lastTotals: { t: number; v: J } | undefined;
// The charts show the server's history (so they are full when the page opens): the last hour,
// or less while the server has not led that long, but at least MIN_SPAN_S. The page then asks
// only for the steps since the last it holds.
const HOUR_S = 3600;
const MIN_SPAN_S = 60;
const TICKS_S = [10, 15, 30, 60, 120, 300, 600, 900, 1800];
const past = { step: 10, now: 0, fetched: 0, pools: new Map<string, J[]>() };
type ChartSpec = { id: string; title: string; unit: string; rate: boolean; lines: [string, string, string][] };
// Counts per step become rates per second (`rate`); each line: its field, its name, its colour.
const CHARTS: ChartSpec[] = [
  { id: "throughput", title: "Throughput", unit: "tasks/s", rate: true, lines: [["started", "started", "c-blue"], ["succeeded", "succeeded", "c-green"]] },
  { id: "failures", title: "Failures", unit: "tasks/s", rate: true, lines: [["failed", "failed", "c-orange"], ["dead_lettered", "dead-lettered", "c-red"]] },
  { id: "queue", title: "Queue depth", unit: "tasks", rate: false, lines: [["pending", "pending", "c-blue"], ["busy", "busy", "c-green"], ["capacity", "capacity", "c-grey"]] },
  { id: "latency", title: "Submit to start", unit: "s", rate: false, lines: [["wait_p50", "p50", "c-green"], ["wait_p90", "p90", "c-orange"], ["wait_p99", "p99", "c-red"]] },
];
const SVG_NS = "http://www.w3.org/2000/svg";
const CW = 560, CH = 180, PAD = { l: 48, r: 12, t: 10, b: 22 };

function svg(tag: string, attrs: Record<string, string | number>, ...kids: (Node | string)[]): SVGElement {
  const el = document.createElementNS(SVG_NS, tag);
  for (const [k, v] of Object.entries(attrs)) el.setAttribute(k, String(v));
  for (const c of kids) el.append(c);
  return el;
}

// The y axis's top: the smallest of 1, 2, 2.5 or 5 times a power of ten at or above `v`.
function niceMax(v: number): number {
  if (!(v > 0)) return 1;
  const e = 10 ** Math.floor(Math.log10(v));
  return [1, 2, 2.5, 5, 10].map((m) => m * e).find((m) => m >= v * (1 - 1e-9))!;
}

function number(v: number): string {
  return v >= 1000 ? `${+(v / 1000).toPrecision(3)}k` : String(+v.toPrecision(3));
}

function clock(t: number, seconds: boolean): string {
  return new Date(t * 1000).toLocaleTimeString([], { hour: "2-digit", minute: "2-digit", hourCycle: "h23", ...(seconds ? { second: "2-digit" } : {}) });
}

// One chart from `from` to `to` (Unix s): labelled axes, and each line broken where a step is
// missing or has no value, so that a gap shows as a gap; a lone point is drawn as a dot.
function chart(spec: ChartSpec, pool: string, points: J[], step: number, from: number, to: number): SVGElement {
  const value = (p: J, k: string): number | null => (typeof p[k] === "number" ? (spec.rate ? p[k] / step : p[k]) : null);
  const max = niceMax(Math.max(0, ...points.flatMap((p) => spec.lines.map(([k]) => value(p, k) ?? 0))));
  const x = (t: number) => (PAD.l + ((CW - PAD.l - PAD.r) * (t - from)) / (to - from)).toFixed(1);
  const y = (v: number) => (PAD.t + (CH - PAD.t - PAD.b) * (1 - v / max)).toFixed(1);
  const g = svg("svg", { viewBox: `0 0 ${CW} ${CH}`, class: "chart", role: "img", "data-chart": spec.id, "aria-label": `${spec.title} (${spec.unit}) in pool ${pool} from ${clock(from, true)} to ${clock(to, true)}` });
  for (const v of [0, max / 2, max]) {
    g.append(svg("line", { x1: PAD.l, x2: CW - PAD.r, y1: y(v), y2: y(v), class: v ? "grid" : "axis" }),
      svg("text", { x: PAD.l - 5, y: Number(y(v)) + 4, "text-anchor": "end", class: "tick y" }, number(v)));
  }
  const every = TICKS_S.find((s) => (to - from) / s <= 5) ?? HOUR_S;
  for (let t = Math.ceil(from / every) * every; t <= to; t += every) {
    g.append(svg("line", { x1: x(t), x2: x(t), y1: CH - PAD.b, y2: CH - PAD.b + 4, class: "axis" }),
      svg("text", { x: x(t), y: CH - 5, "text-anchor": "middle", class: "tick x" }, clock(t, every < 60)));
  }
  g.append(svg("line", { x1: PAD.l, x2: PAD.l, y1: PAD.t, y2: CH - PAD.b, class: "axis" }));
  for (const [k, name, colour] of spec.lines) {
    const runs: string[][] = [];
    let prev: number | undefined;
    for (const p of points) {
      const v = value(p, k);
      if (v === null || p.t < from) { prev = undefined; continue; }
      // A late sample stretches a step; one missing shows as a gap of about two.
      if (prev === undefined || p.t - prev > step * 1.75) runs.push([]);
      runs[runs.length - 1].push(`${x(p.t)},${y(v)}`);
      prev = p.t;
    }
    const d = runs.filter((r) => r.length > 1).map((r) => `M${r.join(" L")}`).join(" ");
    g.append(svg("path", { d, class: `line ${colour}`, "data-line": k }, svg("title", {}, name)),
      ...runs.filter((r) => r.length === 1).map(([xy]) => svg("circle", { cx: xy.split(",")[0], cy: xy.split(",")[1], r: 1.5, class: `dot ${colour}`, "data-line": k })));
  }
  if (!points.length) g.append(svg("text", { x: (CW + PAD.l) / 2, y: CH / 2, "text-anchor": "middle", class: "tick" }, "no data yet"));
  return g;
}

async function loadHistory(): Promise<void> {
  // Ask again for the last step held: the server's latest step may have grown since.
  const held = [...past.pools.values()].map((pts) => (pts.length ? pts[pts.length - 1].t : 0));
  const since = past.now && held.length ? Math.min(...held) : Date.now() / 1000 - HOUR_S;
  const r = await api(`/ui/api/history?since=${since}`);
  past.step = r.step; past.now = r.now; past.fetched = Date.now();
  for (const [name, pts] of Object.entries(r.pools as Record<string, J[]>)) {
    const first = pts.length ? pts[0].t : Infinity;
    past.pools.set(name, (past.pools.get(name) ?? []).filter((p) => p.t < first && p.t >= r.now - HOUR_S).concat(pts));
  }
}

function charts(): HTMLElement[] {
  const first = Math.min(...[...past.pools.values()].map((pts) => pts[0]?.t ?? Infinity));
  const from = past.now - Math.min(HOUR_S, Math.max(MIN_SPAN_S, past.now - first));
  if (!past.pools.size) return [h("p", { class: "meta" }, `No history yet: the server records a point every ${past.step} s while it leads.`)];
  return [...past.pools.entries()].map(([name, pts]) => h("article", { class: "pool-charts", "data-pool": name }, h("h3", {}, name),
    h("div", { class: "charts" }, ...CHARTS.map((c) => h("figure", { "data-figure": c.id },
      h("figcaption", {}, `${c.title} (${c.unit})`), chart(c, name, pts, past.step, from, past.now),
      h("p", { class: "legend" }, ...c.lines.map(([, label, colour]) => h("span", { class: `key ${colour}` }, label))))))));
}

function unserved(pending: number): HTMLElement {
  return h("p", { class: "warning", "data-warning": "unserved" }, `no worker serves this pool: ${pending} ${pending === 1 ? "task" : "tasks"} waiting`);
}

async function overview(): Promise<void> {
  const box = h("section", { "aria-labelledby": "h-ov" });
  const notice = h("p", { class: "notice", role: "status" });
  const graphs = h("div", {});
  const totalsBox = h("section", {});
  main.replaceChildren(h("h1", { id: "h-ov" }, "Overview"), notice, box, graphs, totalsBox);
  const control = async (pool: string, pause: boolean) => {
    const verb = pause ? "Pause" : "Resume";
    const why = pause ? "Nothing new starts in it until it is resumed: running attempts finish, and tasks submitted meanwhile wait." : "Its waiting tasks start again as its slots allow.";
    if (!(await confirmDialog(`${verb} pool ${pool}?`, [why], verb))) return;
    try {
      const r = await post(`/v1/pools/${encodeURIComponent(pool)}/${pause ? "pause" : "resume"}`, {});
      say(notice, r.changed ? `${r.paused ? "Paused" : "Resumed"} pool ${pool}.` : `Pool ${pool} was already ${r.paused ? "paused" : "running"}.`);
      await tick();
    } catch (e) { if (!aborted(e)) say(notice, errorText(e, "pausing or resuming pools: that needs the admin role"), true); }
  };
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
        const pc = p.pending_by_class;
        const toggle = h("button", { type: "button", id: `toggle-${p.name}`, "aria-label": `${p.paused ? "Resume" : "Pause"} pool ${p.name}` }, p.paused ? "Resume" : "Pause");
        toggle.addEventListener("click", () => control(p.name, !p.paused));
        pools.push(h("article", { class: "pool", "data-pool": p.name },
          h("div", { class: "pool-head" }, h("h3", {}, p.name), p.paused ? h("span", { class: "badge", "data-badge": "paused" }, "paused") : "", toggle),
          p.unserved ? unserved(p.pending) : "",
          h("dl", {}, ...[["capacity", p.capacity], ["busy", p.busy], ["desired", p.desired], ["held", p.held], ["workers", p.workers_connected],
            ["pending", `${p.pending} (critical ${pc[0]}, high ${pc[1]}, normal ${pc[2]}, low ${pc[3]})`],
            ["utilization", `${(p.utilization * 100).toFixed(0)}%`], ["priority adherence", `${(p.priority_adherence * 100).toFixed(0)}%`],
            ["fixed-start hit rate", `${(p.fixed_start_hit_rate * 100).toFixed(0)}%`],
            ["wait p50/p90/p99", `${p.wait_p50_s.toFixed(3)} / ${p.wait_p90_s.toFixed(3)} / ${p.wait_p99_s.toFixed(3)} s`]]
            .flatMap(([k, v]) => [h("dt", {}, String(k)), h("dd", { "data-field": String(k) }, String(v))]))));
      }
      // The cards are drawn anew each time: keep the keyboard focus on the button it was on.
      const focused = document.activeElement?.id;
      box.replaceChildren(
        h("dl", { class: "summary" }, ...([["live tasks", "live_tasks"], ["running", "running"], ["pending", "pending"], ["workers", "workers_connected"]] as const)
          .flatMap(([label, k]) => [h("dt", {}, label), h("dd", { "data-summary": k }, String(s[k]))])),
        s.unavailable_shards.length ? h("p", { class: "error", role: "alert" }, `unavailable shards: ${s.unavailable_shards.join(", ")}`) : "",
        h("h2", {}, "Pools"), h("div", { class: "pools" }, ...pools));
      totalsBox.replaceChildren(h("h2", {}, "Totals"),
        h("div", { class: "totals" }, table(["counter", "total", "per second"], totals.map((k) => [k.split("_").join(" "), h("span", { "data-total": k }, String(s.totals[k])), rates[k]]), "totals")));
      if (focused?.startsWith("toggle-")) document.getElementById(focused)?.focus();
      if (t - past.fetched >= past.step * 1000) {
        await loadHistory();
        graphs.replaceChildren(h("h2", {}, "History"), ...charts());
      }
    } catch (e) { showError(box, e, "the overview"); }
  };
  if (past.fetched) graphs.replaceChildren(h("h2", {}, "History"), ...charts());
  await tick();
  timer = window.setInterval(tick, 2000);
}

// --- tasks ---
const STATUSES = ["", "blocked", "scheduled", "ready", "running", "retrying", "succeeded", "failed", "dead_lettered", "cancelled", "skipped", "missed", "shed"];
// The search form's fields as the hash keeps them: name, label, input type.
const SEARCH: [string, string, string][] = [
  ["key", "Key", "text"], ["prefix", "Key prefix", "text"], ["tag", "Tags (k=v, ...)", "text"], ["kind", "Kind", "text"],
  ["status", "Status", "select"], ["pool", "Pool", "text"], ["from", "Submitted from", "datetime-local"], ["to", "Submitted before", "datetime-local"],
];
// The list's columns: label, the search's sort key (null: not sortable), the cell.
const TASK_COLS: [string, string | null, (t: J) => Node | string][] = [
  ["id", "id", (t) => taskLink(t.id)],
  ["key", null, (t) => t.key ?? ""],
  ["pool", "pool", (t) => t.pool],
  ["kind", "kind", (t) => t.kind ?? ""],
  ["priority", "priority", (t) => t.priority ?? ""],
  ["status", "status", (t) => h("span", { class: `status st-${t.status}` }, t.status)],
  ["attempt", "attempt", (t) => String(t.attempt)],
  ["worker", null, (t) => worker(t.worker_name, t.worker_id)],
  ["submitted", "submitted", (t) => when(t.created_unix_ns)],
  ["started", "started", (t) => when(t.started_unix_ns)],
  ["finished", "finished", (t) => when(t.finished_unix_ns)],
];
// Each bulk action: its button, the dry run's count explained, what was done.
const BULK: Record<string, [string, string, string]> = {
  cancel: ["Cancel", "have not ended: they will be cancelled.", "Cancelled"],
  retry: ["Retry", "ended without succeeding (failed, dead-lettered, cancelled, skipped, missed or shed): each is submitted again as a new task (same spec and payload, no key).", "Submitted again"],
  delete: ["Delete from history", "have ended: they will be forgotten, in memory and in the store. This cannot be undone.", "Deleted from history"],
};

function worker(name?: string, id?: string | number): string {
  return name ? `${name} (${id})` : "";
}

// The search's TaskFilter from the hash: lists are comma-separated, times local.
function filterOf(q: URLSearchParams): J {
  const list = (k: string) => (q.get(k) ?? "").split(",").map((s) => s.trim()).filter(Boolean);
  const f: J = {};
  for (const [k, name] of [["pool", "pools"], ["status", "statuses"], ["kind", "kinds"]]) if (list(k).length) f[name] = list(k);
  if (list("tag").length) f.tags = Object.fromEntries(list("tag").map((kv) => [kv.slice(0, kv.indexOf("=")), kv.slice(kv.indexOf("=") + 1)]));
  if (q.get("key")) f.key = q.get("key");
  if (q.get("prefix")) f.key_prefix = q.get("prefix");
  if (q.get("from")) f.submitted_after = new Date(q.get("from")!).getTime() / 1000;
  if (q.get("to")) f.submitted_before = new Date(q.get("to")!).getTime() / 1000;
  return f;
}

// The selection outlives a page change but not a change of the filter it was made under.
let picked = new Set<string>();
let pickedUnder = "";
let allMatching = false;

async function tasks(q: URLSearchParams): Promise<void> {
  const field = (name: string, label: string, el: HTMLElement) => { el.id = `f-${name}`; el.setAttribute("name", name); return h("div", { class: "field" }, h("label", { for: `f-${name}` }, label), el); };
  const inputs = new Map<string, HTMLInputElement | HTMLSelectElement>();
  const search = h("form", { class: "filters", role: "search", "aria-label": "search tasks" }, ...SEARCH.map(([name, label, type]) => {
    // (a list of statuses the hash names, as a link may, is kept as one more choice)
    const given = q.get(name) ?? "";
    const el = type === "select" ? h("select", {}, ...[...STATUSES, ...(STATUSES.includes(given) ? [] : [given])].map((s) => h("option", { value: s }, s || "any"))) as HTMLSelectElement
      : h("input", { type, ...(type === "datetime-local" ? { step: "1" } : {}), ...(name === "tag" ? { pattern: "\\s*[^=,]+=[^,]*(,\\s*[^=,]+=[^,]*)*", title: "key=value pairs, comma-separated" } : {}) }) as HTMLInputElement;
    el.value = given;
    inputs.set(name, el);
    return field(name, label, el);
  }), h("button", { type: "submit" }, "Search"), h("a", { href: "#/tasks", class: "button" }, "Clear"));
  search.addEventListener("submit", (ev) => {
    ev.preventDefault();
    const n = new URLSearchParams();
    for (const [k, el] of inputs) if (el.value) n.set(k, el.value);
    for (const k of ["sort", "dir", "limit"]) if (q.get(k)) n.set(k, q.get(k)!);
    location.hash = `#/tasks?${n}`;
  });
  const findIn = h("input", { type: "text" }) as HTMLInputElement;
  const by = h("select", {}, h("option", { value: "id" }, "id"), h("option", { value: "key" }, "key")) as HTMLSelectElement;
  const find = h("form", { class: "filters", role: "search", "aria-label": "find a task" }, field("by", "Find by", by), field("find", "Id or key", findIn), h("button", { type: "submit" }, "Find"));
  const box = h("div", { "aria-live": "polite" });
  const notice = h("p", { class: "notice", role: "status" });
  const bar = h("div", { class: "bulk", role: "group", "aria-label": "bulk actions" });
  find.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    try {
      const t = await api(by.value === "id" ? `/v1/tasks/${encodeURIComponent(findIn.value.trim())}` : `/v1/tasks/by-key/${encodeURIComponent(findIn.value)}`);
      location.hash = `#/tasks/${t.id}`;
    } catch (e) { showError(box, e, "tasks"); }
  });
  main.replaceChildren(h("h1", {}, "Tasks"), search, find, bar, notice, box);

  const filter = filterOf(q);
  if (JSON.stringify(filter) !== pickedUnder) { picked = new Set(); allMatching = false; pickedUnder = JSON.stringify(filter); }
  const sort = q.get("sort") ?? "id";
  const ascending = q.get("dir") === "asc";
  const limit = Math.max(1, Number(q.get("limit")) || 50);
  const page = Math.max(1, Number(q.get("page")) || 1);
  const here = (changes: Record<string, string | null>) => {
    const n = new URLSearchParams(q);
    for (const [k, v] of Object.entries(changes)) if (v === null) n.delete(k); else n.set(k, v);
    return `#/tasks?${n}`;
  };

  const act = async (action: string) => {
    const [label, meaning, done] = BULK[action];
    const target = allMatching ? filter : { ids: [...picked] };
    try {
      const dry = await post("/v1/tasks/bulk", { action, filter: target, dry_run: true });
      const sure = await confirmDialog(`${label}?`, [h("strong", { id: "dlg-count" }, String(dry.affected)), ` of the ${dry.matched} selected tasks ${meaning}`],
        dry.affected ? `${label}: ${dry.affected} tasks` : "Nothing to do", dry.affected > 0);
      if (!sure) return;
      const r = await post("/v1/tasks/bulk", { action, filter: target, dry_run: false });
      picked = new Set(); allMatching = false;
      say(notice, `${done}: ${r.affected} of ${r.matched} tasks.`);
      notice.dataset.affected = String(r.affected);
      await load();
    } catch (e) { if (!aborted(e)) say(notice, errorText(e, "bulk actions: they need the admin role"), true); }
  };

  const load = async () => {
    try {
      const r = await post("/v1/tasks/search", { filter, sort, ascending, limit, offset: (page - 1) * limit });
      const ids: string[] = r.tasks.map((t: J) => String(t.id));
      const boxes: HTMLInputElement[] = [];
      const pageBox = h("input", { type: "checkbox", id: "pick-page" }) as HTMLInputElement;
      const drawBar = () => {
        const n = allMatching ? r.total : picked.size;
        const onPage = ids.filter((id) => allMatching || picked.has(id)).length;
        pageBox.checked = ids.length > 0 && onPage === ids.length;
        pageBox.indeterminate = onPage > 0 && onPage < ids.length;
        for (const b of boxes) b.checked = allMatching || picked.has(b.value);
        const all = h("button", { type: "button", id: "pick-all" }, `Select all ${r.total} matching`);
        all.addEventListener("click", () => { allMatching = true; drawBar(); });
        const clear = h("button", { type: "button" }, "Clear selection");
        clear.addEventListener("click", () => { picked = new Set(); allMatching = false; drawBar(); });
        const buttons = Object.entries(BULK).map(([action, [label]]) => {
          const b = h("button", { type: "button", "data-action": action }, `${label}...`) as HTMLButtonElement;
          b.disabled = n === 0;
          b.addEventListener("click", () => act(action));
          return b;
        });
        bar.replaceChildren(h("label", { class: "pick-page" }, pageBox, " this page"), h("span", { id: "picked", "data-count": String(n) }, allMatching ? `all ${n} matching tasks selected` : `${n} selected`),
          pageBox.checked && !allMatching && r.total > ids.length ? all : "", n ? clear : "", ...buttons);
      };
      pageBox.addEventListener("change", () => {
        if (!pageBox.checked && allMatching) { allMatching = false; picked = new Set(); }
        for (const id of ids) if (pageBox.checked) picked.add(id); else picked.delete(id);
        drawBar();
      });
      const head = TASK_COLS.map(([label, key]) => {
        if (!key) return h("th", { scope: "col" }, label);
        const on = sort === key;
        return h("th", { scope: "col", "aria-sort": on ? (ascending ? "ascending" : "descending") : "none" },
          h("a", { href: here({ sort: key, dir: on && !ascending ? "asc" : "desc", page: null }), class: "sort", "data-sort": key }, label, on ? (ascending ? " \u25B2" : " \u25BC") : ""));
      });
      const rows = r.tasks.map((t: J) => {
        const b = h("input", { type: "checkbox", value: String(t.id), "aria-label": `select task ${t.id}` }) as HTMLInputElement;
        b.addEventListener("change", () => {
          if (allMatching) { allMatching = false; picked = new Set(ids); }
          if (b.checked) picked.add(b.value); else picked.delete(b.value);
          drawBar();
        });
        boxes.push(b);
        return h("tr", { "data-id": String(t.id) }, h("td", { class: "pick", "data-label": "select" }, b), ...TASK_COLS.map(([label, , cell]) => h("td", { "data-label": label }, cell(t))));
      });
      const pages = Math.max(1, Math.ceil(r.total / limit));
      const nav = h("nav", { class: "pager", "aria-label": "pages" });
      if (page > 1) nav.append(h("a", { href: here({ page: String(page - 1) }), class: "button" }, "Previous"));
      nav.append(h("span", { class: "meta" }, `page ${page} of ${pages}`));
      if (page < pages) nav.append(h("a", { href: here({ page: String(page + 1) }), class: "button" }, "Next"));
      box.replaceChildren(h("p", { id: "total", "data-total": String(r.total) }, `${r.total} ${r.total === 1 ? "task matches" : "tasks match"}`),
        (r.unavailable_shards ?? []).length ? h("p", { class: "error", role: "alert" }, `unavailable shards: ${r.unavailable_shards.join(", ")}`) : "",
        r.tasks.length ? h("div", { class: "scroll" }, h("table", { "aria-label": "tasks", class: "tasks" },
          h("thead", {}, h("tr", {}, h("th", { scope: "col", class: "pick" }, "select"), ...head)), h("tbody", {}, ...rows))) : h("p", {}, "No tasks match."), nav);
      drawBar();
    } catch (e) { bar.replaceChildren(); showError(box, e, "tasks"); }
  };
  await load();
}

function preview(p: J | null): HTMLElement {
  if (!p) return h("p", {}, "none");
  const body = p.json !== undefined ? JSON.stringify(p.json, null, 2) : p.text !== undefined ? p.text : p.hex;
  return h("div", {}, h("p", { class: "meta" }, `${p.size} bytes${p.content_type ? ", " + p.content_type : ""}${p.truncated ? ", truncated" : ""}`), h("pre", {}, body));
}

const TERMINAL = new Set(["succeeded", "failed", "dead_lettered", "cancelled", "skipped", "missed", "shed"]);
const ATTEMPT_COLS = ["attempt", "status", "started", "ended", "duration", "worker", "worker id", "message"];

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
      b.addEventListener("click", async () => { try { const a = await post("/v1/tasks", r.resubmit); location.hash = `#/tasks/${a.id}?from=${encodeURIComponent(id)}`; } catch (e) { msg.textContent = (e as Error).message; } });
      actions.append(b);
    }
    const waiting = !TERMINAL.has(t.status) && r.pool ? [r.pool.paused ? h("p", { class: "warning", "data-warning": "paused" }, `pool ${t.pool} is paused: nothing new starts in it until it is resumed`) : "", r.pool.unserved ? unserved(r.pool.pending) : ""] : [];
    const facts: [string, string | Node][] = [["status", h("span", { class: `status st-${t.status}`, "data-field": "status" }, t.status)], ["pool", t.pool], ["key", t.key ?? ""], ["kind", t.kind ?? ""], ["priority", t.priority ?? ""], ["attempt", `${t.attempt}${t.max_attempts ? " of " + t.max_attempts : ""}`], ["worker", worker(t.worker_name, t.worker_id)], ["created", nsDate(t.created_unix_ns)], ["started", nsDate(t.started_unix_ns)], ["finished", nsDate(t.finished_unix_ns)], ["message", t.message ?? ""]];
    const deps = (list: J[], label: string) => list.length ? table(["id", "key", "condition", "status"], list.map((d) => [d.id ? taskLink(String(d.id)) : "", d.key ?? "", d.condition ?? "", d.status ?? ""]), label) : h("p", {}, "none");
    const attempts: J[] = r.attempts ?? [];
    box.replaceChildren(...waiting, actions,
      h("dl", { class: "facts" }, ...facts.flatMap(([k, v]) => [h("dt", {}, k), h("dd", {}, v)])),
      h("h2", {}, "Attempts"), attempts.length ? table(ATTEMPT_COLS, attempts.map((a) => [String(a.attempt), h("span", { class: `status st-${a.status}` }, a.status), when(a.started_unix_ns), when(a.finished_unix_ns),
        a.started_unix_ns && a.finished_unix_ns ? seconds(a.started_unix_ns, a.finished_unix_ns) : "", a.worker_name ?? "", a.worker_id ?? "", a.message]), "attempts") : h("p", {}, "none yet"),
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
function stop(): void {
  if (timer !== undefined) clearInterval(timer);
  timer = undefined;
  abort?.abort();
  abort = new AbortController();
  for (const d of document.querySelectorAll("dialog")) (d as HTMLDialogElement).close();
}

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

// The sluicegate console: a client of the HTTP API only (docs/console.md). Credentials stay in
// the browser's session storage and go with every request as basic auth, as RabbitMQ's UI does.
import uPlot from "./vendor/uPlot.esm.js";

const KEY = "sluicegate-credentials";
// Seconds between two refreshes of a page; the server answers a snapshot at most once a second
// whoever asks (gateway/http/loops_api.py).
const REFRESH = 2;
// Points a chart keeps: two minutes at one per refresh.
const POINTS = 60;
const PAGE_SIZE = 50;
const MIB = 1024 * 1024;
const COLOURS = ["#2a6fb0", "#c4562a", "#3a8f3a", "#8a4fb0"];

const $ = (id) => document.getElementById(id);
let timer = null;
let generation = 0;

// -- the API --------------------------------------------------------------------------------

class ApiError extends Error {}

async function api(method, path, body) {
  // No basic-auth challenge for the console's requests: its login page asks instead.
  const headers = { "X-Requested-With": "XMLHttpRequest" };
  const token = sessionStorage.getItem(KEY);
  if (token) headers.Authorization = "Basic " + token;
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const response = await fetch("/api" + path, {
    method,
    headers,
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const text = await response.text();
  const data = text ? JSON.parse(text) : null;
  if (response.status === 401 && data && data.reason === "Login failed") {
    showLogin("Login failed");
    throw new ApiError("Login failed");
  }
  if (!response.ok) throw new ApiError((data && data.reason) || response.statusText);
  return data;
}

const enc = encodeURIComponent;

// -- DOM helpers ----------------------------------------------------------------------------

function el(tag, attributes = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attributes)) {
    if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else if (value !== undefined && value !== null) node.setAttribute(key, value);
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : String(child));
  }
  return node;
}

function table(id, columns, rows) {
  const head = el("tr", {}, columns.map(([title]) => el("th", {}, title)));
  const body = rows.map((row) =>
    el(
      "tr",
      {},
      columns.map(([, cell]) => {
        const value = cell(row);
        const numeric = typeof value === "number";
        return el("td", { class: numeric ? "num" : null }, value);
      }),
    ),
  );
  return el("table", { id }, el("thead", {}, head), el("tbody", {}, body));
}

function heldBy(reason) {
  return reason ? el("span", { class: "held" }, reason) : el("span", { class: "ok" }, "flowing");
}

function bytes(n) {
  if (n < 1024) return `${n} B`;
  const units = ["KiB", "MiB", "GiB", "TiB"];
  let value = n;
  let unit = -1;
  while (value >= 1024 && unit < units.length - 1) {
    value /= 1024;
    unit += 1;
  }
  return `${value.toFixed(1)} ${units[unit]}`;
}

function pager(listed, go) {
  if (!listed.page_count || listed.page_count <= 1) return el("p", { class: "pager" });
  return el(
    "p",
    { class: "pager" },
    el("button", { disabled: listed.page <= 1 ? "" : null, onclick: () => go(listed.page - 1) }, "‹ previous"),
    ` page ${listed.page} of ${listed.page_count} (${listed.total_count}) `,
    el(
      "button",
      { disabled: listed.page >= listed.page_count ? "" : null, onclick: () => go(listed.page + 1) },
      "next ›",
    ),
  );
}

function budgetBar(budget) {
  const share = Math.min(100, (100 * budget.used) / budget.limit);
  const fill = el("div");
  // Set through the CSSOM: the Content-Security-Policy refuses style attributes.
  fill.style.width = `${share}%`;
  return el(
    "div",
    { id: "budget-bar" },
    el("div", { class: budget.blocked ? "bar blocked" : "bar" }, fill),
    `${bytes(budget.used)} of ${bytes(budget.limit)}`,
    budget.blocked ? el("span", { class: "held" }, " — blocked: publishers that hold it wait") : "",
  );
}

function card(title, ...rows) {
  return el("div", { class: "card" }, el("h2", {}, title), el("table", {}, rows.map(([k, v]) => el("tr", {}, el("th", {}, k), el("td", {}, v)))));
}

// A live chart of counters' rates (rate: true) or of values.
class Chart {
  constructor(parent, title, names, rate) {
    this.rate = rate;
    this.last = null;
    this.data = [[], ...names.map(() => [])];
    const series = [{}, ...names.map((label, i) => ({ label, stroke: COLOURS[i], width: 2 }))];
    this.plot = new uPlot({ title, width: 460, height: 170, series }, this.data, parent);
  }

  push(values) {
    const now = Date.now() / 1000;
    const last = this.last;
    this.last = { now, values };
    if (this.rate && last === null) return;
    this.data[0].push(now);
    values.forEach((value, i) => {
      const point = this.rate ? Math.max(0, (value - last.values[i]) / (now - last.now)) : value;
      this.data[i + 1].push(point);
    });
    if (this.data[0].length > POINTS) this.data.forEach((series) => series.shift());
    this.plot.setData(this.data);
  }
}

// -- pages ----------------------------------------------------------------------------------

async function overview(page) {
  const totals = el("div", { class: "cards", id: "totals" });
  const charts = el("div", { class: "cards" });
  page.append(el("h1", {}, "Overview"), totals, charts);
  const rates = new Chart(charts, "Messages / s", ["published", "delivered", "acknowledged"], true);
  const held = new Chart(charts, "Memory budget (MiB)", ["used", "limit"], false);
  return async () => {
    const [data, budget, nodes] = await Promise.all([
      api("GET", "/overview"),
      api("GET", "/sluicegate/budget"),
      // The node's figures are an administrator's (403 for others): the card shows less.
      api("GET", "/nodes").catch(() => null),
    ]);
    const node = nodes ? nodes[0] : null;
    const log = node && node.sluicegate_log;
    const stats = data.message_stats;
    rates.push([stats.publish, stats.deliver_get, stats.ack]);
    held.push([budget.used / MIB, budget.limit / MIB]);
    const objects = data.object_totals;
    const queued = data.queue_totals;
    totals.replaceChildren(
      card("Objects", ["connections", objects.connections], ["queues", objects.queues], ["exchanges", objects.exchanges], ["consumers", objects.consumers]),
      card("Messages", ["ready", queued.messages_ready], ["unacknowledged", queued.messages_unacknowledged], ["total", queued.messages]),
      card("Memory budget", ["held", budgetBar(budget)], ["publishers held", budget.held_publisher_count], ["connections not read", budget.paused_count]),
      card(
        "Node",
        ["node", data.node],
        ["product", `${data.product_name} (RabbitMQ API ${data.rabbitmq_version})`],
        ...(node
          ? [
              ["resident memory", bytes(node.mem_used)],
              ["descriptors", node.fd_used],
              ["disk free", bytes(node.disk_free)],
              ["log", log ? `${bytes(log.bytes_written)} written, ${log.fsyncs} fsyncs${log.failing ? ", failing" : ""}` : "none"],
            ]
          : []),
      ),
    );
  };
}

async function connections(page, parts, params) {
  const number = Number(params.get("page") || 1);
  const holder = el("div");
  page.append(el("h1", {}, "Connections"), holder);
  return async () => {
    const listed = await api("GET", `/connections?page=${number}&page_size=${PAGE_SIZE}`);
    const close = (name) => async () => {
      await api("DELETE", `/connections/${enc(name)}`);
      await render();
    };
    holder.replaceChildren(
      pager(listed, (n) => (location.hash = `#/connections?page=${n}`)),
      table("connections", [
        ["name", (c) => el("a", { href: `#/connection/${enc(c.name)}` }, c.name)],
        ["user", (c) => c.user],
        ["vhost", (c) => c.vhost],
        ["state", (c) => el("span", { class: c.state === "running" ? "ok" : "held" }, c.state)],
        ["sessions", (c) => c.channels],
        ["client", (c) => c.container_id],
        ["", (c) => el("button", { onclick: close(c.name) }, "Close")],
      ], listed.items),
    );
  };
}

async function connection(page, parts, params) {
  const name = parts[1];
  const number = Number(params.get("page") || 1);
  const state = el("div", { id: "reads" });
  const cards = el("div", { class: "cards" });
  const charts = el("div", { class: "cards" });
  const links = el("div");
  const closeButton = el("button", {
    onclick: async () => {
      await api("DELETE", `/connections/${enc(name)}`);
      location.hash = "#/connections";
    },
  }, "Close this connection");
  page.append(el("h1", {}, "Connection ", el("code", {}, name)), closeButton, state, cards, charts, links);
  const written = new Chart(charts, "Writer: bytes written / s", ["written"], true);
  // Each link's last count, for its rate per second between two refreshes.
  const lastCounts = new Map();
  let lastAt = null;
  const owed = new Chart(charts, "Held for the connection", ["account debt", "waiting KiB", "writer KiB"], false);
  return async () => {
    let loops;
    try {
      loops = await api("GET", `/sluicegate/connections/${enc(name)}?page=${number}`);
    } catch (error) {
      state.replaceChildren(el("p", { class: "error" }, `This connection is closed or not yours (${error.message}).`));
      return;
    }
    const { writer, account, waiting } = loops;
    const now = Date.now() / 1000;
    const elapsed = lastAt === null ? null : now - lastAt;
    lastAt = now;
    const rate = (key, count) => {
      const last = lastCounts.get(key);
      lastCounts.set(key, count);
      return last === undefined || elapsed === null ? "" : Math.max(0, Math.round((count - last) / elapsed));
    };
    if (lastCounts.size > 4 * loops.page_size) lastCounts.clear();
    written.push([writer.bytes_written]);
    owed.push([account.debt, waiting.bytes / 1024, writer.bytes_pending / 1024]);
    state.replaceChildren(
      loops.reads_paused
        ? el("div", {}, el("p", { class: "held" }, "Reads paused:"), el("ul", { id: "paused-because" }, loops.paused_because.map((r) => el("li", { class: "held" }, r))))
        : el("p", { class: "ok" }, `Reads flowing. User ${loops.user}, vhost ${loops.vhost}.`),
    );
    cards.replaceChildren(
      card("Writer", ["frames pending", writer.frames_pending], ["bytes pending", bytes(writer.bytes_pending)], ["bytes written", bytes(writer.bytes_written)], ["sessions blocked", writer.sessions_blocked], ["full", String(writer.full)]),
      card("Account", ["debt", `${account.debt} of ${account.limit}`], ["paused", String(account.paused)], ["resumes at", account.resume_at], ["pauses", account.pauses]),
      card("Waiting (outgoing_pending)", ["bytes", `${bytes(waiting.bytes)} of ${bytes(waiting.limit)}`], ["paused", String(waiting.paused)], ["deferred credit requests", waiting.deferred]),
      card("Memory budget", ["held", budgetBar(loops.budget)]),
    );
    const pages = Math.max(1, Math.ceil(Math.max(loops.consumer_count, loops.publisher_count) / loops.page_size));
    links.replaceChildren(
      el("h2", {}, `Sessions (${loops.session_count})`),
      table("sessions", [
        ["#", (s) => s.number],
        ["writer credit", (s) => s.writer_credit],
        ["client's incoming window", (s) => s.remote_incoming_window],
        ["outgoing_pending", (s) => s.outgoing_pending],
        ["pending bytes", (s) => s.pending_bytes],
        ["credit requests in flight", (s) => s.credit_requests_in_flight],
        ["links", (s) => s.links],
        ["held by", (s) => heldBy(s.held_by)],
      ], loops.sessions),
      el("h2", {}, `Consumers (${loops.consumer_count})`),
      table("consumers", [
        ["link", (c) => c.name],
        ["session", (c) => c.session],
        ["queue", (c) => c.queue],
        ["link credit", (c) => c.client_credit],
        ["queue credit", (c) => c.queue_credit],
        ["request in flight", (c) => String(c.credit_req_in_flight)],
        ["queue ready", (c) => c.queue_ready],
        ["sent", (c) => c.sent],
        ["sent / s", (c) => rate(`c${c.session}/${c.handle}`, c.sent)],
        ["unsettled", (c) => c.unsettled],
        ["held by", (c) => heldBy(c.held_by)],
      ], loops.consumers),
      el("h2", {}, `Publishers (${loops.publisher_count})`),
      table("publishers", [
        ["link", (p) => p.name],
        ["target", (p) => p.target],
        ["credit", (p) => p.credit],
        ["unconfirmed", (p) => p.unconfirmed],
        ["received", (p) => p.received],
        ["received / s", (p) => rate(`p/${p.name}`, p.received)],
        ["confirmed", (p) => p.confirmed],
        ["held by", (p) => heldBy(p.held_by)],
      ], loops.publishers),
      pager({ page: number, page_count: pages, total_count: loops.consumer_count + loops.publisher_count },
        (n) => (location.hash = `#/connection/${enc(name)}?page=${n}`)),
    );
  };
}

// RabbitMQ's "Publish message" form: POST /api/exchanges/{vhost}/{exchange}/publish. A queue's
// is the default exchange with the queue's name as routing key, as RabbitMQ's UI does.
function publishForm(vhost, fields, target) {
  const payload = el("textarea", { id: "publish-payload", rows: 2, cols: 40, placeholder: "payload" });
  const persistent = el("input", { id: "publish-persistent", type: "checkbox" });
  const result = el("span", { id: "publish-result" });
  return el("form", {
    id: "publish",
    onsubmit: async (event) => {
      event.preventDefault();
      const [exchange, routingKey] = target();
      const body = {
        properties: persistent.checked ? { delivery_mode: 2 } : {},
        routing_key: routingKey,
        payload: payload.value,
        payload_encoding: "string",
      };
      try {
        const answer = await api("POST", `/exchanges/${enc(vhost)}/${enc(exchange)}/publish`, body);
        result.textContent = answer.routed ? "Message published." : "Message published, but not routed.";
        result.className = answer.routed ? "ok" : "held";
      } catch (error) {
        result.textContent = error.message;
        result.className = "error";
      }
    },
  }, "Publish a message: ", fields, payload, el("label", {}, persistent, " persistent"), el("button", { type: "submit" }, "Publish"), " ", result);
}

// RabbitMQ's "Get messages" form: POST /api/queues/{vhost}/{queue}/get. The requeue modes look
// at the first messages and leave them in place; "ack_requeue_false" takes them.
function getForm(vhost) {
  const queue = el("input", { id: "get-queue", placeholder: "queue" });
  const count = el("input", { id: "get-count", type: "number", min: 1, max: 100, value: 1 });
  const ackmode = el("select", { id: "get-ackmode" }, [
    ["ack_requeue_true", "Nack message requeue true"],
    ["reject_requeue_true", "Reject requeue true"],
    ["ack_requeue_false", "Ack message requeue false (removes them)"],
  ].map(([value, text]) => el("option", { value }, text)));
  const results = el("div", { id: "get-results" });
  return el("form", {
    id: "get",
    onsubmit: async (event) => {
      event.preventDefault();
      const body = { count: Number(count.value), ackmode: ackmode.value, encoding: "auto", truncate: 50000 };
      try {
        const got = await api("POST", `/queues/${enc(vhost)}/${enc(queue.value)}/get`, body);
        results.replaceChildren(
          el("p", {}, got.length ? `${got.length} message(s); the server reported ${got[got.length - 1].message_count} more.` : "Queue is empty."),
          table("got", [
            ["payload", (m) => m.payload],
            ["encoding", (m) => m.payload_encoding],
            ["bytes", (m) => m.payload_bytes],
            ["redelivered", (m) => String(m.redelivered)],
            ["exchange", (m) => m.exchange || "(default)"],
            ["routing key", (m) => m.routing_key],
            ["properties", (m) => JSON.stringify(m.properties)],
          ], got),
        );
      } catch (error) {
        results.replaceChildren(el("p", { class: "error" }, error.message));
      }
    },
  }, "Get messages: ", queue, el("label", {}, "count ", count), ackmode, el("button", { type: "submit" }, "Get"), results);
}

async function vhostPicker(params, target) {
  const vhosts = await api("GET", "/vhosts");
  const chosen = params.get("vhost") || (vhosts[0] && vhosts[0].name) || "/";
  const select = el("select", {
    id: "vhost",
    onchange: () => (location.hash = `#/${target}?vhost=${enc(select.value)}`),
  }, vhosts.map((v) => el("option", { value: v.name, selected: v.name === chosen ? "" : null }, v.name)));
  return [chosen, el("label", {}, "Virtual host ", select)];
}

async function queues(page, parts, params) {
  const [vhost, picker] = await vhostPicker(params, "queues");
  const number = Number(params.get("page") || 1);
  const holder = el("div");
  const message = el("p", { class: "error", id: "queue-error" });
  const nameInput = el("input", { id: "new-queue", placeholder: "name" });
  const typeInput = el("select", { id: "new-queue-type" }, ["classic", "quorum", "stream"].map((t) => el("option", {}, t)));
  const declare = el("form", {
    onsubmit: async (event) => {
      event.preventDefault();
      await act(`/queues/${enc(vhost)}/${enc(nameInput.value)}`, "PUT", { durable: true, arguments: { "x-queue-type": typeInput.value } });
    },
  }, "Add a queue: ", nameInput, typeInput, el("button", { type: "submit" }, "Add"));
  const publishQueue = el("input", { id: "publish-queue", placeholder: "queue" });
  const publish = publishForm(vhost, [publishQueue], () => ["amq.default", publishQueue.value]);
  page.append(el("h1", {}, "Queues"), picker, declare, publish, getForm(vhost), message, holder);
  const act = async (path, method, body) => {
    try {
      await api(method, path, body);
      message.textContent = "";
    } catch (error) {
      message.textContent = error.message;
    }
    await render();
  };
  const base = `/queues/${enc(vhost)}`;
  return async () => {
    const listed = await api("GET", `${base}?page=${number}&page_size=${PAGE_SIZE}`);
    holder.replaceChildren(
      pager(listed, (n) => (location.hash = `#/queues?vhost=${enc(vhost)}&page=${n}`)),
      table("queues", [
        ["name", (q) => q.name],
        ["type", (q) => q.type],
        ["consumers", (q) => q.consumers],
        ["ready", (q) => q.messages_ready],
        ["unacknowledged", (q) => q.messages_unacknowledged],
        ["bytes", (q) => bytes(q.message_bytes)],
        ["", (q) => el("button", { onclick: () => act(`${base}/${enc(q.name)}/contents`, "DELETE") }, "Purge")],
        ["", (q) => el("button", { onclick: () => act(`${base}/${enc(q.name)}`, "DELETE") }, "Delete")],
      ], listed.items),
    );
  };
}

async function exchanges(page, parts, params) {
  const [vhost, picker] = await vhostPicker(params, "exchanges");
  const holder = el("div");
  const publishExchange = el("input", { id: "publish-exchange", placeholder: "exchange" });
  const publishKey = el("input", { id: "publish-routing-key", placeholder: "routing key" });
  const publish = publishForm(vhost, [publishExchange, publishKey], () => [publishExchange.value || "amq.default", publishKey.value]);
  page.append(el("h1", {}, "Exchanges and bindings"), picker, publish, holder);
  return async () => {
    const [listed, bindings] = await Promise.all([
      api("GET", `/exchanges/${enc(vhost)}?page=1&page_size=${PAGE_SIZE}`),
      api("GET", `/bindings/${enc(vhost)}?page=1&page_size=${PAGE_SIZE}`),
    ]);
    holder.replaceChildren(
      table("exchanges", [["name", (e) => e.name || "(default)"], ["type", (e) => e.type], ["durable", (e) => String(e.durable)]], listed.items),
      el("h2", {}, `Bindings (${bindings.total_count})`),
      table("bindings", [["source", (b) => b.source || "(default)"], ["destination", (b) => b.destination], ["kind", (b) => b.destination_type], ["routing key", (b) => b.routing_key]], bindings.items),
    );
  };
}

async function vhosts(page) {
  const holder = el("div");
  page.append(el("h1", {}, "Virtual hosts"), holder);
  return async () => {
    const listed = await api("GET", "/vhosts");
    holder.replaceChildren(table("vhosts", [["name", (v) => v.name], ["ready", (v) => v.messages_ready], ["unacknowledged", (v) => v.messages_unacknowledged]], listed));
  };
}

async function users(page) {
  const holder = el("div");
  page.append(el("h1", {}, "Users and permissions"), holder);
  return async () => {
    const [listed, permissions] = await Promise.all([api("GET", "/users"), api("GET", "/permissions")]);
    holder.replaceChildren(
      table("users", [["name", (u) => u.name], ["tags", (u) => u.tags.join(", ")]], listed),
      table("permissions", [["user", (p) => p.user], ["vhost", (p) => p.vhost], ["configure", (p) => p.configure], ["write", (p) => p.write], ["read", (p) => p.read]], permissions),
    );
  };
}

async function budget(page) {
  const holder = el("div");
  const charts = el("div", { class: "cards" });
  page.append(el("h1", {}, "Memory budget: who holds it"), charts, holder);
  const held = new Chart(charts, "Held (MiB)", ["used", "resume at", "limit"], false);
  return async () => {
    const data = await api("GET", "/sluicegate/budget");
    held.push([data.used / MIB, data.resume_at / MIB, data.limit / MIB]);
    const link = (c) => el("a", { href: `#/connection/${enc(c.connection)}` }, c.connection);
    holder.replaceChildren(
      budgetBar(data),
      el("p", {}, `Blocked ${data.blocks} times; deliveries still arriving: ${bytes(data.unfinished)}; ceiling ${bytes(data.ceiling)}.`),
      el("h2", {}, "Heaviest queues"),
      table("budget-queues", [["vhost", (q) => q.vhost], ["queue", (q) => q.name], ["bytes", (q) => bytes(q.bytes)]], data.queues),
      el("h2", {}, "Heaviest connections (bytes held for their consumers, deliveries arriving)"),
      table("budget-connections", [["connection", link], ["user", (c) => c.user], ["bytes", (c) => bytes(c.bytes)]], data.connections),
      el("h2", {}, `Publishers held (${data.held_publisher_count})`),
      table("held-publishers", [["connection", link], ["link", (p) => p.link]], data.held_publishers),
      el("h2", {}, `Connections not read for it (${data.paused_count})`),
      table("budget-paused", [["connection", link], ["user", (c) => c.user], ["vhost", (c) => c.vhost]], data.paused),
    );
  };
}

const PAGES = { overview, connections, connection, queues, exchanges, vhosts, users, budget };

// -- navigation -----------------------------------------------------------------------------

let render = async () => {};

async function route() {
  clearInterval(timer);
  generation += 1;
  const mine = generation;
  const [path, query] = location.hash.slice(1).split("?");
  const parts = path.split("/").slice(1).map(decodeURIComponent);
  const pageFor = PAGES[parts[0]] || overview;
  for (const a of document.querySelectorAll("nav a")) a.classList.toggle("here", a.getAttribute("href") === `#/${parts[0]}`);
  const page = el("div", { id: "page" });
  $("page").replaceWith(page);
  try {
    const refresh = await pageFor(page, parts, new URLSearchParams(query || ""));
    if (mine !== generation) return;
    render = async () => {
      try {
        await refresh();
      } catch (error) {
        if (!(error instanceof ApiError) || error.message !== "Login failed") page.prepend(el("p", { class: "error" }, error.message));
      }
    };
    await render();
    if (mine === generation) timer = setInterval(render, REFRESH * 1000);
  } catch (error) {
    page.append(el("p", { class: "error" }, error.message));
  }
}

function showLogin(reason) {
  clearInterval(timer);
  $("nav").hidden = true;
  $("logout").hidden = true;
  $("page").replaceChildren();
  $("who").textContent = "";
  $("login").hidden = false;
  $("login-error").textContent = reason || "";
}

async function enter() {
  let me;
  try {
    me = await api("GET", "/whoami");
  } catch {
    return;
  }
  $("login").hidden = true;
  $("nav").hidden = false;
  $("logout").hidden = false;
  $("who").textContent = `${me.name} (${me.tags.join(", ")})`;
  await route();
}

$("login").addEventListener("submit", async (event) => {
  event.preventDefault();
  sessionStorage.setItem(KEY, btoa(`${$("username").value}:${$("password").value}`));
  await enter();
});
$("logout").addEventListener("click", () => {
  sessionStorage.removeItem(KEY);
  showLogin("");
});
window.addEventListener("hashchange", () => {
  if (!$("nav").hidden) route();
});
enter();

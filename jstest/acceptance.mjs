// Acceptance suite of the Holdfast live feed, driven by the official phoenix
// JavaScript client (npm phoenix, with npm ws as its transport on Node 20).
//
// Run by the Go test gateway/TestPhoenixJSAcceptance against a real server on
// 127.0.0.1, or by hand:
//   HOLDFAST_URL=http://127.0.0.1:7070 HOLDFAST_APP_ID=... HOLDFAST_APP_KEY=... \
//   HOLDFAST_APP_SECRET=... node acceptance.mjs
// The server must give the type "short" a change log of 3 entries (log_truncated).
// Prints "N passed, N failed" and exits non-zero if anything failed.

import { Socket } from "phoenix";
import WebSocket from "ws";

const BASE = process.env.HOLDFAST_URL;
const APP_ID = process.env.HOLDFAST_APP_ID;
const APP_KEY = process.env.HOLDFAST_APP_KEY;
const SECRET = process.env.HOLDFAST_APP_SECRET;
if (!BASE || !APP_ID || !APP_KEY || !SECRET) {
  console.error("set HOLDFAST_URL, HOLDFAST_APP_ID, HOLDFAST_APP_KEY and HOLDFAST_APP_SECRET");
  process.exit(2);
}
const WS = BASE.replace(/^http/, "ws") + "/socket";
const run = Date.now().toString(36); // object keys unique to this run

function assert(cond, msg) {
  if (!cond) throw new Error(msg);
}
function eq(got, want, msg) {
  const g = JSON.stringify(got), w = JSON.stringify(want);
  if (g !== w) throw new Error(`${msg}: got ${g}, want ${w}`);
}
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

async function api(method, path, body) {
  const res = await fetch(BASE + path, {
    method,
    headers: { "X-App-Key": APP_KEY, "X-App-Secret": SECRET, "Content-Type": "application/json" },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const text = await res.text();
  return { status: res.status, body: text ? JSON.parse(text) : null };
}
const obj = (type, key) => `/api/v1/objects/${APP_ID}/${type}/${key}`;
async function put(type, key, slot, value) {
  const r = await api("PUT", `${obj(type, key)}/${slot}`, { value });
  assert(r.status === 200, `PUT ${slot}: ${r.status} ${JSON.stringify(r.body)}`);
  return r.body.log_id;
}
async function mint(capabilities, extra = {}) {
  const r = await api("POST", `/api/v1/tokens/${APP_ID}`, { capabilities, ...extra });
  assert(r.status === 200, `mint: ${r.status} ${JSON.stringify(r.body)}`);
  return r.body.token;
}
const topic = (type, key) => `durable:${APP_KEY}:${type}:${key}`;

const sockets = [];
function connect(opts = {}) {
  const socket = new Socket(WS, {
    transport: WebSocket,
    params: { app_key: APP_KEY },
    reconnectAfterMs: () => 50,
    rejoinAfterMs: () => 50,
    ...opts,
  });
  socket.connect();
  sockets.push(socket);
  return socket;
}

// Collects a channel's events in arrival order.
function record(channel, names = ["change", "batch", "snapshot", "log_truncated"]) {
  const events = [];
  for (const n of names) channel.on(n, (payload) => events.push({ event: n, payload }));
  return events;
}

async function until(cond, what, ms = 5000) {
  const end = Date.now() + ms;
  while (!cond()) {
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
    await sleep(5);
  }
}

function join(channel, ms = 5000) {
  return new Promise((resolve, reject) => {
    channel
      .join(ms)
      .receive("ok", resolve)
      .receive("error", (r) => reject(new Error(`join refused: ${JSON.stringify(r)}`)))
      .receive("timeout", () => reject(new Error("join timed out")));
  });
}

// joinError joins and returns the refusal reason; phoenix.js would retry a
// refused join forever, so the channel is left at once.
function joinError(socket, t, params) {
  const ch = socket.channel(t, params);
  return new Promise((resolve, reject) => {
    ch.join()
      .receive("ok", () => {
        ch.leave();
        reject(new Error(`join of ${t} succeeded`));
      })
      .receive("error", (r) => {
        ch.leave();
        resolve(r.reason);
      })
      .receive("timeout", () => reject(new Error("join timed out")));
  });
}

function socketID(socket) {
  const ch = socket.channel("socket", {});
  return join(ch).then((r) => r.socket_id);
}

const cases = [];
const test = (name, fn) => cases.push({ name, fn });

test("join with app_secret gets socket_id then the snapshot", async () => {
  const key = `secret-${run}`;
  await put("order", key, "status", "new");
  const s = connect();
  const ch = s.channel(topic("order", key), { app_secret: SECRET });
  const events = record(ch);
  const reply = await join(ch);
  assert(typeof reply.socket_id === "string" && reply.socket_id.length > 0, "join reply has no socket_id");
  await until(() => events.length === 1, "the snapshot");
  eq(events[0], { event: "snapshot", payload: { state: { status: "new" }, log_id: 1 } }, "snapshot");
});

test("join with tokens: unbound, socket-bound, wildcard", async () => {
  const key = `token-${run}`;
  await put("order", key, "a", 1);
  const s = connect();
  const sid = await socketID(s);
  const unbound = await mint([`object:read:order/${key}`]);
  const bound = await mint([`object:read:order/${key}`], { socket_id: sid });
  const wild = await mint(["object:read:order/*"]);
  for (const [name, tok] of [["unbound", unbound], ["bound", bound], ["wildcard", wild]]) {
    const ch = s.channel(topic("order", key), { auth: tok });
    const events = record(ch);
    await join(ch).catch((e) => {
      throw new Error(`${name}: ${e.message}`);
    });
    await until(() => events.length === 1, `${name} snapshot`);
    await new Promise((r) => ch.leave().receive("ok", r));
  }
  // The bound token on another socket is refused.
  const other = connect();
  eq(await joinError(other, topic("order", key), { auth: bound }), "invalid token", "bound token on another socket");
});

test("every join error reason", async () => {
  const s = connect();
  const key = `errors-${run}`;
  const t = topic("order", key);
  eq(await joinError(s, t, {}), "auth required for durable object channels", "no credentials");
  eq(await joinError(s, t, { app_secret: SECRET, auth: "x" }), "exactly one of auth or app_secret is required", "both");
  eq(await joinError(s, t, { app_secret: "sk_wrong" }), "invalid app_secret", "wrong secret");
  eq(await joinError(s, t, { auth: "garbage" }), "invalid token", "malformed token");
  const other = await mint([`object:read:order/other-${run}`]);
  eq(await joinError(s, t, { auth: other }), `forbidden: missing object:read:order/${key}`, "missing capability");
  eq(await joinError(s, `durable:pk_someone_else:order:${key}`, { app_secret: SECRET }), "invalid topic format", "foreign app key");
  eq(await joinError(s, `durable:${APP_KEY}::${key}`, { app_secret: SECRET }), "invalid topic format", "empty type");
  const expired = await mint([`object:read:order/${key}`], { ttl_seconds: 1 });
  await sleep(2100);
  eq(await joinError(s, t, { auth: expired }), "invalid token", "expired token");
});

test("after_log_id replay is exact, then the snapshot", async () => {
  const key = `replay-${run}`;
  for (let i = 1; i <= 5; i++) await put("order", key, "n", i);
  const r = await api("PATCH", obj("order", key), { a: "x", b: "y" });
  eq(r.body, { log_id: 6 }, "patch");
  const s = connect();
  const ch = s.channel(topic("order", key), { app_secret: SECRET, after_log_id: 3 });
  const events = record(ch);
  await join(ch);
  await until(() => events.length === 5, "replay and snapshot");
  eq(events, [
    { event: "change", payload: { key: "n", value: 4, log_id: 4 } },
    { event: "change", payload: { key: "n", value: 5, log_id: 5 } },
    { event: "change", payload: { key: "a", value: "x", log_id: 6 } },
    { event: "change", payload: { key: "b", value: "y", log_id: 6 } },
    { event: "snapshot", payload: { state: { a: "x", b: "y", n: 5 }, log_id: 6 } },
  ], "replay");
});

test("live change and batch events", async () => {
  const key = `live-${run}`;
  await put("order", key, "status", "new");
  const s = connect();
  const ch = s.channel(topic("order", key), { app_secret: SECRET });
  const events = record(ch);
  await join(ch);
  await until(() => events.length === 1, "snapshot");
  await put("order", key, "status", "shipped");
  await api("POST", `${obj("order", key)}/transaction`, [
    { op: "set", key: "status", value: "delivered" },
    { op: "increment", key: "retry_count", by: 2 },
  ]);
  await api("DELETE", `${obj("order", key)}/retry_count`);
  await until(() => events.length === 4, "live events");
  eq(events.slice(1), [
    { event: "change", payload: { key: "status", value: "shipped", previous: "new", log_id: 2 } },
    { event: "batch", payload: { changes: [
      { key: "status", value: "delivered", previous: "shipped" },
      { key: "retry_count", value: 2, previous: null },
    ], log_id: 3 } },
    { event: "change", payload: { key: "retry_count", value: null, previous: 2, log_id: 4 } },
  ], "live events");
});

test("a push is rejected and the channel stays joined", async () => {
  const key = `push-${run}`;
  const s = connect();
  const ch = s.channel(topic("order", key), { app_secret: SECRET });
  const events = record(ch);
  await join(ch);
  const reason = await new Promise((resolve, reject) => {
    ch.push("set", { key: "a", value: 1 })
      .receive("ok", () => reject(new Error("push accepted")))
      .receive("error", (r) => resolve(r.reason))
      .receive("timeout", () => reject(new Error("push timed out")));
  });
  eq(reason, "read-only channel", "push reply");
  assert(ch.state === "joined", `channel state ${ch.state} after the push`);
  await put("order", key, "a", 1);
  await until(() => events.length === 2, "a live change after the rejected push");
  eq(events[1].payload.log_id, 1, "log_id: the push wrote nothing");
});

test("heartbeat is answered", async () => {
  const s = connect({ heartbeatIntervalMs: 300 });
  await until(() => s.isConnected(), "connect");
  let closed = 0;
  s.onClose(() => closed++);
  const rtt = await new Promise((resolve) => s.ping(resolve));
  assert(rtt >= 0, "ping");
  await sleep(1000); // several heartbeats: a missing reply would close the socket
  eq(closed, 0, "socket closes during heartbeats");
  assert(s.isConnected(), "socket closed despite heartbeats");
});

test("leave gets ok and stops events", async () => {
  const key = `leave-${run}`;
  const s = connect();
  const ch = s.channel(topic("order", key), { app_secret: SECRET });
  const events = record(ch);
  await join(ch);
  await until(() => events.length === 1, "the snapshot");
  await new Promise((resolve, reject) =>
    ch.leave().receive("ok", resolve).receive("timeout", () => reject(new Error("leave timed out"))));
  assert(ch.state === "closed", `state ${ch.state} after leave`);
  await put("order", key, "a", 1);
  await sleep(200);
  eq(events.length, 1, "events after leave");
});

test("a dropped socket reconnects with fresh params and misses nothing", async () => {
  const key = `drop-${run}`;
  await put("order", key, "n", 0);
  let token = await mint([`object:read:order/${key}`], { ttl_seconds: 60 });
  let lastSeen = null;
  const seen = [];
  let joins = 0;
  const s = connect();
  const ch = s.channel(topic("order", key), () => {
    joins++;
    const p = { auth: token };
    if (lastSeen !== null) p.after_log_id = lastSeen;
    return p;
  });
  // Every change and batch must come once, in log_id order; a rejoin's snapshot
  // must sit exactly where its replay ended.
  const dup = [], gaps = [];
  const track = (p) => {
    if (p.log_id <= lastSeen) dup.push(p.log_id);
    else {
      if (p.log_id !== lastSeen + 1) gaps.push(p.log_id);
      seen.push(p.log_id);
      lastSeen = p.log_id;
    }
  };
  ch.on("change", track);
  ch.on("batch", track);
  ch.on("snapshot", (p) => {
    if (lastSeen === null) lastSeen = p.log_id;
    else if (p.log_id !== lastSeen) gaps.push(`snapshot at ${p.log_id} after ${lastSeen}`);
  });
  await join(ch);
  await until(() => lastSeen === 1, "the snapshot");
  for (let i = 1; i <= 3; i++) await put("order", key, "n", i);
  await until(() => lastSeen === 4, "live changes");
  token = await mint([`object:read:order/${key}`], { ttl_seconds: 60 }); // a fresh token for the rejoin
  s.connection.transport.close(4000, "test drop"); // not a clean disconnect: phoenix.js reconnects
  await until(() => !s.isConnected(), "the drop");
  for (let i = 4; i <= 8; i++) await put("order", key, "n", i);
  await until(() => lastSeen === 9, "the missed changes after the reconnect", 10000);
  for (let i = 9; i <= 10; i++) await put("order", key, "n", i);
  await until(() => lastSeen === 11, "live changes after the reconnect");
  eq(seen, [2, 3, 4, 5, 6, 7, 8, 9, 10, 11], "log_ids seen");
  eq(dup, [], "duplicates");
  eq(gaps, [], "gaps");
  assert(joins >= 2, `params called ${joins} times`);
});

test("log_truncated when after_log_id is older than the change log", async () => {
  const key = `trunc-${run}`;
  for (let i = 1; i <= 6; i++) await put("short", key, "n", i);
  const s = connect();
  const ch = s.channel(topic("short", key), { app_secret: SECRET, after_log_id: 1 });
  const events = record(ch);
  await join(ch);
  await until(() => events.length === 2, "log_truncated and snapshot");
  eq(events, [
    { event: "log_truncated", payload: { after_log_id: 1, oldest_log_id: 4 } },
    { event: "snapshot", payload: { state: { n: 6 }, log_id: 6 } },
  ], "truncated join");
});

test("run:* events are relayed, not stored", async () => {
  const key = `run-${run}`;
  const s = connect();
  const ch = s.channel(topic("thread", key), { app_secret: SECRET });
  const runs = record(ch, ["run:start", "run:end"]);
  await join(ch);
  const r = await api("POST", `${obj("thread", key)}/events`, { event: "run:start", payload: { run_id: "r1" } });
  eq(r.status, 202, "publish status");
  await api("POST", `${obj("thread", key)}/events`, { event: "run:end", payload: { run_id: "r1" } });
  await until(() => runs.length === 2, "relayed events");
  eq(runs, [
    { event: "run:start", payload: { run_id: "r1" } },
    { event: "run:end", payload: { run_id: "r1" } },
  ], "run events");
  const st = await api("GET", obj("thread", key));
  eq(st.body.log_id, 0, "log_id after run events");
  const bad = await api("POST", `${obj("thread", key)}/events`, { event: "start" });
  eq(bad.status, 422, "event name without run:");
});

let passed = 0, failed = 0;
for (const c of cases) {
  try {
    await c.fn();
    passed++;
    console.log(`ok   ${c.name}`);
  } catch (e) {
    failed++;
    console.log(`FAIL ${c.name}: ${e.message}`);
  }
}
for (const s of sockets) s.disconnect();
console.log(`${passed} passed, ${failed} failed`);
process.exit(failed === 0 ? 0 : 1);

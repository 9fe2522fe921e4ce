// tests/runtime/server/client_test.mjs URL: Node's fetch against a running `tierkv serve`:
// chat (whole and streamed: the same text), /completion with return_progress,
// /v1/models. Exits 1 naming the first failure.
const url = process.argv[2];
const fail = (m) => { console.error("node client: " + m); process.exit(1); };
const post = async (path, body) => {
  const r = await fetch(url + path, { method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body) });
  return r;
};
const chat = { messages: [{ role: "user", content: "Write a haiku about tiers of memory." }], max_tokens: 10, temperature: 0, cache_prompt: false };

const whole = await (await post("/v1/chat/completions", chat)).json();
const want = whole.choices[0].message.content;
if (whole.usage.completion_tokens !== 10) fail("completion_tokens " + whole.usage.completion_tokens);

const r = await post("/v1/chat/completions", { ...chat, stream: true });
if (!r.headers.get("content-type").startsWith("text/event-stream")) fail("content-type " + r.headers.get("content-type"));
const reader = r.body.getReader();
const decoder = new TextDecoder();
let buf = "", text = "", done = false;
for (;;) {
  const { value, done: end } = await reader.read();
  if (end) break;
  buf += decoder.decode(value, { stream: true });
  let at;
  while ((at = buf.indexOf("\n\n")) >= 0) {
    const frame = buf.slice(0, at);
    buf = buf.slice(at + 2);
    if (!frame.startsWith("data: ")) continue;
    const payload = frame.slice(6);
    if (payload === "[DONE]") { done = true; continue; }
    const chunk = JSON.parse(payload);
    const d = chunk.choices[0]?.delta?.content;
    if (typeof d === "string") text += d;
  }
}
if (!done) fail("no [DONE]");
if (text !== want) fail("streamed " + JSON.stringify(text) + " but whole " + JSON.stringify(want));

const prog = await post("/completion", { prompt: "The lighthouse keeper climbed the stairs", n_predict: 4, temperature: 0, stream: true, return_progress: true });
const body = await prog.text();
if (!body.includes("prompt_progress")) fail("no prompt_progress event");
if (!body.includes('"stop":true')) fail("no final /completion event");

const models = await (await fetch(url + "/v1/models")).json();
if (models.object !== "list" || models.data.length !== 1) fail("/v1/models " + JSON.stringify(models));
console.log("node client: ok");

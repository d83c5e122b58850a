// Live updates from GET /v1/events. EventSource cannot send an Authorization header, so the stream is read with
// fetch() and parsed here (the text/event-stream format: `event:`, `id:`, `data:` lines, blank line ends one).
// The gateway closes a stream after max_seconds or when a reader falls behind: both just reconnect, with back-off.

export class LiveEvents {
  constructor(api, { onEvent, onState }) {
    this.api = api;
    this.onEvent = onEvent;
    this.onState = onState;
    this.controller = null;
    this.stopped = true;
    this.failures = 0;
    this.received = 0;
  }

  start() {
    if (!this.stopped) return;
    this.stopped = false;
    this.loop();
  }

  stop() {
    this.stopped = true;
    this.controller?.abort();
    this.onState("off");
  }

  async loop() {
    while (!this.stopped) {
      this.controller = new AbortController();
      try {
        this.onState("connecting");
        const response = await fetch(new URL(`${this.api.base}/v1/events?max_seconds=900`, location.origin), {
          headers: this.api.headers({ Accept: "text/event-stream" }), signal: this.controller.signal,
        });
        if (response.status === 404) { this.onState("unavailable"); return; }
        if (response.status === 401 || response.status === 403) { this.onState("denied"); return; }
        if (!response.ok || !response.body) throw new Error(`HTTP ${response.status}`);
        this.onState("live");
        this.failures = 0;
        await this.read(response.body);
      } catch (err) {
        if (this.stopped || err.name === "AbortError") return;
        this.failures += 1;
      }
      if (this.stopped) return;
      this.onState("reconnecting");
      await new Promise((r) => setTimeout(r, Math.min(15000, 500 * 2 ** Math.min(this.failures, 5))));
    }
  }

  async read(body) {
    const reader = body.pipeThrough(new TextDecoderStream()).getReader();
    let buffer = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return;
      buffer += value;
      let end;
      while ((end = buffer.search(/\r?\n\r?\n/)) >= 0) {
        const block = buffer.slice(0, end);
        buffer = buffer.slice(end + (buffer[end] === "\r" ? 4 : 2));
        this.dispatch(block);
      }
    }
  }

  dispatch(block) {
    let type = "message";
    const data = [];
    for (const line of block.split(/\r?\n/)) {
      if (!line || line.startsWith(":")) continue;
      const colon = line.indexOf(":");
      const field = colon < 0 ? line : line.slice(0, colon);
      const value = colon < 0 ? "" : line.slice(colon + 1).replace(/^ /, "");
      if (field === "event") type = value;
      else if (field === "data") data.push(value);
    }
    if (!data.length) return;
    if (type === "overflow") throw new Error("overflow"); // reconnect: the stream is closing anyway
    try {
      const doc = JSON.parse(data.join("\n"));
      this.received += 1;
      this.onEvent(doc);
    } catch { /* not JSON: ignore */ }
  }
}

/** Which page data an event makes stale. */
export function topicsOf(type) {
  const entity = String(type).split(".")[2] || "";
  return {
    node: ["pool"], gpu: ["pool"], allocation: ["pool", "jobs", "teams"], job: ["jobs", "teams"],
    quota: ["teams", "jobs"], reclaim: ["pool", "jobs"], usage: ["reports"],
  }[entity] || [];
}

// The DLQ console's page. Everything it shows comes from the console's
// JSON API and is put into the page as text (textContent, text nodes,
// attribute values), never as markup: message bodies and headers are
// whatever a publisher sent.
"use strict";

(function () {
  const state = { overview: null, allowActions: false, jobs: [], seenDone: new Set(), route: "" };

  // el builds an element; string children become text nodes.
  function el(tag, attrs, ...children) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === undefined || v === null || v === false) continue;
      if (k === "onclick") e.addEventListener("click", v);
      else e.setAttribute(k, v === true ? "" : String(v));
    }
    for (const c of children.flat()) {
      if (c === undefined || c === null) continue;
      e.append(typeof c === "string" || typeof c === "number" ? document.createTextNode(String(c)) : c);
    }
    return e;
  }

  function clear(node) { while (node.firstChild) node.removeChild(node.firstChild); }

  function showError(msg) {
    const box = document.getElementById("error");
    box.textContent = msg || "";
    box.hidden = !msg;
  }

  function token() { return document.getElementById("token").value.trim(); }

  async function api(path, opts) {
    const o = opts || {};
    // Hopper-Console: 1 on every call: the console answers no API call
    // without it, so another site's page cannot make the browser call it.
    const headers = { "Accept": "application/json", "Hopper-Console": "1" };
    if (o.body !== undefined) headers["Content-Type"] = "application/json";
    // The token goes with every call once typed: actions need it, and so
    // do the scan and the message view of a quorum DLQ, which reading
    // rotates.
    if (token() || o.method === "POST") headers["X-Hopper-Token"] = token();
    const res = await fetch(path, { method: o.method || "GET", headers, body: o.body === undefined ? undefined : JSON.stringify(o.body), credentials: "same-origin" });
    if (o.raw && res.ok) return res;
    let data = null;
    try { data = await res.json(); } catch (e) { data = null; }
    // 401: the call needs the token; the box to type it in is shown.
    if (res.status === 401) document.getElementById("token-box").hidden = false;
    if (!res.ok) throw new Error((data && data.error) || (res.status + " " + res.statusText));
    return data;
  }

  function when(t) {
    if (!t) return "—";
    const d = new Date(t);
    return d.toISOString().replace("T", " ").replace(/\.\d+Z$/, "Z");
  }

  function plural(n, word) { return n + " " + word + (n === 1 ? "" : "s"); }

  function dlqPath(name) { return "/api/dlqs/" + encodeURIComponent(name); }

  // ---- overview ----
  function renderOverview(view) {
    const ov = state.overview;
    clear(view);
    view.append(el("h1", {}, "Dead-letter queues"));
    const rows = ov.dlqs.map((d) => {
      const scan = d.scan;
      let scanCell = d.scanned ? (plural(d.scanned, "message") + " in " + plural(d.groups, "group") + ", at " + when(d.scannedAt)) : "not scanned";
      const scanning = scan && scan.state === "running";
      return el("tr", { "data-dlq": d.name },
        el("td", {}, el("a", { class: "dlq-link", href: "#/dlq/" + encodeURIComponent(d.name) }, d.name),
          el("div", { class: "muted" }, d.queues.length ? "from " + d.queues.join(", ") : ""),
          d.readRotates ? el("div", { class: "muted rotates" }, rotatesNote()) : null),
        el("td", { class: "num depth" }, d.depthError ? "?" : String(d.depth)),
        el("td", { class: "num attention" }, d.scanned ? String(d.attention) + (d.ignored ? " (" + d.ignored + " ignored)" : "") : "—",
          d.marksError ? el("div", { class: "marks-error muted" }, "ignored marks not read: " + d.marksError) : null),
        el("td", { class: "num rate" }, d.hasRate ? d.perMinute.toFixed(1) : "…"),
        el("td", { class: "oldest" }, when(d.oldest)),
        el("td", { class: "newest" }, when(d.newest)),
        el("td", {}, chart(d.chart, d.name)),
        el("td", { class: "scan" },
          scanning ? el("span", {}, el("progress", { max: 100, value: scan.percent.toFixed(1) }), " scanning " + scan.taken + "/" + scan.total + (scan.eta ? ", ETA " + scan.eta : "")) : scanCell,
          scan && scan.state === "failed" ? el("div", { class: "muted" }, "last scan failed: " + scan.error) : null,
          " ", el("button", { class: "rescan", onclick: () => rescan(d.name), disabled: !!d.busy }, "Rescan")),
        el("td", { class: "depth-error muted" }, d.depthError || ""));
    });
    view.append(el("table", { id: "dlqs" },
      el("thead", {}, el("tr", {}, el("th", {}, "DLQ"), el("th", { class: "num" }, "Depth"), el("th", { class: "num", title: "messages of the last scan outside the groups marked ignored" }, "Needs attention"), el("th", { class: "num" }, "Arriving /min"),
        el("th", {}, "Oldest"), el("th", {}, "Newest"), el("th", {}, "Depth over time"), el("th", {}, "Scan"), el("th", {}, ""))),
      el("tbody", {}, rows)));
  }

  // chart draws the depth chart inline, from the figures the console
  // computed: SVG elements made one by one, attributes set as values.
  function chart(c, name) {
    const ns = "http://www.w3.org/2000/svg";
    const svg = document.createElementNS(ns, "svg");
    for (const [k, v] of [["class", "chart"], ["width", c.width], ["height", c.height], ["viewBox", "0 0 " + c.width + " " + c.height], ["role", "img"]]) svg.setAttribute(k, String(v));
    const title = document.createElementNS(ns, "title");
    title.textContent = "depth of " + name + " over the console's lifetime";
    const bg = document.createElementNS(ns, "rect");
    bg.setAttribute("width", String(c.width));
    bg.setAttribute("height", String(c.height));
    bg.setAttribute("class", "chart-bg");
    svg.append(title, bg);
    if (c.points) {
      const line = document.createElementNS(ns, "polyline");
      line.setAttribute("points", c.points);
      line.setAttribute("class", "chart-line");
      const top = document.createElementNS(ns, "text");
      top.setAttribute("x", "4");
      top.setAttribute("y", "12");
      top.setAttribute("class", "chart-max");
      top.textContent = "max " + c.max;
      svg.append(line, top);
    }
    return svg;
  }

  // rotatesNote says why a quorum DLQ is read only as an action.
  function rotatesNote() {
    return "quorum DLQ: reading it rotates every message, so a scan or a message view is an action" +
      (state.allowActions ? " (token needed)" : ", and this console is read-only");
  }

  async function rescan(name) {
    try { await api(dlqPath(name) + "/scan", { method: "POST" }); showError(""); refresh(); } catch (e) { showError(e.message); }
  }

  // ---- groups ----
  async function renderGroups(view, name) {
    const page = await api(dlqPath(name) + "/groups");
    clear(view);
    view.append(el("h1", {}, "Failure groups of ", el("code", {}, name)));
    const scanning = page.scan && page.scan.state === "running";
    view.append(el("p", { class: "muted", id: "scan-state" },
      page.scannedAt ? page.scanned + " messages scanned at " + when(page.scannedAt) + ". " : "Not scanned yet. ",
      scanning ? "Scanning: " + page.scan.taken + "/" + page.scan.total + ". " : "",
      page.scan && page.scan.state === "failed" ? "Last scan failed: " + page.scan.error + " " : "",
      el("button", { class: "rescan", onclick: async () => { await rescan(name); } }, "Rescan")));
    if (page.readRotates) view.append(el("p", { class: "muted rotates" }, rotatesNote() + "."));
    if (page.marksError) view.append(el("p", { class: "muted marks-error" }, "The ignored marks kept on the broker could not be read, so these are the ones read before: " + page.marksError));
    const rows = page.groups.map((g) => {
      const k = g.key;
      const actions = el("td", { class: "actions" });
      if (state.allowActions) {
        const rate = el("input", { class: "rate", type: "number", min: 0, step: "any", value: String(state.overview ? state.overview.rate : 0), title: "replay rate, messages per second (0: no cap)" });
        const confirmBox = el("input", { class: "purge-confirm", type: "text", placeholder: "type " + g.count, hidden: true, autocomplete: "off" });
        const purgeGo = el("button", { class: "purge-go", hidden: true, onclick: () => purgeGroup(name, g, confirmBox.value) }, "Purge for good");
        const to = redirectInputs();
        const batch = el("input", { class: "batch", type: "number", min: 0, step: 1, placeholder: "batch", title: "replay this many at a time (blank: all at once)" });
        const pause = el("input", { class: "pause", type: "text", size: 6, placeholder: "pause", title: "between batches: a pause such as 30s, or blank to wait for Next" });
        const batched = () => {
          const v = {};
          if (batch.value && Number(batch.value) > 0) { v.batch = Number(batch.value); if (pause.value.trim()) v.pause = pause.value.trim(); }
          return v;
        };
        actions.append(
          el("button", { class: "replay", onclick: () => replay(name, Object.assign({ group: g.id }, to.value(), batched()), rate.value) }, "Replay"), " ", rate, " msg/s ", batch, " ", pause, " ", to.box, " ",
          el("button", { class: "transform", onclick: () => openTransform(name, g) }, "Transform…"), " ",
          el("button", { class: "ignore", onclick: () => ignoreGroup(name, g, !g.ignored) }, g.ignored ? "Unignore" : "Ignore"), " ",
          el("button", { class: "export", onclick: () => exportGroup(name, g) }, "Export"), " ",
          el("button", { class: "purge", onclick: () => { confirmBox.hidden = false; purgeGo.hidden = false; confirmBox.focus(); } }, "Purge…"), " ",
          confirmBox, " ", purgeGo);
      }
      return el("tr", { class: "group", "data-group": g.id },
        el("td", { class: "num count" }, String(g.count)),
        el("td", { class: "num share-cell" }, shareBar(g.share), " ", (g.share * 100).toFixed(1) + "%"),
        el("td", { class: "reason" }, k.reason || "(unknown)",
          k.replayRun ? el("div", { class: "again muted" }, "failed again after replay run " + k.replayRun) : null,
          g.ignored ? el("div", { class: "ignored-mark muted", title: "marked ignored" + (g.ignoredBy ? " by " + g.ignoredBy : "") + (g.ignoredAt ? " at " + when(g.ignoredAt) : "") }, "ignored") : null),
        el("td", { class: "status" }, k.status),
        el("td", { class: "rk mono" }, k.routingKey || "—"),
        el("td", { class: "fp mono" }, k.fingerprint || "(no error)"),
        el("td", { class: "first" }, when(g.first)),
        el("td", { class: "last" }, when(g.last)),
        el("td", {}, el("a", { class: "sample", href: "#/dlq/" + encodeURIComponent(name) + "/msg/" + encodeURIComponent(g.sample) }, g.sample || "(no id)"),
          el("div", { class: "muted" }, g.queues.join(", ")), messageList(name, g)),
        actions);
    });
    view.append(el("table", { id: "groups" },
      el("thead", {}, el("tr", {}, el("th", { class: "num" }, "Count"), el("th", { class: "num" }, "Share"), el("th", {}, "Reason"), el("th", {}, "Status"),
        el("th", {}, "Routing key"), el("th", {}, "Error fingerprint"), el("th", {}, "First"), el("th", {}, "Last"), el("th", {}, "Sample"), el("th", {}, state.allowActions ? "Actions" : ""))),
      el("tbody", {}, rows)));
    if (!page.groups.length) view.append(el("p", { id: "no-groups" }, "No failure groups: the DLQ was empty when scanned, or no scan has finished."));
    view.append(el("div", { id: "transform-box" }));
    if (state.transform && state.transform.dlq === name) openTransform(name, page.groups.find((g) => g.id === state.transform.group));
  }

  // openTransform shows the transformation of a group: a JSON Patch over
  // {"body": …, "headers": {…}}, its preview on the group's first
  // messages, a dry run, and the run. What is typed survives the groups
  // being drawn again.
  function openTransform(name, g) {
    const box = document.getElementById("transform-box");
    if (!box) return;
    clear(box);
    // A group missing from one drawing (a scan under way) keeps what was
    // typed for the next; only Close forgets it.
    if (!g) return;
    const prev = state.transform && state.transform.group === g.id ? state.transform : null;
    state.transform = { dlq: name, group: g.id, patch: prev ? prev.patch : '[\n  {"op": "replace", "path": "/body/field", "value": "fixed"}\n]', keep: prev ? prev.keep : true };
    const patch = el("textarea", { id: "transform-patch", rows: 8, cols: 100, spellcheck: "false" });
    patch.value = state.transform.patch;
    const status = el("div", { id: "transform-status", class: "muted" });
    const keep = el("input", { id: "transform-keep", type: "checkbox", checked: state.transform.keep });
    const out = el("div", { id: "transform-previews" });
    const buttons = [];
    function check() {
      state.transform.patch = patch.value;
      state.transform.keep = keep.checked;
      let ok = true;
      try {
        const p = JSON.parse(patch.value);
        if (!Array.isArray(p) || !p.length) throw new Error("want a JSON array of operations");
        status.textContent = p.length + " operation" + (p.length === 1 ? "" : "s");
        status.className = "ok";
      } catch (e) { ok = false; status.textContent = "not a JSON Patch: " + e.message; status.className = "bad"; }
      for (const b of buttons) b.disabled = !ok;
      return ok;
    }
    const body = (extra) => Object.assign({ group: g.id, patch: JSON.parse(patch.value) }, extra);
    const preview = el("button", { id: "transform-preview", onclick: async () => {
      if (!check()) return;
      clear(out);
      out.append(el("p", { class: "muted" }, "Reading the first messages of the group…"));
      try {
        const data = await api(dlqPath(name) + "/transform/preview", { method: "POST", body: body({}) });
        clear(out);
        out.append(el("table", { id: "transform-preview-table" },
          el("thead", {}, el("tr", {}, el("th", {}, "Message"), el("th", {}, "Before"), el("th", {}, "After"))),
          el("tbody", {}, data.previews.map((p) => el("tr", { class: "preview", "data-id": p.id },
            el("td", { class: "mono" }, p.id || "(no id)"),
            el("td", {}, el("pre", { class: "before" }, p.before.body), el("pre", { class: "before-headers" }, JSON.stringify(p.before.headers, null, 2))),
            el("td", {}, p.error ? el("div", { class: "bad preview-error" }, "left in the DLQ as it is: " + p.error)
              : p.unchanged ? el("div", { class: "muted unchanged" }, "unchanged: replayed as it is")
              : [el("pre", { class: "after" }, p.after.body), el("pre", { class: "after-headers" }, JSON.stringify(p.after.headers, null, 2))]))))));
        showError("");
      } catch (e) { clear(out); showError(e.message); }
    } }, "Preview");
    const start = (dryRun) => async () => {
      if (!check()) return;
      try { await api(dlqPath(name) + "/transform", { method: "POST", body: body({ dryRun, keepOriginals: keep.checked, rate: state.overview ? state.overview.rate : undefined }) }); showError(""); refreshJobs(); } catch (e) { showError(e.message); }
    };
    const dry = el("button", { id: "transform-dry", onclick: start(true) }, "Dry run");
    const go = el("button", { id: "transform-go", onclick: start(false) }, "Transform and replay");
    buttons.push(preview, dry, go);
    patch.addEventListener("input", check);
    keep.addEventListener("change", check);
    box.append(el("section", { id: "transform", "data-group": g.id },
      el("h2", {}, "Transform group " + g.id + " (" + plural(g.count, "message") + ")"),
      el("p", { class: "muted" }, "A JSON Patch (RFC 6902) applied to {\"body\": the JSON body, \"headers\": {the application headers}} of each message before it is replayed, " +
        "e.g. [{\"op\": \"move\", \"from\": \"/body/amt\", \"path\": \"/body/amount\"}]. A message it fails on (a failed test, a missing path, a body that is not JSON) stays in the DLQ as it is. " +
        "Hopper's history headers cannot be changed; each copy records that it was changed, by whom and when."),
      patch, status,
      el("p", {}, el("label", {}, keep, " keep each original in " + name + ".originals first"), " ", preview, " ", dry, " ", go,
        " ", el("button", { onclick: () => { state.transform = null; clear(box); } }, "Close")),
      out));
    check();
    box.scrollIntoView();
  }

  // messageList is a button that lists the group's messages (the first
  // 200 of the last scan), each a link to its message view.
  function messageList(name, g) {
    const box = el("div", { class: "messages" });
    const button = el("button", { class: "list", onclick: async () => {
      try {
        const data = await api(dlqPath(name) + "/groups/" + encodeURIComponent(g.id) + "/messages");
        clear(box);
        box.append(el("ul", { class: "message-list" }, data.messages.map((m) => el("li", {},
          el("a", { href: "#/dlq/" + encodeURIComponent(name) + "/msg/" + encodeURIComponent(m.id) }, m.id || "(no id)"),
          " ", el("span", { class: "muted" }, when(m.deadLettered))))));
        if (data.count > data.messages.length) box.append(el("div", { class: "muted" }, "first " + data.messages.length + " of " + data.count));
      } catch (e) { showError(e.message); }
    } }, "Messages…");
    box.append(button);
    return box;
  }

  // shareBar is sized through the style object, which the page's
  // content security policy allows (a style attribute it would not).
  function shareBar(share) {
    const bar = el("span", { class: "share" });
    bar.style.width = Math.max(1, Math.round(share * 60)) + "px";
    return bar;
  }

  // redirectInputs are the fields that send a replay somewhere else than
  // each message's original queue: a queue, or an exchange and a routing
  // key (blank: each message's original one). The console checks the
  // target exists before anything moves.
  function redirectInputs() {
    const queue = el("input", { class: "redirect-to", type: "text", placeholder: "to queue", size: 12, autocomplete: "off", title: "replay to this queue instead of each message's original queue" });
    const exchange = el("input", { class: "redirect-exchange", type: "text", placeholder: "or exchange", size: 12, autocomplete: "off", title: "publish to this exchange instead" });
    const key = el("input", { class: "redirect-key", type: "text", placeholder: "routing key", size: 10, autocomplete: "off", title: "routing key with the exchange (blank: each message's original one)" });
    return {
      box: el("span", { class: "redirect" }, queue, " ", exchange, " ", key),
      value: () => {
        const v = {};
        if (queue.value.trim()) v.to = queue.value.trim();
        if (exchange.value.trim()) v.toExchange = exchange.value.trim();
        if (key.value) v.routingKey = key.value;
        return v;
      },
    };
  }

  async function replay(name, target, rateText) {
    const body = Object.assign({}, target);
    if (rateText !== undefined && rateText !== "") body.rate = Number(rateText);
    try { await api(dlqPath(name) + "/replay", { method: "POST", body }); showError(""); refreshJobs(); } catch (e) { showError(e.message); }
  }

  // ignoreGroup marks a group ignored (it stays in the DLQ, out of the
  // overview's attention figure) or not.
  async function ignoreGroup(name, g, ignored) {
    try { await api(dlqPath(name) + "/groups/" + encodeURIComponent(g.id) + "/ignore", { method: "POST", body: { ignored } }); showError(""); await refreshJobs(); route(); } catch (e) { showError(e.message); }
  }

  async function purgeGroup(name, g, typed) {
    try { await api(dlqPath(name) + "/purge", { method: "POST", body: { group: g.id, confirm: typed } }); showError(""); refreshJobs(); } catch (e) { showError(e.message); }
  }

  async function exportGroup(name, g) {
    try {
      const res = await api(dlqPath(name) + "/export", { method: "POST", body: { group: g.id }, raw: true });
      const blob = await res.blob();
      const a = el("a", { href: URL.createObjectURL(blob), download: name + "-" + g.id + ".jsonl" });
      document.body.append(a);
      a.click();
      a.remove();
      showError("");
      refreshJobs();
    } catch (e) { showError(e.message); }
  }

  // ---- message ----
  async function renderMessage(view, name, id) {
    clear(view);
    view.append(el("p", {}, "Reading message ", el("code", {}, id), " from ", el("code", {}, name), "…"));
    const m = await api(dlqPath(name) + "/message?id=" + encodeURIComponent(id));
    clear(view);
    view.append(el("h1", {}, "Message ", el("code", { id: "message-id" }, m.id)));
    view.append(el("p", {}, "in ", el("a", { href: "#/dlq/" + encodeURIComponent(name) }, name),
      m.group ? el("span", {}, " — group of " + m.group.count + ": " + (m.group.key.fingerprint || "(no error)")) : ""));
    if (m.traceUrl) view.append(el("p", {}, "Trace: ", el("a", { id: "trace", href: m.traceUrl, rel: "noopener noreferrer", target: "_blank" }, m.traceId)));
    else if (m.traceId) view.append(el("p", {}, "Trace id: ", el("code", {}, m.traceId)));
    if (state.allowActions) {
      const rate = el("input", { class: "rate", type: "number", min: 0, step: "any", value: String(state.overview ? state.overview.rate : 0) });
      const to = redirectInputs();
      state.redirect = to;
      view.append(el("p", { class: "actions" }, el("button", { class: "replay-one", onclick: () => replay(name, Object.assign({ message: m.id }, to.value()), rate.value) }, "Replay this message"), " ", rate, " msg/s ", to.box));
    }
    view.append(el("h2", {}, "Attempt history"));
    view.append(fieldTable("history", m.history, false));
    view.append(el("h2", {}, "Headers"));
    view.append(fieldTable("headers", m.headers, true));
    view.append(el("h2", {}, "Properties"));
    view.append(fieldTable("properties", m.properties, false));
    const b = m.body;
    view.append(el("h2", {}, "Body ", el("span", { class: "muted", id: "body-kind" }, b.kind + ", " + b.size + " bytes" + (b.truncated ? ", cut" : ""))));
    view.append(el("pre", { id: "body" }, b.text));
    if (state.allowActions && m.edit) view.append(editor(name, m));
  }

  // editor is the message view's "edit and retry": the body (checked as
  // JSON while typing when the content type is JSON) and the application
  // headers as one JSON object. Only what changed is sent; the console
  // checks it again, and again on the message it takes from the DLQ.
  function editor(name, m) {
    const ed = m.edit;
    const body = el("textarea", { id: "edit-body", rows: 14, cols: 100, spellcheck: "false", readonly: !ed.bodyEditable });
    body.value = ed.body;
    const headers = el("textarea", { id: "edit-headers", rows: 6, cols: 100, spellcheck: "false" });
    const headersText = JSON.stringify(ed.headers, null, 2);
    headers.value = headersText;
    const bodyStatus = el("div", { id: "edit-body-status", class: "muted" });
    const headersStatus = el("div", { id: "edit-headers-status", class: "muted" });
    const reset = el("input", { id: "edit-reset", type: "checkbox" });
    const go = el("button", { id: "edit-go", disabled: true }, "Replay the edited copy");
    function check() {
      let ok = true;
      if (ed.json && ed.bodyEditable) {
        try { JSON.parse(body.value); bodyStatus.textContent = "valid JSON"; bodyStatus.className = "ok"; } catch (e) { ok = false; bodyStatus.textContent = "not valid JSON: " + e.message; bodyStatus.className = "bad"; }
      } else {
        bodyStatus.textContent = ed.bodyEditable ? "text (" + (ed.contentType || "no content type") + "): not checked" : ed.why;
        bodyStatus.className = "muted";
      }
      try {
        const h = JSON.parse(headers.value);
        if (h === null || typeof h !== "object" || Array.isArray(h)) throw new Error("want a JSON object of header names and values");
        headersStatus.textContent = "application headers: " + Object.keys(h).length;
        headersStatus.className = "ok";
      } catch (e) { ok = false; headersStatus.textContent = "headers: " + e.message; headersStatus.className = "bad"; }
      const changed = body.value !== ed.body || headers.value !== headersText;
      go.disabled = !ok || !changed;
      return ok;
    }
    body.addEventListener("input", check);
    headers.addEventListener("input", check);
    go.addEventListener("click", async () => {
      if (!check()) return;
      const req = Object.assign({ message: m.id, contentType: ed.contentType, resetAttempts: reset.checked }, state.redirect ? state.redirect.value() : {});
      if (body.value !== ed.body) req.body = body.value;
      if (headers.value !== headersText) req.headers = JSON.parse(headers.value);
      const result = document.getElementById("edit-result");
      try {
        const job = await api(dlqPath(name) + "/edit", { method: "POST", body: req });
        result.textContent = "Edit started (activity " + job.id + ").";
        showError("");
        refreshJobs();
      } catch (e) { result.textContent = e.message; showError(e.message); }
    });
    const box = el("section", { id: "editor" },
      el("h2", {}, "Edit and retry"),
      el("p", { class: "muted" }, "The edited copy is replayed as a replay is: published, confirmed, then the message acked. " +
        "The message as it is now is first kept in " + ed.originals + " (hopper dlq export --dlq " + ed.originals + " --message-id " + m.id + ", then hopper dlq import, bring it back). " +
        "Hopper's history headers cannot be edited; the copy records who edited it, when, and the digest of the original body."),
      el("label", {}, "Body", ed.json ? " (JSON)" : ""), body, bodyStatus,
      el("label", {}, "Application headers (a JSON object)"), headers, headersStatus,
      el("p", {}, el("label", {}, reset, " reset attempts (full retry budget again)"), " ", go, " ", el("span", { class: "muted" }, "(to the queue or exchange given beside Replay this message, if any)")),
      el("p", { id: "edit-result", class: "muted" }));
    check();
    return box;
  }

  function fieldTable(id, fields, about) {
    return el("table", { id },
      el("tbody", {}, fields.map((f) => el("tr", {},
        el("th", { class: "hname mono" }, f.name),
        el("td", { class: "hvalue mono" }, f.value),
        about ? el("td", { class: "habout muted" }, f.about || "") : null))));
  }

  // ---- activity ----
  function renderActivity(view) {
    clear(view);
    view.append(el("h1", {}, "Activity"));
    view.append(el("table", { id: "activity" },
      el("thead", {}, el("tr", {}, el("th", {}, "When"), el("th", {}, "What"), el("th", {}, "DLQ"), el("th", {}, "Target"), el("th", {}, "Who"), el("th", { class: "num" }, "Messages"), el("th", { class: "num", title: "messages of the run back in the DLQ (failed again), by the last scan" }, "Came back"), el("th", {}, "State"), el("th", {}, "Result"))),
      el("tbody", {}, state.jobs.filter((j) => j.kind !== "read").map((j) => el("tr", { "data-job": j.id },
        el("td", {}, when(j.started)), el("td", { class: "kind" }, j.kind), el("td", {}, j.dlq), el("td", { class: "mono" }, j.target || "—"),
        el("td", { class: "who" }, j.who || ""), el("td", { class: "num" }, String(j.done)),
        el("td", { class: "num came-back", title: j.runId || "" }, j.cameBack === undefined || j.cameBack === null ? "—" : String(j.cameBack)), el("td", { class: "state" }, j.state),
        el("td", {}, j.error ? j.summary + " " + j.error : j.summary))))));
  }

  // ---- jobs bar ----
  function renderJobs() {
    const box = document.getElementById("jobs");
    clear(box);
    const recent = state.jobs.filter((j) => j.kind !== "scan" && j.kind !== "read" && (j.state === "running" || Date.now() - new Date(j.finished).getTime() < 120000));
    for (const j of recent.slice(0, 5)) {
      const pct = j.percent.toFixed(0) + "%";
      box.append(el("div", { class: "job " + j.state, "data-job": j.id, "data-kind": j.kind },
        el("span", {}, j.kind + " " + (j.target || "") + " in " + j.dlq),
        el("progress", { class: "bar", max: 100, value: j.percent.toFixed(1) }),
        el("span", { class: "pct" }, pct),
        el("span", { class: "eta" }, j.eta ? "ETA " + j.eta : ""),
        el("span", { class: "state" }, j.state),
        el("span", { class: "summary" }, (j.summary || "") + (j.error ? " " + j.error : "")),
        j.waiting ? el("span", { class: "waiting" }, j.done + " replayed; waiting before the next " + j.batch) : null,
        j.waiting && state.allowActions ? el("button", { class: "next", onclick: () => nextBatch(j.id) }, "Next batch") : null,
        j.state === "running" && state.allowActions ? el("button", { class: "cancel", onclick: () => cancelJob(j.id) }, "Cancel") : null));
    }
  }

  async function nextBatch(id) {
    try { await api("/api/jobs/" + encodeURIComponent(id) + "/next", { method: "POST" }); refreshJobs(); } catch (e) { showError(e.message); }
  }

  async function cancelJob(id) {
    try { await api("/api/jobs/" + encodeURIComponent(id) + "/cancel", { method: "POST" }); refreshJobs(); } catch (e) { showError(e.message); }
  }

  async function refreshJobs() {
    try {
      const data = await api("/api/jobs");
      state.jobs = data.jobs;
      renderJobs();
      // A finished action changes the groups of its DLQ: draw them again
      // if they are shown (not for another DLQ's: that would clear what
      // the operator is typing here).
      let changed = false;
      const shown = state.route.startsWith("#/dlq/") ? decodeURIComponent(state.route.slice(6).split("/")[0]) : "";
      for (const j of state.jobs) {
        if (j.state !== "running" && !state.seenDone.has(j.id)) { state.seenDone.add(j.id); changed = changed || j.dlq === shown; }
      }
      if (changed && state.route.startsWith("#/dlq/") && !state.route.includes("/msg/")) route();
      if (state.route === "#/activity") renderActivity(document.getElementById("view"));
    } catch (e) { showError(e.message); }
  }

  async function refresh() {
    try {
      state.overview = await api("/api/overview");
      state.allowActions = state.overview.allowActions;
      document.getElementById("token-box").hidden = !state.overview.tokenNeeded;
      document.getElementById("mode").textContent = state.allowActions ? "actions allowed (token needed)" : state.overview.tokenNeeded ? "read-only (token needed)" : "read-only";
      if (state.route === "" || state.route === "#/") renderOverview(document.getElementById("view"));
    } catch (e) { showError(e.message); }
  }

  async function route() {
    state.route = location.hash || "#/";
    const view = document.getElementById("view");
    const parts = state.route.slice(2).split("/").map(decodeURIComponent);
    try {
      if (parts[0] === "dlq" && parts.length >= 4 && parts[2] === "msg") await renderMessage(view, parts[1], parts.slice(3).join("/"));
      else if (parts[0] === "dlq" && parts.length >= 2) await renderGroups(view, parts[1]);
      else if (parts[0] === "activity") renderActivity(view);
      else if (state.overview) renderOverview(view);
    } catch (e) {
      clear(view);
      view.append(el("p", { class: "muted", id: "load-error" }, "Could not load this page: " + e.message),
        el("button", { id: "retry", onclick: route }, "Try again"));
    }
  }

  document.addEventListener("DOMContentLoaded", async () => {
    const t = document.getElementById("token");
    t.value = sessionStorage.getItem("hopper-token") || "";
    t.addEventListener("change", () => sessionStorage.setItem("hopper-token", t.value));
    t.addEventListener("input", () => sessionStorage.setItem("hopper-token", t.value));
    window.addEventListener("hashchange", route);
    await refresh();
    await refreshJobs();
    await route();
    setInterval(refresh, 2000);
    setInterval(refreshJobs, 1000);
  });
})();

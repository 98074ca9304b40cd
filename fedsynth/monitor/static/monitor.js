// fedsynth monitor page: polls /api/overview and /api/view every 2 s and draws what they say.
// Every value from a results folder goes into the page as text (textContent), never as HTML.
"use strict";
(function () {
  const POLL_MS = 2000;
  const charts = {};
  let selected = null;
  if (location.search.includes("token=")) history.replaceState(null, "", location.pathname + location.hash);

  function el(tag, text, cls) {
    const node = document.createElement(tag);
    if (text !== undefined && text !== null) node.textContent = String(text);
    if (cls) node.className = cls;
    return node;
  }
  function row(cells) {
    const tr = document.createElement("tr");
    cells.forEach(function (c) { tr.appendChild(c instanceof Node ? c : el("td", c)); });
    return tr;
  }
  function fill(tbody, rows) { tbody.replaceChildren.apply(tbody, rows); }
  function mb(x) { return x === null || x === undefined ? "–" : (x / 1e6).toFixed(3); }
  function num(x, digits) { return x === null || x === undefined ? "–" : Number(x).toFixed(digits); }

  async function getJSON(url) {
    const reply = await fetch(url, { credentials: "same-origin", cache: "no-store" });
    if (!reply.ok) throw new Error(url + ": " + reply.status + " " + (await reply.text()));
    return reply.json();
  }

  function renderEntries(overview) {
    document.getElementById("root").textContent = overview.root;
    const nav = document.getElementById("entries");
    const entries = overview.entries;
    document.getElementById("empty").hidden = entries.length > 0;
    // the address's #id=... wins once that run or study exists (a run's folder appears when it starts)
    const wanted = new URLSearchParams(location.hash.slice(1)).get("id");
    const present = function (id) { return entries.some(function (e) { return e.id === id; }); };
    if (wanted && present(wanted)) selected = wanted;
    else if (!selected || !present(selected)) selected = entries.length ? entries[0].id : null;
    const links = entries.map(function (e) {
      const label = (e.id === "." ? overview.root : e.id) + " — " +
        (e.kind === "study" ? "study" : e.state);
      const a = el("a", label, e.id === selected ? "current" : "");
      a.href = "#id=" + encodeURIComponent(e.id);
      a.dataset.id = e.id;
      a.addEventListener("click", function (event) {  // the address says what is shown, before the next poll reads it
        event.preventDefault();
        history.replaceState(null, "", "#id=" + encodeURIComponent(e.id));
        selected = e.id;
        poll();
      });
      return a;
    });
    nav.replaceChildren.apply(nav, entries.length > 1 ? links : []);
  }

  function series(rounds, key) {
    return rounds.map(function (r) {
      const v = key in r ? r[key] : r.metrics[key];
      return v === undefined || v === null ? null : v;
    });
  }

  function chart(name, title, rounds, keys, scale) {
    const present = keys.filter(function (k) { return series(rounds, k).some(function (v) { return v !== null; }); });
    const box = document.getElementById("charts");
    const signature = present.join(",");
    if (!present.length) {
      if (charts[name]) { charts[name].plot.destroy(); charts[name].div.remove(); delete charts[name]; }
      return;
    }
    const xs = rounds.map(function (r) { return r.round; });
    const data = [xs].concat(present.map(function (k) {
      return series(rounds, k).map(function (v) { return v === null ? null : v * (scale || 1); });
    }));
    if (charts[name] && charts[name].signature === signature) {
      charts[name].plot.setData(data);
      return;
    }
    if (charts[name]) { charts[name].plot.destroy(); charts[name].div.remove(); }
    const div = el("div", null, "chart");
    div.id = "chart-" + name;
    box.appendChild(div);
    const colours = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728"];
    const plot = new uPlot({
      title: title, width: 420, height: 240,
      scales: { x: { time: false } },
      series: [{ label: "round" }].concat(present.map(function (k, i) {
        return { label: k, stroke: colours[i % colours.length], width: 2, spanGaps: true, points: { show: true } };
      })),
      axes: [{ label: "round", incrs: [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000] }, {}],
    }, data, div);
    charts[name] = { plot: plot, div: div, signature: signature };
  }

  function renderRun(view) {
    document.getElementById("run").hidden = false;
    document.getElementById("study").hidden = true;
    document.getElementById("run-title").textContent =
      (view.id === "." ? "this run" : view.id) + (view.algorithm ? " — " + view.algorithm + " on " + view.dataset : "");
    const status = document.getElementById("status");
    status.textContent = "status: " + view.state + (view.reason ? " (" + view.reason + ")" : "") +
      " · round " + view["last-round"] + " of " + (view["planned-rounds"] === null ? "?" : view["planned-rounds"]);
    status.className = "status state-" + view.state.replace(/ /g, "-");
    const warn = [];
    if (view["skipped-lines"]) warn.push(view["skipped-lines"] + " malformed line(s) of metrics.jsonl skipped");
    if (view["partial-line"]) warn.push("a round's line is being written");
    if (view.truncated) warn.push("metrics.jsonl is large: only its end is read");
    document.getElementById("warnings").textContent = warn.join("; ");

    const rounds = view.rounds;
    const trained = rounds.filter(function (r) { return r.round >= 1; });
    const fid = rounds.some(function (r) { return Object.keys(r.metrics).some(function (k) { return k.indexOf("fid") >= 0; }); });
    const accuracyKeys = fid ? Object.keys(Object.assign({}, ...rounds.map(function (r) { return r.metrics; })))
      .filter(function (k) { return k.indexOf("fid") >= 0; }) : ["central-accuracy", "local-test-accuracy"];
    chart("accuracy", fid ? "FID" : "Accuracy", rounds, accuracyKeys);
    chart("loss", "Loss", rounds, ["central-loss", "train-loss"]);
    chart("bytes", "MB per round", trained, ["uplink-bytes", "downlink-bytes"], 1e-6);
    chart("time", "Round time (s)", trained, ["round-time"]);

    fill(document.querySelector("#nodes tbody"), view.nodes.map(function (n) {
      const drops = n.dropped.map(function (d) { return "round " + d.round + ": " + d.reason; }).join("; ");
      return row([n.name, n.examples === null ? "–" : n.examples, n.online ? "yes" : "no", n["answered-rounds"],
        n["last-answered"] === null ? "–" : n["last-answered"], n.joined === null ? "–" : "round " + n.joined,
        n["away-since"] === null ? "–" : "round " + n["away-since"], el("td", drops || "–", drops ? "bad" : "")]);
    }));
    const events = document.getElementById("events");
    events.replaceChildren.apply(events, view.events.map(function (e) { return el("li", e); }));
    fill(document.querySelector("#rounds tbody"), rounds.slice().reverse().map(function (r) {
      const drops = r.dropped.map(function (d) { return d.node + ": " + d.reason; }).join("; ");
      const metrics = Object.keys(r.metrics).map(function (k) { return k + " " + Number(r.metrics[k]).toPrecision(4); }).join(", ");
      const tr = row([r.round, num(r["round-time"], 2),
        r.answered === null ? "–" : r.answered + " / " + r.sampled + (r.skipped ? " (failed round)" : ""),
        el("td", drops || "–", drops ? "bad" : ""), mb(r["uplink-bytes"]), mb(r["downlink-bytes"]), metrics]);
      tr.dataset.round = r.round;
      return tr;
    }));
  }

  function renderStudy(view) {
    document.getElementById("run").hidden = true;
    document.getElementById("study").hidden = false;
    document.getElementById("study-title").textContent = "study " + (view.id === "." ? "" : view.id);
    document.getElementById("study-progress").textContent = view["runs-finished"] + " run(s) finished" +
      (view["runs-planned"] ? " of " + view["runs-planned"] : "") + ", " + view["runs-failed"] + " failed, " +
      view["runs-under-way"] + " under way";
    fill(document.querySelector("#arms tbody"), view.arms.map(function (a) {
      return row([a.arm, a.finished, a.failed, a.seeds.join(", ") || "–"]);
    }));
    const claims = view.claims;
    document.getElementById("claims-note").textContent = view.report ?
      (claims.length ? "From report.md." : "report.md has no claims.") : "No report.md yet: the claims appear once it is written.";
    const head = document.querySelector("#claims thead");
    const columns = claims.length ? Object.keys(claims[0]) : [];
    head.replaceChildren(row(columns.map(function (c) { return el("th", c); })));
    fill(document.querySelector("#claims tbody"), claims.map(function (c) {
      return row(columns.map(function (k) { return c[k]; }));
    }));
  }

  async function poll() {
    try {
      const overview = await getJSON("/api/overview");
      renderEntries(overview);
      if (selected !== null) {
        const view = await getJSON("/api/view?id=" + encodeURIComponent(selected));
        if (view.id !== selected) return;  // a poll begun before a click: its view is not the one chosen now
        if (view.kind === "study") renderStudy(view); else renderRun(view);
      }
      document.getElementById("updated").textContent = "Last update: " + new Date().toLocaleTimeString();
    } catch (err) {
      document.getElementById("updated").textContent = "Update failed: " + err.message;
    }
  }
  poll();
  setInterval(poll, POLL_MS);
})();

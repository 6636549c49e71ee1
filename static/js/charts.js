// Charts, Validation and System tabs: one Plotly chart per metric, from the server's
// downsampled series.
(function () {
  const head = document.querySelector(".job-head");
  if (!head || typeof Plotly === "undefined") return;
  const jobId = head.dataset.jobId;
  // Colours from the console's theme (theme.js), redone when it changes.
  const themed = () => window.StarforgeTheme.plotly();  // colours from theme.js
  const layout = (name, x) => {
    const t = themed();
    return {
      title: { text: name, font: { size: 13 } }, height: 260, margin: { l: 50, r: 10, t: 30, b: 35 },
      xaxis: { title: { text: x }, gridcolor: t["xaxis.gridcolor"], zerolinecolor: t["xaxis.zerolinecolor"] },
      yaxis: { gridcolor: t["yaxis.gridcolor"], zerolinecolor: t["yaxis.zerolinecolor"] },
      paper_bgcolor: t.paper_bgcolor, plot_bgcolor: t.plot_bgcolor, font: t.font,
    };
  };
  document.addEventListener("sf:theme", () => {
    const t = themed();
    document.querySelectorAll("[data-metric].js-plotly-plot").forEach((div) => Plotly.relayout(div, t));
  });
  async function fetchMetrics(id, kind, x) {
    const response = await fetch(`/api/v1/jobs/${id}/metrics?kind=${kind}&x=${x}`,
                                 { credentials: "same-origin" });
    return response.ok ? response.json() : { series: {}, latest: {} };
  }
  // The Validation tab also shows the validation metrics of the job's follow-on jobs
  // (`--then eval`), each name prefixed with the follow-on's name.
  async function gather(section, kind, x) {
    const body = await fetchMetrics(jobId, kind, x);
    for (const child of JSON.parse(section.dataset.followOns || "[]")) {
      const extra = await fetchMetrics(child.id, kind, x);
      for (const [n, v] of Object.entries(extra.series || {})) body.series[`${child.name}/${n}`] = v;
      for (const [n, v] of Object.entries(extra.latest || {})) body.latest[`${child.name}/${n}`] = v;
    }
    return body;
  }
  function cell(row, text) {
    const td = document.createElement("td");
    td.textContent = text;  // metric names come from the job's code: never as HTML
    row.appendChild(td);
  }
  // nvml_available is a flag, not a series: it only picks the System tab's sentence. Each rank
  // of a multi-node job has its own (rank1/nvml_available), as it has its own series.
  const isFlag = (name) => /(^|\/)nvml_available$/.test(name);
  async function draw(section) {
    const kind = section.dataset.metricsKind;
    const x = section.dataset.x || "step";
    const body = await gather(section, kind, x);
    const names = Object.keys(body.series || {}).filter((n) => !isFlag(n)).sort();
    section.querySelector(".empty").hidden = names.length > 0;
    const note = section.querySelector(".system-note");
    if (note) note.hidden = !Object.entries(body.latest || {}).some(
      ([n, v]) => isFlag(n) && v.value === 0);
    // The System tab of a multi-node job has a group per rank (`data-prefix`, e.g. "rank1/",
    // titled with the rank and its node): a series goes to its rank's group, named without
    // the prefix; any other series to the section's own charts.
    const groups = [...section.querySelectorAll(".rank-group")];
    for (const name of names) {
      const group = groups.find((g) => name.startsWith(g.dataset.prefix));
      const box = group ? group.querySelector(".charts") : section.querySelector(":scope > .charts");
      if (group) group.hidden = false;
      let div = box.querySelector(`[data-metric="${CSS.escape(name)}"]`);
      if (!div) {
        div = document.createElement("div");
        div.dataset.metric = name;
        box.appendChild(div);
      }
      const s = body.series[name];
      const title = group ? name.slice(group.dataset.prefix.length) : name;
      Plotly.react(div, [{ x: s.x, y: s.y, mode: "lines", name }], layout(title, x),
                   { displaylogo: false, responsive: true });
    }
    const table = section.querySelector("table.latest");
    if (table && body.latest) {
      table.replaceChildren();
      const head = table.insertRow();
      ["metric", "step", "value"].forEach((h) => cell(head, h));
      for (const [n, v] of Object.entries(body.latest).sort()) {
        const row = table.insertRow();
        [n, v.step, v.value].forEach((t) => cell(row, String(t)));
      }
    }
  }
  function refresh() {
    document.querySelectorAll("section[data-metrics-kind]").forEach((s) => {
      if (!s.hidden) draw(s);
    });
  }
  document.querySelectorAll("select.x-axis").forEach((select) => {
    select.addEventListener("change", () => {
      const section = select.closest("section");
      section.dataset.x = select.value;
      section.querySelectorAll(".charts").forEach((box) => { box.innerHTML = ""; });
      draw(section);
    });
  });
  document.addEventListener("sf:tab", refresh);
  refresh();
  // New points arrive as `job.metrics` messages on the job's websocket: redraw at most once a
  // second; a slow poll covers a dropped message.
  let pending = null;
  window.addEventListener("load", () => {
    if (!window.StarforgeLive) return;
    window.StarforgeLive.socket(`/ws/jobs/${jobId}/`).on("job.metrics", () => {
      if (!pending) pending = setTimeout(() => { pending = null; refresh(); }, 1000);
    });
  });
  if (head.dataset.terminal !== "1") setInterval(refresh, 30000);
})();

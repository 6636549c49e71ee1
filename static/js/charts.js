// Charts, Validation and System tabs: one Plotly chart per metric, from the server's
// downsampled series.
(function () {
  const head = document.querySelector(".job-head");
  if (!head || typeof Plotly === "undefined") return;
  const jobId = head.dataset.jobId;
  const dark = window.matchMedia("(prefers-color-scheme: dark)").matches;
  const layout = (name, x) => ({
    title: { text: name, font: { size: 13 } }, height: 260, margin: { l: 50, r: 10, t: 30, b: 35 },
    xaxis: { title: { text: x } }, paper_bgcolor: "rgba(0,0,0,0)", plot_bgcolor: "rgba(0,0,0,0)",
    font: { color: dark ? "#d6dbe4" : "#1d2330" },
  });
  async function draw(section) {
    const kind = section.dataset.metricsKind;
    const x = section.dataset.x || "step";
    const response = await fetch(`/api/v1/jobs/${jobId}/metrics?kind=${kind}&x=${x}`,
                                 { credentials: "same-origin" });
    if (!response.ok) return;
    const body = await response.json();
    // nvml_available is a flag, not a series: it only picks the System tab's sentence.
    const names = Object.keys(body.series || {}).filter((n) => n !== "nvml_available").sort();
    section.querySelector(".empty").hidden = names.length > 0;
    const note = section.querySelector(".system-note");
    if (note) note.hidden = !(body.latest && body.latest.nvml_available &&
                              body.latest.nvml_available.value === 0);
    const box = section.querySelector(".charts");
    for (const name of names) {
      let div = box.querySelector(`[data-metric="${CSS.escape(name)}"]`);
      if (!div) {
        div = document.createElement("div");
        div.dataset.metric = name;
        box.appendChild(div);
      }
      const s = body.series[name];
      Plotly.react(div, [{ x: s.x, y: s.y, mode: "lines", name }], layout(name, x),
                   { displaylogo: false, responsive: true });
    }
    const table = section.querySelector("table.latest");
    if (table && body.latest) {
      table.innerHTML = "<tr><th>metric</th><th>step</th><th>value</th></tr>" +
        Object.entries(body.latest).map(([n, v]) =>
          `<tr><td>${n}</td><td>${v.step}</td><td>${v.value}</td></tr>`).join("");
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
      section.querySelector(".charts").innerHTML = "";
      draw(section);
    });
  });
  document.addEventListener("sf:tab", refresh);
  refresh();
  if (head.dataset.terminal !== "1") setInterval(refresh, 5000);
})();

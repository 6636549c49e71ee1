// Comparing jobs (jobs/console/compare.py).
//
// On the jobs list: a checkbox per row and a "Compare selected" button that opens
// /compare/?jobs=… with the checked ids (2 to 20, in the list's order), or says why not.
// On the compare page: one Plotly chart per metric from the page's #compare-data (the same
// downsampled series as the Charts tab), one trace per job, coloured from the theme as
// charts.js does; the x-axis select reloads the page with ?x=, so every view has its URL.
(function () {
  "use strict";
  const MAX_JOBS = 20;

  // -- the jobs list -------------------------------------------------------------------------
  // A GET form (`#compare-form`, the rows' checkboxes belong to it): without scripts it sends
  // ?jobs=12&jobs=13, which the page reads too; with them the URL is the shareable ?jobs=12,13.
  const form = document.getElementById("compare-form");
  if (form) {
    const status = form.querySelector("[data-compare-status]");
    const chosen = () => [...document.querySelectorAll("input.compare-pick")]
      .filter((box) => box.checked).map((box) => box.value);
    const say = () => {
      const n = chosen().length;
      status.textContent = n > MAX_JOBS ? `${n} selected: compare at most ${MAX_JOBS}`
        : n < 2 ? `${n} selected: pick 2 to ${MAX_JOBS}` : `${n} selected`;
      return n >= 2 && n <= MAX_JOBS;
    };
    document.addEventListener("change", (event) => {
      if (event.target.matches && event.target.matches("input.compare-pick")) say();
    });
    form.addEventListener("submit", (event) => {
      event.preventDefault();
      if (say()) window.location.assign(`${form.action}?jobs=${chosen().join(",")}`);
    });
  }

  // -- the compare page ----------------------------------------------------------------------
  const box = document.getElementById("compare-charts");
  const source = document.getElementById("compare-data");
  const axis = document.querySelector("#compare-x select.x-axis");
  if (axis) {
    // The page's own URL with the axis chosen: ?jobs=12,13&x=time, commas kept readable.
    axis.addEventListener("change", () => {
      const ids = axis.form.elements.jobs.value;
      window.location.assign(`${window.location.pathname}?jobs=${ids}&x=${axis.value}`);
    });
    const apply = axis.form.querySelector("button[type=submit]");
    if (apply) apply.hidden = true;  // with scripts, choosing is enough
  }
  if (!box || !source || typeof Plotly === "undefined") return;
  const data = JSON.parse(source.textContent);
  const themed = () => window.StarforgeTheme.plotly();  // colours from theme.js
  const layout = (title) => {
    const t = themed();
    return {
      title: { text: title, font: { size: 13 } }, height: 300,
      margin: { l: 50, r: 10, t: 30, b: 35 }, showlegend: true,
      legend: { orientation: "h", y: -0.25 },
      xaxis: { title: { text: data.x_title }, gridcolor: t["xaxis.gridcolor"],
               zerolinecolor: t["xaxis.zerolinecolor"] },
      yaxis: { gridcolor: t["yaxis.gridcolor"], zerolinecolor: t["yaxis.zerolinecolor"] },
      paper_bgcolor: t.paper_bgcolor, plot_bgcolor: t.plot_bgcolor, font: t.font,
    };
  };
  for (const chart of data.charts) {
    const div = document.createElement("div");
    div.dataset.metric = chart.name;
    div.dataset.kind = chart.kind;
    box.appendChild(div);
    const traces = chart.traces.map((t) => ({
      x: t.x, y: t.y, mode: "lines", name: t.name, meta: t.job,
    }));
    Plotly.react(div, traces, layout(chart.title), { displaylogo: false, responsive: true });
  }
  document.addEventListener("sf:theme", () => {
    const t = themed();
    box.querySelectorAll("[data-metric].js-plotly-plot").forEach((div) => Plotly.relayout(div, t));
  });
})();

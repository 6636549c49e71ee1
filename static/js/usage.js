// Usage page: GPU-hours per day, stacked by team.
(function () {
  const div = document.getElementById("usage-chart");
  if (!div || typeof Plotly === "undefined") return;
  const data = JSON.parse(div.dataset.chart);
  if (!data.length) return;
  const dark = window.matchMedia("(prefers-color-scheme: dark)").matches;
  Plotly.newPlot(div, data, {
    barmode: "stack", height: 320, margin: { l: 50, r: 10, t: 10, b: 40 },
    yaxis: { title: { text: "GPU-hours" } }, paper_bgcolor: "rgba(0,0,0,0)",
    plot_bgcolor: "rgba(0,0,0,0)", font: { color: dark ? "#d6dbe4" : "#1d2330" },
  }, { displaylogo: false, responsive: true });
})();

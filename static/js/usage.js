// Usage page: GPU-hours per UTC day, one bar trace per team, stacked.
(function () {
  const div = document.getElementById("usage-chart");
  if (!div || typeof Plotly === "undefined") return;
  const chart = JSON.parse(div.dataset.chart);
  if (!chart.data.length) return;
  const fg = () => window.StarforgeTheme.color("--fg");
  const line = () => window.StarforgeTheme.color("--line");
  Plotly.newPlot(div, chart.data, {
    ...chart.layout, height: 320, margin: { l: 50, r: 10, t: 10, b: 40 },
    // One bar per UTC day, labelled by the day: a date axis would centre a day's bar on its
    // midnight and repeat labels when only a day or two have usage.
    xaxis: { type: "category" },
    yaxis: { title: { text: "GPU-hours" }, gridcolor: line() }, paper_bgcolor: "rgba(0,0,0,0)",
    plot_bgcolor: "rgba(0,0,0,0)", font: { color: fg() },
    legend: { orientation: "h" },
  }, { displaylogo: false, responsive: true });
  // Follow the console's theme (theme.js) when it changes.
  document.addEventListener("sf:theme", () => {
    Plotly.relayout(div, { "font.color": fg(), "yaxis.gridcolor": line() });
  });
})();

// The colour theme: "system" (follow prefers-color-scheme), "light" or "dark". The header's
// button cycles system → light → dark; the choice is kept in localStorage ("sf-theme") and set
// as <html data-theme> by the inline script in base.html's <head> before the first paint.
//
// StarforgeTheme.current() is "light" or "dark" as shown now; StarforgeTheme.color("--fg") a
// custom property's colour as rgb(), for scripts that draw (Plotly; StarforgeTheme.plotly() is
// the relayout of a chart's colours). An "sf:theme" event on
// document tells them the shown theme may have changed.
(function () {
  "use strict";
  const KEY = "sf-theme";
  const ORDER = ["system", "light", "dark"];
  const root = document.documentElement;
  const media = window.matchMedia("(prefers-color-scheme: dark)");

  function choice() {
    const t = root.dataset.theme;
    return t === "light" || t === "dark" ? t : "system";
  }
  function current() {
    const t = choice();
    return t === "system" ? (media.matches ? "dark" : "light") : t;
  }
  // Custom properties hold light-dark() pairs, which only an element's own colour resolves.
  function color(name) {
    const probe = document.createElement("span");
    probe.style.color = `var(${name})`;
    probe.hidden = true;
    document.body.appendChild(probe);
    const value = getComputedStyle(probe).color;
    probe.remove();
    return value;
  }
  function label(button) {
    const t = choice();
    const next = ORDER[(ORDER.indexOf(t) + 1) % ORDER.length];
    button.textContent = `Theme: ${t}`;
    button.title = `colour theme: ${t === "system" ? `system (${current()} now)` : t}; click for ${next}`;
    button.setAttribute("aria-label", `colour theme ${t}, switch to ${next}`);
  }
  function set(t) {
    if (t === "system") delete root.dataset.theme;
    else root.dataset.theme = t;
    try {
      if (t === "system") localStorage.removeItem(KEY);
      else localStorage.setItem(KEY, t);
    } catch (e) { /* storage refused: the choice lasts for this page */ }
    changed();
  }
  function changed() {
    document.querySelectorAll("[data-theme-toggle]").forEach(label);
    document.dispatchEvent(new CustomEvent("sf:theme", { detail: current() }));
  }
  document.querySelectorAll("[data-theme-toggle]").forEach((button) => {
    label(button);
    button.addEventListener("click", () => set(ORDER[(ORDER.indexOf(choice()) + 1) % ORDER.length]));
  });
  media.addEventListener("change", () => { if (choice() === "system") changed(); });
  // A Plotly relayout of the theme's colours: transparent backgrounds, text and grid lines.
  function plotly() {
    const line = color("--line");
    return {
      paper_bgcolor: "rgba(0,0,0,0)", plot_bgcolor: "rgba(0,0,0,0)",
      font: { color: color("--fg") },
      "xaxis.gridcolor": line, "yaxis.gridcolor": line,
      "xaxis.zerolinecolor": line, "yaxis.zerolinecolor": line,
    };
  }
  window.StarforgeTheme = { current, color, choice, plotly };
})();

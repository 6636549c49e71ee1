// Tabs on the job page: the URL hash names the open tab, so a tab can be linked to.
//
// A WAI-ARIA tablist: the selected tab is the only one in the Tab order (roving tabindex);
// ArrowLeft/ArrowRight (wrapping), Home and End move to another tab and open it, as do Enter
// and Space. Opening a tab from the keyboard replaces the hash (no history entry per key
// press); a click on a tab still adds one. Each opening sends "sf:tab" (charts.js and logs.js
// load or redraw what the tab shows).
(function () {
  const tabs = ["charts", "logs", "validation", "system", "events", "diagnostics"];
  const list = document.querySelector('nav.tabs[role="tablist"]');
  const linkOf = (t) => document.querySelector(`nav.tabs a[href="#${t}"]`);
  function show() {
    const name = tabs.includes(location.hash.slice(1)) ? location.hash.slice(1) : "charts";
    tabs.forEach((t) => {
      document.getElementById(`tab-${t}`).hidden = t !== name;
      const link = linkOf(t);
      if (!link) return;
      link.classList.toggle("active", t === name);
      link.setAttribute("aria-selected", String(t === name));
      link.tabIndex = t === name ? 0 : -1;
    });
    document.dispatchEvent(new CustomEvent("sf:tab", { detail: name }));
  }
  function open(name) {
    if (location.hash.slice(1) !== name) {
      history.replaceState(history.state, "", `#${name}`);
      show();
    }
    linkOf(name)?.focus();
  }
  if (list) {
    list.addEventListener("keydown", (event) => {
      const link = event.target.closest('[role="tab"]');
      if (!link) return;
      const at = tabs.indexOf(link.getAttribute("href").slice(1));
      const to = {
        ArrowRight: (at + 1) % tabs.length,
        ArrowLeft: (at - 1 + tabs.length) % tabs.length,
        Home: 0,
        End: tabs.length - 1,
        Enter: at,
        " ": at,
      }[event.key];
      if (to === undefined || event.altKey || event.ctrlKey || event.metaKey) return;
      event.preventDefault();
      open(tabs[to]);
    });
  }
  window.addEventListener("hashchange", show);
  show();
})();

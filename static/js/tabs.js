// Tabs on the job page: the URL hash names the open tab, so a tab can be linked to.
(function () {
  const tabs = ["charts", "logs", "validation", "system", "events", "diagnostics"];
  function show() {
    const name = tabs.includes(location.hash.slice(1)) ? location.hash.slice(1) : "charts";
    tabs.forEach((t) => {
      document.getElementById(`tab-${t}`).hidden = t !== name;
      const link = document.querySelector(`nav.tabs a[href="#${t}"]`);
      if (link) link.classList.toggle("active", t === name);
    });
    document.dispatchEvent(new CustomEvent("sf:tab", { detail: name }));
  }
  window.addEventListener("hashchange", show);
  show();
})();

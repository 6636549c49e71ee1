// Control buttons without a page reload: POST with the CSRF token, then show the new status.
// The websocket (live.js) also updates the badge; this makes the change visible at once.
(function () {
  document.querySelectorAll(".actions form").forEach((form) => {
    form.addEventListener("submit", async (event) => {
      event.preventDefault();
      const button = form.querySelector("button");
      button.disabled = true;
      const response = await fetch(form.action, {
        method: "POST", body: new FormData(form), credentials: "same-origin",
        headers: { Accept: "application/json" },
      });
      const body = await response.json().catch(() => ({}));
      button.disabled = false;
      if (!response.ok) {
        alert(body.detail || `the server answered ${response.status}`);
        return;
      }
      document.dispatchEvent(new CustomEvent("sf:status", { detail: body }));
    });
  });
  document.addEventListener("sf:status", (event) => {
    const { status, reason } = event.detail;
    document.querySelectorAll(".job-head [data-job-status]").forEach((badge) => {
      badge.textContent = status;
      badge.className = `badge badge-${status.toLowerCase()}`;
    });
    const box = document.querySelector(".job-head pre.reason");
    if (box && reason !== undefined) box.textContent = reason;
  });
})();

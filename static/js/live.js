// Live updates over Channels websockets, shared by every script on a page.
//
// StarforgeLive.socket(path) returns one reconnecting connection per path:
//   .on(type, fn)   fn(message) for each pushed message of that type ("job.lines", "job.status")
//   .onOpen(fn)     fn() after every (re)connect: messages sent while disconnected are lost,
//                   so a listener catches up through the API here
// Close codes 4401 (signed out) and 4404 (not your job) are final: no reconnect.
//
// Status badges: every element with `data-job-status` inside an element with `data-job-id`
// follows that job's status. One job on the page: its own socket (ws/jobs/<id>/); several
// (the jobs list): the list socket (ws/jobs/). `data-live-socket` on any element overrides.
(function () {
  "use strict";
  const FINAL_CODES = [4401, 4404];
  const sockets = {};

  // The websocket server listens on a port of its own under `make run` (the page's
  // <meta name="sf-websocket-port">); behind a proxy it shares the page's origin.
  function socketUrl(path) {
    const scheme = location.protocol === "https:" ? "wss://" : "ws://";
    const port = document.querySelector('meta[name="sf-websocket-port"]')?.content;
    return scheme + (port ? location.hostname + ":" + port : location.host) + path;
  }

  function connect(path) {
    const handlers = {};
    const openers = [];
    let delay = 1000;
    const conn = {
      state: "connecting",
      on(type, fn) { (handlers[type] = handlers[type] || []).push(fn); return conn; },
      onOpen(fn) { openers.push(fn); if (conn.state === "open") fn(); return conn; },
    };
    function open() {
      const ws = new WebSocket(socketUrl(path));
      ws.onopen = () => {
        conn.state = "open";
        delay = 1000;
        openers.forEach((fn) => fn());
      };
      ws.onmessage = (event) => {
        const message = JSON.parse(event.data);
        (handlers[message.type] || []).forEach((fn) => fn(message));
      };
      ws.onclose = (event) => {
        if (FINAL_CODES.includes(event.code)) {
          conn.state = "refused";
          return;
        }
        conn.state = "connecting";
        setTimeout(open, delay);
        delay = Math.min(delay * 2, 15000);
      };
    }
    open();
    return conn;
  }

  function socket(path) {
    return (sockets[path] = sockets[path] || connect(path));
  }

  function updateBadge(badge, message) {
    const old = badge.textContent.trim().toLowerCase();
    badge.classList.remove("badge-" + old);
    badge.classList.add("badge-" + message.status.toLowerCase());
    badge.textContent = message.status;
    badge.title = message.reason || "what " + message.status + " means";
    if (badge.hash !== undefined && badge.hash) badge.hash = message.status;
  }

  function wireBadges() {
    const badges = Array.from(document.querySelectorAll("[data-job-status]"));
    const jobOf = (el) => (el.closest("[data-job-id]") || {}).dataset?.jobId;
    const ids = new Set(badges.map(jobOf).filter(Boolean));
    if (!ids.size) return;
    const override = document.querySelector("[data-live-socket]");
    const path = override ? override.dataset.liveSocket
      : ids.size === 1 ? "/ws/jobs/" + ids.values().next().value + "/" : "/ws/jobs/";
    socket(path).on("job.status", (message) => {
      badges.filter((b) => jobOf(b) === String(message.job)).forEach((b) => updateBadge(b, message));
      document.dispatchEvent(new CustomEvent("sf:job-status", { detail: message }));
    });
  }

  window.StarforgeLive = { socket };
  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", wireBadges);
  } else {
    wireBadges();
  }
})();

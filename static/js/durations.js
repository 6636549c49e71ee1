// The jobs list's Duration and GPU-hours columns, counted on while a job runs or waits, and
// moved along by the status changes the list socket pushes (live.js's `sf:job-status`).
//
// Each Duration cell carries `data-state` (waiting, running, ran, none), `data-start` (the
// first attempt's start), `data-end` (the last end) and `data-since` (when it entered the
// queue); each GPU-hours cell the GPU-seconds of its ended attempts (`data-gpu-seconds`), the
// start of the attempt that is up (`data-open-start`) and its GPUs in all (`data-total-gpus`).
// The server writes the same text (jobs/console/views.py `_run_columns`, from metering's
// figures); this only keeps it current, by metering's rule: seconds up × GPUs in all.
(function () {
  "use strict";
  const utc = (date) => window.StarforgeTime.utc(date);
  const at = (cell, name) => new Date(cell.getAttribute("data-" + name));
  const seconds = (from, to) => Math.max(0, (to - from) / 1000);

  // [D-]HH:MM:SS like Slurm's Elapsed, as the `elapsed` filter writes it.
  function elapsed(s) {
    let left = Math.floor(s);
    const days = Math.floor(left / 86400);
    left %= 86400;
    const clock = [Math.floor(left / 3600), Math.floor((left % 3600) / 60), left % 60]
      .map((n) => String(n).padStart(2, "0")).join(":");
    return days ? `${days}-${clock}` : clock;
  }
  const gpuHours = (s) => (s / 3600 >= 1 ? (s / 3600).toFixed(2) : (s / 3600).toFixed(3));

  function drawDuration(cell, now) {
    const state = cell.dataset.state;
    if (state === "waiting") {
      cell.textContent = "waiting " + elapsed(seconds(at(cell, "since"), now));
      cell.title = "waiting in the queue since " + utc(at(cell, "since"));
    } else if (state === "running") {
      cell.textContent = elapsed(seconds(at(cell, "start"), now));
      cell.title = "running since " + utc(at(cell, "start"));
    } else if (state === "ran") {
      cell.textContent = elapsed(seconds(at(cell, "start"), at(cell, "end")));
      cell.title = utc(at(cell, "start")) + " → " + utc(at(cell, "end"));
    } else {
      cell.textContent = "—";
      cell.title = "not started";
    }
  }

  function drawGpuHours(cell, now) {
    let total = parseFloat(cell.dataset.gpuSeconds) || 0;
    if (cell.dataset.openStart) {
      total += seconds(at(cell, "open-start"), now) * (parseInt(cell.dataset.totalGpus, 10) || 0);
    }
    const started = cell.closest("tr").querySelector("td.duration")?.dataset.start;
    cell.textContent = started ? gpuHours(total) : "—";
    cell.title = total.toFixed(1) + " GPU-seconds";
  }

  function tick() {
    const now = new Date();
    document.querySelectorAll('td.duration[data-state="waiting"], td.duration[data-state="running"]')
      .forEach((cell) => drawDuration(cell, now));
    document.querySelectorAll("td.gpu-hours[data-open-start]").forEach((cell) => drawGpuHours(cell, now));
  }

  // A status change of a job on the page: the same rules as the server's.
  document.addEventListener("sf:job-status", (event) => {
    const { job, status, time } = event.detail;
    const row = document.querySelector(`tr[data-job-id="${job}"]`);
    const duration = row?.querySelector("td.duration");
    const hours = row?.querySelector("td.gpu-hours");
    if (!duration || !hours) return;
    const when = new Date(time);
    const iso = when.toISOString();
    if (status === "RUNNING") {
      if (!duration.dataset.start) duration.dataset.start = iso;
      delete duration.dataset.end;
      duration.dataset.state = "running";
      if (!hours.dataset.openStart) hours.dataset.openStart = iso;
    } else if (status === "QUEUED") {
      duration.dataset.state = "waiting";
      duration.dataset.since = iso;
    } else {  // SUBMITTED, PENDING: not up (again) yet; or ended
      if (duration.dataset.state === "running") duration.dataset.end = iso;
      duration.dataset.state = duration.dataset.start ? "ran" : "none";
    }
    if (status !== "RUNNING" && hours.dataset.openStart) {
      const ran = seconds(at(hours, "open-start"), when) * (parseInt(hours.dataset.totalGpus, 10) || 0);
      hours.dataset.gpuSeconds = String((parseFloat(hours.dataset.gpuSeconds) || 0) + ran);
      delete hours.dataset.openStart;
    }
    drawDuration(duration, new Date());
    drawGpuHours(hours, new Date());
  });
  setInterval(tick, 1000);
})();

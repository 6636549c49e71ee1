// Relative times ("3 min ago") with the exact time on hover, for every <time datetime>.
// Templates write them with the `utc_time` filter (jobs/templatetags/console.py): the text and
// the title are the absolute UTC time; this keeps the title and makes the text relative.
(function () {
  const units = [["day", 86400], ["h", 3600], ["min", 60], ["s", 1]];
  function relative(date) {
    const seconds = Math.round((Date.now() - date.getTime()) / 1000);
    const abs = Math.abs(seconds);
    for (const [name, size] of units) {
      if (abs >= size || name === "s") {
        const n = Math.floor(abs / size);
        return seconds >= 0 ? `${n} ${name} ago` : `in ${n} ${name}`;
      }
    }
  }
  // "2026-12-03 08:00:00 UTC", as the `utc` filter writes it.
  function utc(date) {
    return date.toISOString().replace("T", " ").replace(/\.\d+Z$/, " UTC");
  }
  function update() {
    document.querySelectorAll("time[datetime]").forEach((el) => {
      const date = new Date(el.getAttribute("datetime"));
      if (isNaN(date)) return;
      el.title = utc(date);
      el.textContent = relative(date);
    });
  }
  window.StarforgeTime = { utc, relative };
  update();
  setInterval(update, 15000);
})();

// Relative times ("3 min ago") with the exact time on hover, for every <time datetime>.
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
  function update() {
    document.querySelectorAll("time[datetime]").forEach((el) => {
      const date = new Date(el.getAttribute("datetime"));
      if (isNaN(date)) return;
      el.title = date.toISOString().replace("T", " ").replace(/\.\d+Z$/, " UTC");
      el.textContent = relative(date);
    });
  }
  update();
  setInterval(update, 15000);
})();

// The Logs tab: the tail from the logs API, then lines pushed over the job's websocket.
//
// The channel layer drops messages when a page falls behind, so every pushed batch carries
// its attempt and sequence numbers and the log cursor just after it. The page keeps the
// (attempt, seq) of the last line it shows and the cursor just after that line; a batch that
// does not continue it is preceded by the missing range, fetched from the API by cursor. A
// line at or before the last shown one is never shown twice. After a quiet moment, a status
// change or a reconnect the page also fetches from its cursor: the last batches of a burst
// may be the dropped ones.
//
// A multi-node job's lines carry their rank. With "all ranks" each line is marked with it; with
// one rank chosen the page shows what the logs API returns for `rank` (that rank's lines and
// the store's notes), and a pushed batch holding such a line makes it fetch from its cursor:
// the API's cursor moves past the other ranks' lines, so a gap cannot be told by seq.
// Needs static/js/live.js first.
(function () {
  "use strict";
  const root = document.getElementById("logs-tab");
  if (!root) return;
  const api = root.dataset.logsUrl;
  const TAIL = Number(root.dataset.logsTail || 2000);
  const PAGE = 10000;
  const SETTLE_MS = 1500;
  const pre = root.querySelector("pre.logs");
  const followButton = root.querySelector(".logs-follow");
  const search = root.querySelector(".logs-search");
  const earlier = root.querySelector(".logs-earlier");
  const count = root.querySelector(".logs-count");
  const state = root.querySelector(".logs-state");
  const rankSelect = root.querySelector(".logs-rank");

  let last = { attempt: -1, seq: -1 }; // the last line shown
  let first = null; // the first line shown
  let cursor = null; // the log cursor just after `last`
  let follow = true;
  let query = "";
  let rank = null; // the rank shown, or null: every line
  let refillQueued = false;
  let work = Promise.resolve(); // fetches and appends run one at a time, in arrival order
  let settleTimer = null;
  let programmaticScroll = false;

  const isAfter = (a, s, ref) => a > ref.attempt || (a === ref.attempt && s > ref.seq);

  function lineElement(line) {
    const el = document.createElement("span");
    el.className = "line " + (line.stream === "stderr" ? "stderr" : "stdout");
    el.textContent = line.text;
    el.title = "attempt " + line.attempt + " · line " + line.seq;
    if (line.rank !== undefined) {
      el.dataset.rank = line.rank;
      el.title += " · rank " + line.rank;
      if (rank === null) {
        const mark = document.createElement("span");
        mark.className = "rank";
        mark.textContent = "[rank " + line.rank + "] ";
        el.prepend(mark);
      }
    }
    if (query && !line.text.toLowerCase().includes(query)) el.hidden = true;
    return el;
  }

  function build(lines, previous) {
    const fragment = document.createDocumentFragment();
    lines.forEach((line) => {
      const el = lineElement(line);
      if (previous && line.attempt !== previous.attempt) el.classList.add("attempt-start");
      previous = line;
      fragment.appendChild(el);
    });
    return fragment;
  }

  // `lines` are wire lines ({attempt, seq, stream, ts, text}) continuing `last`.
  function append(lines) {
    lines = lines.filter((l) => isAfter(l.attempt, l.seq, last));
    if (!lines.length) return;
    pre.appendChild(build(lines, last.attempt >= 0 ? last : null));
    if (!first) first = { attempt: lines[0].attempt, seq: lines[0].seq };
    const end = lines[lines.length - 1];
    last = { attempt: end.attempt, seq: end.seq };
    updateCount();
    if (follow) scrollToEnd();
  }

  async function getPage(params) {
    if (rank !== null) params = { ...params, rank };
    const response = await fetch(api + "?" + new URLSearchParams(params), {
      credentials: "same-origin",
      headers: { Accept: "application/json" },
    });
    if (!response.ok) throw new Error("the logs API answered " + response.status);
    return response.json();
  }

  async function loadTail() {
    const page = await getPage({ tail: TAIL });
    append(page.lines);
    cursor = page.cursor;
    earlier.hidden = page.lines.length < TAIL;
  }

  // Fetch from the cursor until `until` (attempt, seq) is shown, or to the end when null.
  async function fill(until) {
    if (cursor === null) await loadTail(); // the first load failed: start from the tail again
    for (;;) {
      const page = await getPage({ cursor, limit: PAGE });
      append(page.lines);
      cursor = page.cursor;
      if (page.lines.length < PAGE) return;
      if (until && !isAfter(until.attempt, until.seq, last)) return;
    }
  }

  async function onBatch(message) {
    if (rank !== null) {
      if (message.lines.some((l) => l.rank === rank || l.rank === undefined)) refill();
      return;
    }
    const fresh = () => message.lines.filter((l) => isAfter(message.attempt, l.seq, last));
    const continues = (lines) =>
      lines.length && message.attempt === last.attempt && lines[0].seq === last.seq + 1;
    let lines = fresh();
    if (!lines.length) return;
    if (!continues(lines)) {
      await fill({ attempt: message.attempt, seq: lines[0].seq - 1 });
      lines = fresh();
      if (!continues(lines)) return; // the fill already showed this batch
    }
    append(lines.map((l) => ({ attempt: message.attempt, ...l })));
    cursor = message.cursor;
  }

  function enqueue(task) {
    work = work.then(task).then(
      () => { state.textContent = ""; },
      (error) => {
        state.textContent = "catching up failed (" + error.message + "); retrying";
        settle(5000);
      },
    );
  }

  // One fetch from the cursor for however many batches arrive before it starts.
  function refill() {
    if (refillQueued) return;
    refillQueued = true;
    enqueue(() => {
      refillQueued = false;
      return fill(null);
    });
  }

  // Show another rank (or every one): the lines shown so far are of the old choice.
  function showRank(value) {
    enqueue(() => {
      rank = value === "" ? null : Number(value);
      pre.replaceChildren();
      last = { attempt: -1, seq: -1 };
      first = null;
      cursor = null;
      updateCount();
      return loadTail();
    });
  }

  function settle(delay) {
    clearTimeout(settleTimer);
    settleTimer = setTimeout(() => enqueue(() => fill(null)), delay);
  }

  async function loadEarlier() {
    // There is no backward cursor: scan from the start, keeping the PAGE lines before `first`.
    const before = [];
    let from = null;
    for (;;) {
      const page = await getPage(from === null ? { limit: PAGE } : { cursor: from, limit: PAGE });
      from = page.cursor;
      const older = page.lines.filter((l) => isAfter(first.attempt, first.seq, l));
      before.push(...older);
      if (before.length > PAGE) before.splice(0, before.length - PAGE);
      if (older.length < page.lines.length || page.lines.length < PAGE) break;
    }
    if (!before.length) return;
    const top = pre.scrollHeight - pre.scrollTop;
    pre.insertBefore(build(before, null), pre.firstChild);
    first = { attempt: before[0].attempt, seq: before[0].seq };
    earlier.hidden = before.length < PAGE;
    pre.scrollTop = pre.scrollHeight - top;
    updateCount();
  }

  function updateCount() {
    const total = pre.childElementCount;
    if (!query) {
      count.textContent = total + " lines loaded";
      return;
    }
    let shown = 0;
    for (const el of pre.children) if (!el.hidden) shown += 1;
    count.textContent = shown + " of " + total + " loaded lines match";
  }

  function applySearch() {
    query = search.value.trim().toLowerCase();
    for (const el of pre.children) {
      el.hidden = Boolean(query) && !el.textContent.toLowerCase().includes(query);
    }
    updateCount();
  }

  function scrollToEnd() {
    programmaticScroll = true;
    pre.scrollTop = pre.scrollHeight;
    requestAnimationFrame(() => { programmaticScroll = false; });
  }

  function setFollow(on) {
    follow = on;
    followButton.setAttribute("aria-pressed", String(on));
    followButton.textContent = on ? "Pause follow" : "Follow";
    if (on) scrollToEnd();
  }

  followButton.addEventListener("click", () => setFollow(!follow));
  pre.addEventListener("scroll", () => {
    if (programmaticScroll) return;
    const atEnd = pre.scrollHeight - pre.scrollTop - pre.clientHeight < 4;
    if (atEnd !== follow) setFollow(atEnd);
  });
  let searchTimer = null;
  search.addEventListener("input", () => {
    clearTimeout(searchTimer);
    searchTimer = setTimeout(applySearch, 150);
  });
  earlier.addEventListener("click", () => enqueue(loadEarlier));
  if (rankSelect) rankSelect.addEventListener("change", () => showRank(rankSelect.value));
  document.addEventListener("sf:tab", (event) => {
    if (event.detail === "logs" && follow) scrollToEnd();
  });

  enqueue(loadTail);
  const socket = window.StarforgeLive.socket(root.dataset.logsSocket);
  socket.on("job.lines", (message) => {
    enqueue(() => onBatch(message));
    settle(SETTLE_MS);
  });
  socket.on("job.status", () => settle(300));
  socket.onOpen(() => enqueue(() => fill(null)));
})();

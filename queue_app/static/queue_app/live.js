// Refresh the page's live region in place: fetch ?partial=1 every few seconds and swap
// it in. Paused while the tab is hidden; without this script the page is still whole.
(function () {
  "use strict";
  var region = document.getElementById("live");
  if (!region || !region.dataset.refresh || !window.fetch) return;
  var every = Number(region.dataset.refresh) * 1000;
  var note = document.getElementById("live-status");
  var timer = null;
  var busy = false;
  var swaps = 0;

  function partialUrl() {
    var url = new URL(window.location.href);
    url.searchParams.set("partial", "1");
    return url;
  }

  function say(text, failed) {
    if (!note) return;
    note.textContent = text;
    note.classList.toggle("failed", !!failed);
  }

  function tick() {
    if (busy || document.hidden) return;
    busy = true;
    fetch(partialUrl(), { credentials: "same-origin", headers: { "X-Requested-With": "fetch" } })
      .then(function (response) {
        // A redirect means the session ended (login page): say so rather than swap it in.
        if (!response.ok || response.redirected) throw new Error("HTTP " + response.status);
        return response.text();
      })
      .then(function (html) {
        region.innerHTML = html;
        swaps += 1;
        region.dataset.swaps = String(swaps);
        say("Updated " + new Date().toLocaleTimeString() + " · refreshes every " + every / 1000 + " s while visible");
      })
      .catch(function (err) {
        say("Refresh failed (" + err.message + "); retrying. Reload the page to log in again.", true);
      })
      .then(function () { busy = false; });
  }

  function start() {
    if (timer === null) timer = window.setInterval(tick, every);
  }

  function stop() {
    if (timer !== null) window.clearInterval(timer);
    timer = null;
  }

  document.addEventListener("visibilitychange", function () {
    if (document.hidden) {
      stop();
      say("Paused while this tab is hidden");
    } else {
      tick();
      start();
    }
  });
  start();
})();

// Refresh the page's live region in place: fetch ?partial=1 every few seconds and swap
// it in. Paused while the tab is hidden or by the footer's Pause button; held while
// keyboard focus is inside the region (a swap would throw it back to <body>); unchanged
// content is not swapped. Without this script the page is still whole.
(function () {
  "use strict";
  var region = document.getElementById("live");
  if (!region || !region.dataset.refresh || !window.fetch) return;
  var every = Number(region.dataset.refresh) * 1000;
  var note = document.getElementById("live-status");
  var timer = null;
  var busy = false;
  var swaps = 0;
  var last = null;
  var userPaused = false;
  var toggle = document.getElementById("live-toggle");

  function utc() {
    // The server's stamps are UTC; the footer says the same clock.
    return new Date().toISOString().slice(11, 19) + " UTC";
  }

  function focusInside() {
    var el = document.activeElement;
    return !!el && el !== document.body && region.contains(el);
  }

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
    if (busy || document.hidden || userPaused) return;
    if (focusInside()) {
      say("Held while focus is in the list; it updates when you move out of it");
      return;
    }
    busy = true;
    fetch(partialUrl(), { credentials: "same-origin", headers: { "X-Requested-With": "fetch" } })
      .then(function (response) {
        // A redirect means the session ended (login page): say so rather than swap it in.
        if (!response.ok || response.redirected) throw new Error("HTTP " + response.status);
        return response.text();
      })
      .then(function (html) {
        if (focusInside()) return;  // focus moved in while the request ran
        if (html !== last) {
          // Rows picked for a bulk action stay picked across the swap.
          var picked = {};
          region.querySelectorAll("input[name=ids]:checked").forEach(function (box) { picked[box.value] = true; });
          region.innerHTML = html;
          region.querySelectorAll("input[name=ids]").forEach(function (box) { if (picked[box.value]) box.checked = true; });
        }
        last = html;
        swaps += 1;
        region.dataset.swaps = String(swaps);
        say("Updated " + utc() + " · refreshes every " + every / 1000 + " s while visible");
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

  if (toggle) {
    toggle.hidden = false;
    toggle.addEventListener("click", function () {
      userPaused = !userPaused;
      toggle.textContent = userPaused ? "Resume refresh" : "Pause refresh";
      toggle.setAttribute("aria-pressed", userPaused ? "true" : "false");
      if (userPaused) {
        say("Paused; nothing changes on this page until you resume");
      } else {
        tick();
      }
    });
  }
  region.addEventListener("focusout", function () {
    window.setTimeout(function () { if (!focusInside()) tick(); }, 0);
  });

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

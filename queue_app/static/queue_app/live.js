// Refresh the page's live region in place: fetch ?partial=1 every few seconds and swap
// it in. Paused while the tab is hidden or by the footer's Pause button; held while
// keyboard focus is inside the region (a swap would throw it back to <body>) or the pointer
// is moving over its rows (they would shift under it); unchanged content is not swapped.
// Without this script the page is still whole.
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

  // One clock: the site's time zone (TIME_ZONE, on <body>), 24-hour, as the server's stamps.
  var zone = document.body.dataset.tz || "UTC";

  function clock() {
    try {
      return new Date().toLocaleTimeString("en-GB", { timeZone: zone, hour12: false }) + " " + zone;
    } catch (e) {  // a zone this browser does not know
      return new Date().toISOString().slice(11, 19) + " UTC";
    }
  }

  // A pointer moving over the list's rows is about to click one: a swap then would
  // shift the rows under it, so refreshes wait until it has been still (or away) a while.
  var POINTER_HOLD_MS = 2000;
  var rowPointerAt = 0;
  region.addEventListener("pointermove", function (event) {
    if (event.target.closest && event.target.closest("tbody")) rowPointerAt = Date.now();
  });

  function pointerOnRows() {
    return Date.now() - rowPointerAt < POINTER_HOLD_MS;
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
    if (pointerOnRows()) {
      say("Held while the pointer moves over the rows; it updates when the pointer rests or leaves");
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
        if (focusInside() || pointerOnRows()) return;  // focus or pointer came in meanwhile
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
        say("Updated " + clock() + " · refreshes every " + every / 1000 + " s while visible");
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

// Refresh the page's live region in place: fetch ?partial=1 every few seconds and morph
// the region into it with Idiomorph (vendor/idiomorph.min.js, loaded before this file).
// A morph changes only the nodes that differ and keeps the rest, matched by id (each
// list row has one): the focused link or checkbox stays the same element and keeps focus,
// scroll positions stay, a <details> the user opened or closed stays so, and rows picked
// for a bulk action stay picked. So there is no hold while focus is in the list.
// Paused while the tab is hidden or by the footer's Pause button; held while the pointer
// is moving over the rows (a new row at the top would still push them down under it);
// unchanged content is not morphed. Without this script the page is still whole.
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

  // A pointer moving over the list's rows is about to click one: a refresh then could
  // shift the rows under it, so refreshes wait until it has been still (or away) a while.
  var POINTER_HOLD_MS = 2000;
  var rowPointerAt = 0;
  region.addEventListener("pointermove", function (event) {
    if (event.target.closest && event.target.closest("tbody")) rowPointerAt = Date.now();
  });

  function pointerOnRows() {
    return Date.now() - rowPointerAt < POINTER_HOLD_MS;
  }

  // What the user set, not the server: the server never renders a pick, and renders
  // <details> closed (or open, for captured output) whatever the reader did with it.
  function keepUserState(attribute, element) {
    if (attribute === "checked" && element.name === "ids") return false;
    if (attribute === "open" && element.tagName === "DETAILS") return false;
    return true;
  }

  var morph = window.Idiomorph
    ? function (html) {
        window.Idiomorph.morph(region, html, {
          morphStyle: "innerHTML",
          callbacks: { beforeAttributeUpdated: keepUserState },
        });
      }
    : function (html) {  // the vendored file failed to load: replace, keeping the picks
        var picked = {};
        region.querySelectorAll("input[name=ids]:checked").forEach(function (box) { picked[box.value] = true; });
        region.innerHTML = html;
        region.querySelectorAll("input[name=ids]").forEach(function (box) { if (picked[box.value]) box.checked = true; });
      };

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
    if (pointerOnRows()) {
      say("Held while the pointer moves over the rows; it updates when the pointer rests or leaves");
      return;
    }
    busy = true;
    fetch(partialUrl(), { credentials: "same-origin", headers: { "X-Requested-With": "fetch" } })
      .then(function (response) {
        // A redirect means the session ended (login page): say so rather than show it.
        if (!response.ok || response.redirected) throw new Error("HTTP " + response.status);
        return response.text();
      })
      .then(function (html) {
        // Paused or hidden while it was in flight: nothing may change until resumed.
        if (userPaused || document.hidden) return;
        if (pointerOnRows()) return;  // the pointer came in meanwhile
        if (html !== last) morph(html);
        last = html;
        swaps += 1;
        region.dataset.swaps = String(swaps);
        say("Updated " + clock() + " · refreshes every " + every / 1000 + " s while visible");
      })
      .catch(function (err) {
        if (userPaused || document.hidden) return;
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

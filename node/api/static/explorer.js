// Tally explorer: live refresh and relative times. No dependencies, no inline script (CSP: script-src 'self').
// Live refresh re-fetches this page from the same origin, parses it with DOMParser (which runs no script) and
// swaps in the new <main data-live>; the server has already escaped every user-supplied string in it.
(function () {
  "use strict";
  function ago(ms) {
    var s = Math.max(0, (Date.now() - ms) / 1000);
    if (s < 60) return Math.round(s) + " s ago";
    if (s < 3600) return Math.round(s / 60) + " min ago";
    if (s < 86400) return Math.round(s / 3600) + " h ago";
    return Math.round(s / 86400) + " d ago";
  }
  function times(root) {
    root.querySelectorAll("time[data-ms]").forEach(function (t) {
      var ms = Number(t.getAttribute("data-ms"));
      if (ms > 0) t.textContent = ago(ms);
    });
  }
  var status = null, busy = false, failures = 0;
  function refresh() {
    if (busy || document.hidden) return;
    var live = document.querySelector("main[data-live]");
    if (!live) return;
    busy = true;
    fetch(window.location.href, {headers: {"Accept": "text/html"}, credentials: "omit", cache: "no-store"})
      .then(function (r) { if (!r.ok) throw new Error(String(r.status)); return r.text(); })
      .then(function (html) {
        var doc = new DOMParser().parseFromString(html, "text/html");
        var fresh = doc.querySelector("main[data-live]");
        if (fresh) {
          live.replaceWith(document.importNode(fresh, true));
          times(document);
        }
        failures = 0;
        if (status) { status.textContent = "live"; status.className = "live-status"; }
      })
      .catch(function () {
        failures += 1;
        if (status) { status.textContent = "offline"; status.className = "live-status off"; }
      })
      .finally(function () { busy = false; });
  }
  document.addEventListener("DOMContentLoaded", function () {
    status = document.getElementById("live-status");
    times(document);
    setInterval(function () { times(document); }, 1000);
    var every = Number(document.body.getAttribute("data-refresh") || "0");
    if (every > 0) setInterval(refresh, every * 1000);
    else if (status) status.textContent = "static";
  });
})();

// Expiry countdowns, and on the approvals list a quiet check every 5
// seconds that brings in new (and drops decided) requests without a
// reload — never while the approver is typing a comment.
(function () {
  function fmt(ms) {
    if (ms <= 0) return "expired";
    var s = Math.floor(ms / 1000), d = Math.floor(s / 86400), h = Math.floor(s / 3600) % 24, m = Math.floor(s / 60) % 60;
    if (d >= 2) return d + " d " + h + " h";
    if (s >= 3600) return Math.floor(s / 3600) + " h " + m + " min";
    if (s >= 60) return m + " min " + (s % 60) + " s";
    return s + " s";
  }
  function tick() {
    var els = document.querySelectorAll("time.countdown[data-expires]");
    for (var i = 0; i < els.length; i++) {
      els[i].textContent = fmt(Date.parse(els[i].getAttribute("data-expires")) - Date.now());
    }
  }
  tick();
  setInterval(tick, 1000);

  function ids(root) {
    var out = [], cards = root.querySelectorAll("[data-approval]");
    for (var i = 0; i < cards.length; i++) out.push(cards[i].getAttribute("data-approval"));
    return out;
  }
  function typing() {
    var a = document.activeElement;
    if (a && (a.tagName === "TEXTAREA" || a.tagName === "INPUT") && a.value) return true;
    var typed = document.querySelectorAll("textarea");
    for (var i = 0; i < typed.length; i++) if (typed[i].value) return true;
    return false;
  }
  var list = document.getElementById("pending-list");
  if (location.pathname !== "/ui/approvals" || !list || !window.fetch || !window.DOMParser) return;
  var busy = false;
  setInterval(function () {
    if (busy || typing()) return;
    busy = true;
    fetch("/ui/approvals", { credentials: "same-origin", headers: { "Accept": "text/html" } }).then(function (r) {
      if (r.redirected || r.status !== 200) { location.reload(); return null; } // the session ended: show the login
      return r.text();
    }).then(function (html) {
      if (!html || typing()) return;
      var doc = new DOMParser().parseFromString(html, "text/html");
      var fresh = doc.getElementById("pending-list"), count = doc.getElementById("pending-count");
      if (!fresh) return;
      var before = ids(list), after = ids(fresh);
      if (before.join(" ") === after.join(" ")) return;
      var added = after.filter(function (id) { return before.indexOf(id) < 0; }).length;
      list.replaceWith(document.importNode(fresh, true));
      list = document.getElementById("pending-list");
      var own = document.getElementById("pending-count");
      if (own && count) own.textContent = count.textContent;
      var live = document.getElementById("live");
      if (live) live.textContent = added === 1 ? "1 new request arrived." : added > 1 ? added + " new requests arrived." : "The list changed.";
      tick();
    }).catch(function () {}).then(function () { busy = false; });
  }, 5000);
})();

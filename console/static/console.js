// Expiry countdowns, and a quiet refresh of the approvals list so a new
// request shows up without a reload (not while the approver is typing).
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
  if (location.pathname === "/ui/approvals") {
    setInterval(function () {
      var a = document.activeElement;
      if (a && (a.tagName === "TEXTAREA" || a.tagName === "INPUT") && a.value) return;
      var typed = document.querySelectorAll("textarea");
      for (var i = 0; i < typed.length; i++) if (typed[i].value) return;
      location.reload();
    }, 15000);
  }
})();

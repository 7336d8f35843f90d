// medea dashboard: live updates of a rollout page (server-sent events) and copy buttons.
// Everything else works without JavaScript. No inline code: loaded from /assets/app.js.
"use strict";
document.addEventListener("DOMContentLoaded", function () {
  document.querySelectorAll("button[data-copy]").forEach(function (b) {
    if (!navigator.clipboard) return;
    b.hidden = false;
    b.addEventListener("click", function () {
      var el = document.getElementById(b.dataset.copy);
      navigator.clipboard.writeText(el.textContent).then(function () {
        b.textContent = "copied";
      });
    });
  });
  // A rehearsal running on the plan page: its reports replace the section as they are stored,
  // without a reload (the page is asked again every 2 s until no rehearsal runs).
  var rehearsing = document.getElementById("rehearsing");
  if (rehearsing && window.fetch && window.DOMParser) {
    var poll = function () {
      fetch(location.pathname, { credentials: "same-origin" })
        .then(function (r) { return r.text(); })
        .then(function (html) {
          var doc = new DOMParser().parseFromString(html, "text/html");
          var fresh = doc.getElementById("rehearsal-section");
          var cur = document.getElementById("rehearsal-section");
          if (fresh && cur) cur.replaceWith(document.importNode(fresh, true));
          if (doc.getElementById("rehearsing")) setTimeout(poll, 2000);
        })
        .catch(function () { setTimeout(poll, 5000); });
    };
    setTimeout(poll, 2000);
  }
  var live = document.getElementById("live");
  if (!live || !window.EventSource) return;
  var timeline = document.getElementById("timeline");
  var note = document.getElementById("live-note");
  // On a reconnect the browser sends Last-Event-ID (the last journal entry it got) and the
  // server replays what was missed.
  var src = new EventSource(live.dataset.events);
  src.addEventListener("grid", function (e) { live.innerHTML = e.data; });
  src.addEventListener("entry", function (e) {
    var seq = e.lastEventId;
    if (timeline.querySelector('li[data-seq="' + seq + '"]')) return;
    timeline.insertAdjacentHTML("beforeend", e.data);
    timeline.scrollTop = timeline.scrollHeight;
  });
  src.addEventListener("note", function (e) { note.textContent = e.data; });
  src.addEventListener("end", function () {
    src.close();
    note.textContent = "";
    var halt = document.querySelector("a.button.danger");
    if (halt) halt.remove();
  });
  src.addEventListener("error", function () {
    if (src.readyState === EventSource.CLOSED) {
      note.textContent = "Live updates stopped (logged out?). Reload the page.";
    } else {
      note.textContent = "Reconnecting…";
    }
  });
  src.addEventListener("open", function () { note.textContent = ""; });
});

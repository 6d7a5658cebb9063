// Reload a page that shows unfinished jobs every few seconds, but never while the operator is typing.
(function () {
  var seconds = Number(document.body.dataset.refresh || 0);
  if (!seconds) return;
  function tick() {
    var el = document.activeElement;
    if (el && /^(INPUT|SELECT|TEXTAREA)$/.test(el.tagName)) { setTimeout(tick, seconds * 1000); return; }
    location.reload();
  }
  setTimeout(tick, seconds * 1000);
})();

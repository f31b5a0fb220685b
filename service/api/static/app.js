// Preflight operators' pages: the copy button (no framework, no build step).
"use strict";
document.addEventListener("click", function (event) {
  var button = event.target.closest("button.copy");
  if (!button) return;
  var source = document.getElementById(button.getAttribute("data-copy"));
  var status = document.getElementById("copy-status");
  if (!source) return;
  var text = source.textContent;
  function done(message) { if (status) status.textContent = message; }
  if (navigator.clipboard && window.isSecureContext) {
    navigator.clipboard.writeText(text).then(function () { done("Copied."); },
                                             function () { fallback(); });
  } else {
    fallback();
  }
  function fallback() {
    var range = document.createRange();
    range.selectNodeContents(source);
    var selection = window.getSelection();
    selection.removeAllRanges();
    selection.addRange(range);
    var ok = false;
    try { ok = document.execCommand("copy"); } catch (e) { ok = false; }
    done(ok ? "Copied." : "Selected: press Ctrl+C to copy.");
  }
});

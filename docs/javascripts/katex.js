// Renders the maths pymdownx.arithmatex marks (class "arithmatex") with the vendored KaTeX,
// on the first load and on every page Material's instant navigation loads.
function renderMaths(root) {
  root.querySelectorAll(".arithmatex").forEach(function (element) {
    if (element.dataset.rendered) return;
    var text = element.textContent.trim();
    var display = text.startsWith("\\[");
    var tex = text.replace(/^\\[\[(]/, "").replace(/\\[\])]$/, "");
    katex.render(tex, element, { displayMode: display, throwOnError: false });
    element.dataset.rendered = "1";
  });
}
if (typeof document$ !== "undefined") {
  document$.subscribe(function () { renderMaths(document.body); });
} else {
  document.addEventListener("DOMContentLoaded", function () { renderMaths(document.body); });
}

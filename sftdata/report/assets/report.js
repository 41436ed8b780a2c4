// sftdata report: draws the plots (plotly.js, inlined above) and explains tokens on hover.
(function () {
  "use strict";
  window.sftdataStartMs = performance.now();  // plotly.js parsed and run
  var figures = JSON.parse(document.getElementById("sftdata-figures").textContent);
  var config = {displaylogo: false, responsive: true,
                modeBarButtonsToRemove: ["select2d", "lasso2d", "autoScale2d", "toggleSpikelines"]};
  var pending = [];
  document.querySelectorAll(".plot[data-figure]").forEach(function (div) {
    var fig = figures[div.dataset.figure];
    if (fig) { pending.push(Plotly.newPlot(div, fig.data, fig.layout, config)); }
  });
  Promise.all(pending).then(function () {
    document.body.dataset.ready = "1";  // every plot is drawn (the browser test and benchmark wait for this)
    window.sftdataReadyMs = performance.now();
  });

  // token boundaries on request
  var box = document.getElementById("bounds");
  if (box) { box.addEventListener("change", function () { document.body.classList.toggle("bounds", box.checked); }); }

  // one tooltip for every token: its id(s), its text with whitespace made visible, trained or not
  var tip = document.getElementById("tip");
  function visible(s) {
    return JSON.stringify(s).slice(1, -1).replace(/\\n/g, "\u21b5\\n").replace(/ /g, "\u00b7");
  }
  function position(k) {
    var host = k.closest(".tokens");
    if (!host._pos) {
      var p = 0;
      host.querySelectorAll(".k").forEach(function (e) { e._pos = p; p += e.dataset.i.split(" ").length; });
      host._pos = true;
    }
    return k._pos;
  }
  document.addEventListener("mouseover", function (ev) {
    // a token of a sample only: the legend's marker swatch is a .k too, with no ids
    var k = ev.target.closest ? ev.target.closest(".tokens .k[data-i]") : null;
    if (!k) { tip.hidden = true; return; }
    var run = k.parentElement, ids = k.dataset.i.split(" ");
    var lines = [(ids.length > 1 ? "tokens " : "token ") + "at " + position(k) + ": id " + ids.join(", "),
                 "text \"" + visible(k.textContent) + "\""];
    if (ids.length > 1) { lines.push("(one character split across " + ids.length + " tokens)"); }
    lines.push(run.classList.contains("t") ? "trained (mask 1): the model learns to write it"
               : run.classList.contains("i") ? "context the packer injected (mask 0)"
               : "not trained (mask 0): context only");
    tip.textContent = lines.join("\n");
    tip.hidden = false;
  });
  document.addEventListener("mousemove", function (ev) {
    if (tip.hidden) { return; }
    var x = Math.min(ev.clientX + 14, window.innerWidth - tip.offsetWidth - 8);
    var y = ev.clientY + 18 + tip.offsetHeight > window.innerHeight ? ev.clientY - tip.offsetHeight - 10 : ev.clientY + 18;
    tip.style.left = x + "px"; tip.style.top = y + "px";
  });
})();

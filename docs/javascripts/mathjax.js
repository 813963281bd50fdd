// MathJax 3 configuration for pymdownx.arithmatex (generic mode): formulas are wrapped in
// \( \) and \[ \] inside elements of class "arithmatex". MathJax itself is loaded from a CDN
// when a page is viewed; building the site needs no network.
window.MathJax = {
  tex: {
    inlineMath: [["\\(", "\\)"]],
    displayMath: [["\\[", "\\]"]],
    processEscapes: true,
    processEnvironments: true
  },
  options: {
    ignoreHtmlClass: ".*|",
    processHtmlClass: "arithmatex"
  }
};

document$.subscribe(() => {
  MathJax.startup.output.clearCache();
  MathJax.typesetClear();
  MathJax.texReset();
  MathJax.typesetPromise();
});

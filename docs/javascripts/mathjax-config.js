// MathJax 2 (bundled by the jupyter-server-mathjax package and copied into the site by
// mkdocs_hooks.py, so the notebooks' $…$ maths renders without a network connection).
// That bundle ships the combined configuration below (TeX input, HTML-CSS output).
window.MathJax = {
  config: ["TeX-AMS-MML_HTMLorMML-full.js"],
  tex2jax: { inlineMath: [["$", "$"], ["\\(", "\\)"]], displayMath: [["$$", "$$"], ["\\[", "\\]"]],
             processEscapes: true },
  "HTML-CSS": { availableFonts: [], preferredFont: null, webFont: "STIX-Web" },  // the bundled web font
  messageStyle: "none",
};

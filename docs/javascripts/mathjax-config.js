// MathJax 2 (bundled by the jupyter-server-mathjax package and copied into the site by
// mkdocs_hooks.py, so the notebooks' $…$ maths renders without a network connection).
window.MathJax = {
  jax: ["input/TeX", "output/CommonHTML"],
  extensions: ["tex2jax.js"],
  TeX: { extensions: ["AMSmath.js", "AMSsymbols.js", "noErrors.js", "noUndefined.js"] },
  tex2jax: { inlineMath: [["$", "$"], ["\\(", "\\)"]], displayMath: [["$$", "$$"], ["\\[", "\\]"]],
             processEscapes: true },
  messageStyle: "none",
};

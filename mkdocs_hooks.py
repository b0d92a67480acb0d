"""MkDocs hooks: copy the MathJax that jupyter-server-mathjax bundles into the built site."""

import pathlib
import shutil


def on_post_build(config, **kwargs):
    import jupyter_server_mathjax

    source = pathlib.Path(jupyter_server_mathjax.__file__).parent / "static"
    target = pathlib.Path(config["site_dir"]) / "assets" / "mathjax"
    shutil.copytree(source, target, dirs_exist_ok=True)

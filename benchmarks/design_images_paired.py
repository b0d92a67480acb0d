"""Paired per-image comparison of design runs from `design_images.py` (same images, same seeds).

Every run of `design_images.py` draws image i's starting rows, noise and random-design keys from i alone,
so runs of different methods or settings on the same images are paired. This prints, for each method of
each listed run, the ℓ2 error at every N (mean ± s.e. over images) and its paired difference from a
baseline (default MAP Rand of the first run): mean ± s.e. and on how many images the method is lower.

    python benchmarks/design_images_paired.py 16img_16px 16px_lvbexact 16px_lvb20_it300 16px_lvb256 --tag lvb_16px
"""

from __future__ import annotations

import argparse
import json

import numpy as np

from _common import RESULTS, Tee, mean_se


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("tags", nargs="+", help="tags of design_images runs (results/design_images_<tag>.json)")
    parser.add_argument("--baseline", default="MAP Rand", help="method of the first run to compare against")
    parser.add_argument("--tag", default="", help="save the table as results/design_images_paired_<tag>.txt")
    args = parser.parse_args()
    runs = {t: json.loads((RESULTS / f"design_images_{t}.json").read_text()) for t in args.tags}
    first = runs[args.tags[0]]
    images = first["images"]
    base = np.array(first["errors"][args.baseline])
    N = first["curves"][args.baseline]["N"]
    log = Tee()
    log(f"# paired over {len(images)} images ({', '.join(images)}); baseline {args.baseline} of run {args.tags[0]}; "
        f"N = {N}")
    for tag, run in runs.items():
        if run["images"] != images:
            raise SystemExit(f"run {tag} has other images ({run['images']}): not paired")
        for label, errs in run["errors"].items():
            errs = np.array(errs)
            a = run["args"]
            setting = f"lanczos {a.get('lanczos')}, <= {a.get('lvb_iter')} loops" if label == "LVB" else ""
            err = "  ".join(f"{m:.2f} ± {s:.2f}" for m, s in (mean_se(errs[:, k]) for k in range(errs.shape[1])))
            log(f"{tag:18s} {label:9s} {setting:26s} error {err}")
            if label == args.baseline and tag == args.tags[0]:
                continue
            d = base[:, -1] - errs[:, -1]
            m, s = mean_se(d)
            log(f"{'':18s} {'':9s} {'':26s} {args.baseline} − {label} at N={N[-1]}: {m:+.2f} ± {s:.2f}, lower on "
                f"{int((d > 0).sum())}/{len(d)} images")
    if args.tag:
        log.save(f"design_images_paired_{args.tag}")


if __name__ == "__main__":
    main()

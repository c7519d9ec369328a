"""Write the calibration rows of the linear layers (`part=linear`) from vidur's table.

`profiles/measurements/vidur_linear_layers.csv` holds vidur's per-step times of the linear layers
and their glue by query tokens. `sovereignspec calibrate` reads them as rows of their own kind: the
parameters those layers hold (the model's less its embedding and LM head, from each model's
config.json), their layer count and TP degree. Per GPU, the rows of the model the GPU is
calibrated with at TP 1 are fitted; the others (other models, TP 4 and 8) are held out to test
the fit on data it never saw.

    python hack/linear_rows.py   # rewrites profiles/measurements/*_vidur_linear_*.csv
"""

from __future__ import annotations

import csv
from pathlib import Path

MEASUREMENTS = Path(__file__).resolve().parents[1] / "profiles" / "measurements"

# config.json: parameters less 2 x vocab x hidden (embedding and untied LM head), and layers.
LAYERS = {
    "Llama-2-7b-hf": (6.738e9 - 2 * 32000 * 4096, 32),
    "Meta-Llama-3-8B": (8.030e9 - 2 * 128256 * 4096, 32),
    "Llama-2-70b-hf": (68.977e9 - 2 * 32000 * 8192, 80),
    "Meta-Llama-3-70B": (70.554e9 - 2 * 128256 * 8192, 80),
}
# Per profile: the vidur SKU and the model whose TP-1 rows are fitted.
PROFILES = {"h100-sxm": ("h100", "Llama-2-7b-hf"), "a100-80g-sxm": ("a100", "Meta-Llama-3-8B")}
HEADER = [
    *("part", "batch", "context", "query_tokens", "step_ms"),
    *("params_billion", "layers", "tp", "source_model"),
]


def main() -> None:
    with (MEASUREMENTS / "vidur_linear_layers.csv").open() as f:
        rows = list(csv.reader(line for line in f if not line.startswith("#")))
    tokens = [h[1:] for h in rows[0][3:]]
    for profile, (sku, fitted) in PROFILES.items():
        for role in ("fit", "held_out"):
            out = MEASUREMENTS / f"{profile}_vidur_linear_{role}.csv"
            which = "the calibration's own model at TP 1" if role == "fit" else "the others: held out"
            with out.open("w", newline="") as f:
                f.write(
                    "# source: microsoft/vidur@7d47513 (MIT) linear layers and glue by query tokens "
                    f"(vidur_linear_layers.csv beside this file), {sku.upper()}; {which}\n"
                    "# rows: part=linear; batch = query tokens in the step (context and query_tokens "
                    "unused, 1); params_billion, layers: the linear layers' (config.json less embedding "
                    "and LM head); written by hack/linear_rows.py\n"
                )
                w = csv.writer(f, lineterminator="\n")
                w.writerow(HEADER)
                for r in rows[1:]:
                    if r[0] != sku or ((r[1] == fitted and r[2] == "1") != (role == "fit")):
                        continue
                    params, layers = LAYERS[r[1]]
                    for n, ms in zip(tokens, r[3:], strict=True):
                        w.writerow(["linear", n, 1, 1, ms, f"{params / 1e9:.4f}", layers, r[2], r[1]])


if __name__ == "__main__":
    main()

"""Give the GPUs not measured here the H100 calibration's coefficients (`make calibrate-profiles`).

H200, L40S and RTX-4090 keep their datasheet figures and borrow the fitted efficiencies, overheads,
κ and p, with the calibration's record (its intervals included) and `scaled_from: H100-SXM`; not
its ridges (those are the H100's) and `measured: false`.
"""

from __future__ import annotations

from pathlib import Path

import yaml

GPUS = Path(__file__).resolve().parents[1] / "profiles" / "gpus"
REFERENCE = "h100-sxm.yaml"
SCALED = ("h200.yaml", "l40s.yaml", "rtx-4090.yaml")
FITTED = ("compute_efficiency", "bandwidth_efficiency", "step_overhead_ms", "serial_fraction", "overlap")


def main() -> None:
    reference = yaml.safe_load((GPUS / REFERENCE).read_text())
    record = {
        k: v for k, v in reference["calibration"].items() if k not in ("ridge_seqs", "ridge_identified")
    }
    for name in SCALED:
        path = GPUS / name
        text = path.read_text()
        comments = "".join(line + "\n" for line in text.splitlines() if line.startswith("#"))
        doc = yaml.safe_load(text)
        doc.update({k: reference[k] for k in FITTED})
        doc["measured"] = False
        doc["calibration"] = {**record, "scaled_from": reference["name"]}
        path.write_text(comments + yaml.safe_dump(doc, sort_keys=False, allow_unicode=True, width=120))


if __name__ == "__main__":
    main()

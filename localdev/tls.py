"""A private CA with a server certificate for 127.0.0.1 and a client certificate, made with the
openssl command line (as hack/cluster-up.sh makes the control plane's): for a Prometheus behind TLS
in the tests."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Pki:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)


def make_pki(folder: Path, name: str = "ca") -> Pki:
    """A CA named `name` under `folder`, a server certificate for 127.0.0.1/localhost and a client
    certificate (CN sovereignspec), both signed by it."""
    folder.mkdir(parents=True, exist_ok=True)
    ca, ca_key = folder / f"{name}.crt", folder / f"{name}.key"
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", f"/CN={name}",
             "-keyout", str(ca_key), "-out", str(ca))  # fmt: skip
    out = {}
    for who, subject, ext in (
        ("server", "/CN=127.0.0.1", "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth"),
        ("client", "/CN=sovereignspec", "extendedKeyUsage=clientAuth"),
    ):
        key, csr, cert = (
            folder / f"{name}-{who}.key",
            folder / f"{name}-{who}.csr",
            folder / f"{name}-{who}.crt",
        )
        extfile = folder / f"{name}-{who}.ext"
        extfile.write_text(ext + "\n")
        _openssl(
            "req", "-newkey", "rsa:2048", "-nodes", "-subj", subject, "-keyout", str(key), "-out", str(csr)
        )
        _openssl("x509", "-req", "-in", str(csr), "-CA", str(ca), "-CAkey", str(ca_key), "-CAcreateserial",
                 "-days", "2", "-extfile", str(extfile), "-out", str(cert))  # fmt: skip
        out[who] = (cert, key)
    return Pki(ca, out["server"][0], out["server"][1], out["client"][0], out["client"][1])

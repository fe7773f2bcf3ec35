"""Throwaway certificate authorities and certificates (trustme), written as PEM files."""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from pathlib import Path

import trustme


@dataclass(frozen=True)
class Pair:
    """A certificate and its key, as files."""

    cert: str
    key: str


class Pki:
    """A CA (``ca``) in ``directory``; ``issue`` writes certificates it signed."""

    def __init__(self, directory: Path, name: str = "ca") -> None:
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        self._ca = trustme.CA(organization_name=f"pyspark-jetstream tests {name}")
        self.ca = str(directory / f"{name}.pem")
        self._ca.cert_pem.write_to_path(self.ca)
        self.name = name

    def issue(self, identity: str, *more: str, expired: bool = False) -> Pair:
        """A certificate for ``identity`` (its first subject alternative name) and ``more``."""
        now = datetime.datetime.now(datetime.UTC)
        window = (
            {"not_before": now - datetime.timedelta(days=3), "not_after": now - datetime.timedelta(days=1)}
            if expired
            else {}
        )
        cert = self._ca.issue_cert(identity, *more, common_name=identity, **window)
        stem = self.directory / f"{self.name}-{identity}{'-expired' if expired else ''}"
        pair = Pair(f"{stem}.crt", f"{stem}.key")
        cert.cert_chain_pems[0].write_to_path(pair.cert)
        cert.private_key_pem.write_to_path(pair.key)
        return pair

"""Every shipped protocol keeps its hash, and every committed result still names the hash of its protocol file.

A protocol's hash keys every record made under it (MLflow tags, Optuna
studies, results tables); a change to how the hash is computed, or an edit
of a shipped file that changes what it means, would leave the committed
results and everyone's stores under a version no file produces any more.
Comments are not part of the hash (it covers the validated document), so
the rationale moved out of the files' headers (docs/protocols/) changes
nothing here. The pins are (hash, shared_hash): the whole protocol's, and
that of the settings every cell shares, which keys the floor's records.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.protocol import load_protocol

REPO = Path(__file__).resolve().parents[2]

SHIPPED = {
    "fashion-mnist-2d": (
        "4108208131a89cef54960f72b99e5ec0574fe97912ad4e01dbe847aeafbaa906",
        "84f0c96b985a845d74b2ddb7830fca356df363fb0c0211106cd5f5073e0464fb",
    ),
    "inshop": (
        "9c79d93e2297c4837423cdc234d9d99aec5f17e84b25df633b3a3eb001dfa8c9",
        "57ccfdb0b52d88eb7b6a938e648821b5d3520c36e958a3ef89e121764e71cacf",
    ),
    "market1501-batch-hard": (
        "d817020c75b71d32330e61f0f5c7fedead869a01f9515abfbd7c76df234658f6",
        "033ea8142d39d41019b87722ac3379e562321d59c2fe076c7a2a6175131e1b85",
    ),
    "omniglot-demo": (
        "7d56fd8712d91dd19c8d0f8b687be7f0b501e273568bcf8d295cc73380eb22b8",
        "236b928bfe40764d7950ad93f2990bd39f7e51dc00a93de67d46bdb61afd0a44",
    ),
    "omniglot-full": (
        "f30213de2382da125663c4465f4f1df84a29b10c1a1ba007816376e54508b349",
        "167d5c5533696144e0b88b63b1fc83cadbf7137361ae9d69b867b5812c2af544",
    ),
    "omniglot-mlrc": (
        "6735f0f4a45db77a6994adc7ffc5c406c08a0f2565eab3c005c7bf1dae106f28",
        "72deb0ff8b0a795239f654592276fe03b244e8b78e59e1ec482a461835051c97",
    ),
    "omniglot-quick": (
        "155ed2e8f1bcd652f355f3c4f765430be47a79c8ced72d67d6fe4306da25288e",
        "9c6fa249593179c7734e3580aa41f0293adf1d07bc33a32ebbd981f29ea25e6c",
    ),
    "omniglot-smoke": (
        "73249472d7ea3b31b8c54e1d693eefa2c4cc7c6587afb4d1b4ba58760d938e38",
        "998aea3a4a2e82fee12ead57dc1e5263acc91253738d6a72ed37f8ace9c709dc",
    ),
    "omniglot-standard": (
        "6b03d10fd0cab8467cb383a2fb87f784f8565fc8276596d6ccc9b69818222e3f",
        "a846eb51ef8c0cfbae366d416ba61ba3ba761183ac060315bd3a3a76835a5fff",
    ),
    "reality-check-cars": (
        "9063118887f4aa5592dcfb1fc231223b12c30c9c7ddabb1d81a22ac732fde0b3",
        "a547d51831ac4e1fe21a6eb28dbebb23f3712d6007576814ebd0df862fb57dff",
    ),
    "reality-check-cub": (
        "7138d8db6ba491a786858f76d26b82fd043602936eafa54cdc1d0f0b47f7e378",
        "5b1826b5c762020d6acd59e22786f080839a38dd1121f2098eb360fad9b35baa",
    ),
    "reality-check-sop": (
        "f2adf53a6632ec6e9de07e9feab8bd46aff4d77dcd8e3af659b893ce595a4a89",
        "b3d1a629de479947456a916ec0015b290036bcde8cb7ebc4f7fb24b504e70989",
    ),
}


def test_every_shipped_protocol_is_pinned() -> None:
    assert set(SHIPPED) == {p.stem for p in (REPO / "protocols").glob("*.yaml")}


@pytest.mark.parametrize("name", sorted(SHIPPED))
def test_shipped_protocol_keeps_its_hash(name: str) -> None:
    protocol = load_protocol(REPO / "protocols" / f"{name}.yaml")
    assert (protocol.hash, protocol.shared_hash) == SHIPPED[name]


RESULTS = sorted(p for p in (REPO / "results").glob("*/manifest.json") if "@" not in p.parent.name)


def test_results_are_found() -> None:
    assert len(RESULTS) >= 4


@pytest.mark.parametrize("manifest", RESULTS, ids=lambda p: p.parent.name)
def test_committed_results_are_of_their_protocol_file(manifest: Path) -> None:
    """A results folder holds the current version of its protocol; an older version's folder is moved aside
    as `<name>@<hash12>` (those keep the hash they were made under, which no shipped file gives)."""
    recorded = json.loads(manifest.read_text())
    name = Path(recorded["protocol_file"]).stem
    assert recorded["protocol_hash"] == SHIPPED[name][0]
    if recorded.get("shared_hash"):
        assert recorded["shared_hash"] == SHIPPED[name][1]


@pytest.mark.parametrize("name", sorted(SHIPPED))
def test_protocol_header_points_to_its_notes(name: str) -> None:
    """Each file opens with what it is and points to its page of rationale, which exists."""
    header = [ln for ln in (REPO / "protocols" / f"{name}.yaml").read_text().splitlines() if ln.startswith("#")]
    assert any(f"docs/protocols/{name}.md" in ln for ln in header[:12]), name
    assert (REPO / "docs" / "protocols" / f"{name}.md").is_file()

from __future__ import annotations

import re

from quickdraft.machine import ISA_FLAGS, cpu_description, cpu_fingerprint


def test_cpu_description_names_the_processor_and_its_relevant_instruction_sets() -> None:
    description = cpu_description()
    assert description["name"] and description["arch"]
    assert set(description["isa"]) <= set(ISA_FLAGS)
    description["isa"].append("not-a-flag")  # a caller changing its copy changes nothing for the next
    assert "not-a-flag" not in cpu_description()["isa"]


def test_cpu_fingerprint_is_short_and_stable() -> None:
    assert re.fullmatch(r"[0-9a-f]{12}", cpu_fingerprint())
    assert cpu_fingerprint() == cpu_fingerprint()

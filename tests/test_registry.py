"""Name registries: entries registered or named by their module, listed without importing it."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from quickdraft.errors import UnknownNameError
from quickdraft.registry import Registry


def test_lazy_entries_are_listed_and_imported_when_looked_up() -> None:
    registry: Registry[object] = Registry("thing", lazy={"dumps": "json:dumps"})
    registry.register("loads")(json.loads)
    assert registry.names() == ["dumps", "loads"]
    assert registry.get("dumps") is json.dumps and registry.get("loads") is json.loads
    with pytest.raises(UnknownNameError, match="unknown thing 'dump'; choose one of: dumps, loads"):
        registry.get("dump")
    with pytest.raises(ValueError, match="registered twice"):
        registry.register("dumps")(json.dumps)


def test_the_drafter_and_runtime_names_import_no_drafter_and_no_runtime() -> None:
    """Listing DRAFTERS and RUNTIMES imports neither torch nor their modules; looking one up imports it."""
    code = (
        "import sys\nfrom quickdraft.drafters import DRAFTERS\nfrom quickdraft.runtime import RUNTIMES\n"
        "names = DRAFTERS.names() + RUNTIMES.names()\n"
        "print('torch' in sys.modules, 'quickdraft.drafters.suffix' in sys.modules, 'draft-model' in names)\n"
        "print(DRAFTERS.get('suffix').__name__, 'quickdraft.drafters.suffix' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert done.stdout.splitlines() == ["False False True", "SuffixDrafter True"]


def test_an_unknown_name_names_the_setting_it_was_given_for() -> None:
    """So the CLI and the server can point at the flag or field (``setting`` was None)."""
    from quickdraft.drafters import DRAFTERS
    from quickdraft.policies.base import POLICIES
    from quickdraft.runtime import RUNTIMES

    for registry, setting in ((DRAFTERS, "drafter"), (POLICIES, "policy"), (RUNTIMES, "runtime")):
        with pytest.raises(UnknownNameError) as raised:
            registry.get("bogus")
        assert raised.value.setting == setting

